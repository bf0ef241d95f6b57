#include "codec/generate.h"

#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "core/dtype.h"

#define MAX_DEPTH 64

enum { J_BAD, J_OBJECT, J_ARRAY, J_STRING, J_NUMBER, J_BOOL, J_NULL };

static const char *kind_name(int k)
{
    static const char *names[] = {"invalid JSON", "an object", "an array", "a string", "a number", "a bool", "null"};
    return names[k];
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* The end of the JSON value at p (whitespace skipped before it), or NULL when malformed;
 * *kind says what it is. Checks structure only: the V2 codec reads the values themselves. */
static const char *scan(const char *p, const char *end, int depth, int *kind)
{
    p = skip_ws(p, end);
    *kind = J_BAD;
    if (p >= end || depth > MAX_DEPTH)
        return NULL;
    char c = *p;
    if (c == '"') {
        for (p++; p < end && *p != '"'; p++)
            if (*p == '\\' && ++p >= end)
                return NULL;
        if (p >= end)
            return NULL;
        *kind = J_STRING;
        return p + 1;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        p = skip_ws(p + 1, end);
        if (p < end && *p == close) {
            *kind = c == '{' ? J_OBJECT : J_ARRAY;
            return p + 1;
        }
        for (;;) {
            int k;
            if (c == '{') {
                if ((p = scan(p, end, depth + 1, &k)) == NULL || k != J_STRING)
                    return NULL;
                p = skip_ws(p, end);
                if (p >= end || *p++ != ':')
                    return NULL;
            }
            if ((p = scan(p, end, depth + 1, &k)) == NULL)
                return NULL;
            p = skip_ws(p, end);
            if (p < end && *p == ',') {
                p++;
                continue;
            }
            if (p < end && *p == close) {
                *kind = c == '{' ? J_OBJECT : J_ARRAY;
                return p + 1;
            }
            return NULL;
        }
    }
    const char *s = p;
    while (p < end && (strchr("+-.eE", *p) || (*p >= '0' && *p <= '9')))
        p++;
    if (p > s) {
        *kind = J_NUMBER;
        return p;
    }
    static const struct {
        const char *w;
        int k;
    } lits[] = {{"true", J_BOOL}, {"false", J_BOOL}, {"null", J_NULL}};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(lits[i].w);
        if ((size_t)(end - p) >= n && memcmp(p, lits[i].w, n) == 0) {
            *kind = lits[i].k;
            return p + n;
        }
    }
    return NULL;
}

/* Elements of a flat array [p, e), or -1 when one of them is itself an array or object. */
static int64_t flat_count(const char *p, const char *e)
{
    int64_t n = 0;
    p = skip_ws(p + 1, e);
    if (*p == ']')
        return 0;
    for (;;) {
        int k;
        p = scan(p, e, 1, &k);
        if (k == J_ARRAY || k == J_OBJECT)
            return -1;
        n++;
        p = skip_ws(p, e);
        if (*p == ']')
            return n;
        p++; /* ',' */
    }
}

/* ---- requests ------------------------------------------------------------------------------- */

typedef struct gen_s {
    const oi_io_spec_t *inputs;
    uint32_t n_inputs;
    oi_sbuf_t in;     /* the "inputs" array's members */
    oi_sbuf_t params; /* the "parameters" object's members */
    oi_sbuf_t id;
} gen_t;

static const oi_io_spec_t *find_input(const gen_t *g, const char *k, size_t n)
{
    if (memchr(k, '\\', n) != NULL)
        return NULL; /* an escaped name names no declared input */
    for (uint32_t i = 0; i < g->n_inputs; i++)
        if (strlen(g->inputs[i].name) == n && memcmp(g->inputs[i].name, k, n) == 0)
            return &g->inputs[i];
    return NULL;
}

static oi_status_t *oom(void)
{
    return oi_status_new(OI_INTERNAL, "out of memory");
}

/* One input from its value: the shape spread over the declaration as Triton spreads it. */
static oi_status_t *add_input(gen_t *g, const oi_io_spec_t *spec, const char *v, const char *ve, int kind)
{
    int64_t count = 1;
    if (kind == J_ARRAY && (count = flat_count(v, ve)) < 0)
        return oi_status_new(OI_BAD_REQUEST,
                             "input '%s': expected a value or a flat array of values, got a nested array", spec->name);
    if (kind == J_OBJECT || kind == J_NULL)
        return oi_status_new(OI_BAD_REQUEST, "input '%s': expected a value or a flat array of values, got %s",
                             spec->name, kind_name(kind));
    int64_t shape[OI_MAX_DIMS];
    int ndim = spec->ndim < 0 ? 1 : spec->ndim;
    int64_t left = count;
    for (int i = ndim - 1; i >= 0; i--) {
        shape[i] = spec->ndim < 0 ? -1 : spec->dims[i];
        if (shape[i] != -1) {
            if (shape[i] == 0 ? left != 0 : left % shape[i] != 0)
                return oi_status_new(OI_BAD_REQUEST,
                                     "The schema can not convert input '%s' to tensor with proper shape", spec->name);
            left = shape[i] == 0 ? 0 : left / shape[i];
        }
    }
    for (int i = ndim - 1; i >= 0; i--)
        if (shape[i] == -1) {
            shape[i] = left;
            left = 1;
        }
    if (left != 1 && !(count == 0 && left == 0))
        return oi_status_new(OI_BAD_REQUEST, "The schema can not convert input '%s' to tensor with proper shape",
                             spec->name);
    oi_sbuf_t *o = &g->in;
    int bad = (o->len > 0 && oi_sbuf_append(o, ",", 1)) || oi_sbuf_append(o, "{\"name\":", 8) ||
              oi_json_write_string(o, spec->name, strlen(spec->name)) ||
              oi_sbuf_printf(o, ",\"datatype\":\"%s\",\"shape\":[", oi_dtype_name(spec->dtype));
    for (int i = 0; !bad && i < ndim; i++)
        bad = oi_sbuf_printf(o, i ? ",%lld" : "%lld", (long long)shape[i]);
    bad = bad || oi_sbuf_append(o, "],\"data\":", 9) || (kind != J_ARRAY && oi_sbuf_append(o, "[", 1)) ||
          oi_sbuf_append(o, v, (size_t)(ve - v)) || (kind != J_ARRAY && oi_sbuf_append(o, "]", 1)) ||
          oi_sbuf_append(o, "}", 1);
    return bad ? oom() : NULL;
}

static oi_status_t *map_object(gen_t *g, const char *p, const char *end, int top);

/* One member: an input, the id, the nested parameters, or a request parameter. */
static oi_status_t *map_member(gen_t *g, const char *k, size_t kn, const char *v, const char *ve, int kind, int top)
{
    const oi_io_spec_t *spec = find_input(g, k, kn);
    if (top && kn == 10 && memcmp(k, "parameters", 10) == 0) {
        if (spec != NULL)
            return oi_status_new(OI_BAD_REQUEST,
                                 "Keyword 'parameters' for nested schema also given as input tensor name");
        if (kind != J_OBJECT)
            return oi_status_new(OI_BAD_REQUEST, "Expected JSON object for keyword: 'parameters', got %s",
                                 kind_name(kind));
        oi_status_t *st = map_object(g, v, ve, 0);
        if (st != NULL && st->code == OI_BAD_REQUEST) {
            oi_status_t *wrapped = oi_status_new(st->code, "Converting keyword: 'parameters': %s", st->message);
            oi_status_free(st);
            return wrapped;
        }
        return st;
    }
    if (spec != NULL)
        return add_input(g, spec, v, ve, kind);
    if (top && kn == 2 && memcmp(k, "id", 2) == 0) {
        g->id.len = 0;
        return oi_sbuf_append(&g->id, v, (size_t)(ve - v)) ? oom() : NULL;
    }
    if (kind != J_STRING && kind != J_NUMBER && kind != J_BOOL)
        return oi_status_new(OI_BAD_REQUEST,
                             "parameter '%.*s' has invalid type. It should be either 'int', 'bool', or 'string'.",
                             (int)(kn > 256 ? 256 : kn), k);
    oi_sbuf_t *o = &g->params;
    int bad = (o->len > 0 && oi_sbuf_append(o, ",", 1)) || oi_sbuf_append(o, "\"", 1) || oi_sbuf_append(o, k, kn) ||
              oi_sbuf_append(o, "\":", 2) || oi_sbuf_append(o, v, (size_t)(ve - v));
    return bad ? oom() : NULL;
}

/* The members of the object [p, end) (already scanned as well-formed). */
static oi_status_t *map_object(gen_t *g, const char *p, const char *end, int top)
{
    p = skip_ws(p + 1, end);
    while (p < end && *p != '}') {
        int kind;
        const char *ke = scan(p, end, 1, &kind);
        const char *k = p + 1;
        size_t kn = (size_t)(ke - 1 - k);
        p = skip_ws(ke, end) + 1; /* ':' */
        const char *v = skip_ws(p, end);
        const char *ve = scan(v, end, 1, &kind);
        oi_status_t *st = map_member(g, k, kn, v, ve, kind, top);
        if (st != NULL)
            return st;
        p = skip_ws(ve, end);
        if (p < end && *p == ',')
            p = skip_ws(p + 1, end);
    }
    return NULL;
}

oi_status_t *oi_generate_request(const char *json, size_t len, const oi_io_spec_t *inputs, uint32_t n_inputs,
                                 oi_sbuf_t *out)
{
    const char *end = json + len, *p = skip_ws(json, end);
    if (p == end) {
        json = p = "{}";
        end = p + 2;
    }
    int kind;
    const char *e = scan(p, end, 0, &kind);
    if (e == NULL || skip_ws(e, end) != end)
        return oi_status_new(OI_BAD_REQUEST, "failed to parse the generate request: malformed JSON");
    if (kind != J_OBJECT)
        return oi_status_new(OI_BAD_REQUEST, "the generate request must be a JSON object, got %s", kind_name(kind));
    gen_t g = {inputs, n_inputs, {0}, {0}, {0}};
    oi_status_t *st = map_object(&g, p, e, 1);
    if (st == NULL) {
        int bad = oi_sbuf_append(out, "{", 1);
        if (!bad && g.id.len > 0)
            bad = oi_sbuf_append(out, "\"id\":", 5) || oi_sbuf_append(out, g.id.data, g.id.len) ||
                  oi_sbuf_append(out, ",", 1);
        if (!bad && g.params.len > 0)
            bad = oi_sbuf_append(out, "\"parameters\":{", 14) || oi_sbuf_append(out, g.params.data, g.params.len) ||
                  oi_sbuf_append(out, "},", 2);
        bad = bad || oi_sbuf_append(out, "\"inputs\":[", 10) ||
              (g.in.len && oi_sbuf_append(out, g.in.data, g.in.len)) || oi_sbuf_append(out, "]}", 2);
        if (bad)
            st = oom();
    }
    oi_sbuf_free(&g.in);
    oi_sbuf_free(&g.params);
    oi_sbuf_free(&g.id);
    return st;
}

/* ---- responses ------------------------------------------------------------------------------ */

typedef struct member_s {
    const char *k; /* the key's text, without quotes */
    size_t kn;
    const char *v; /* its value's JSON text */
    size_t vn;
} member_t;

typedef struct members_s {
    member_t *m;
    size_t n, cap;
} members_t;

static int push(members_t *ms, const char *k, size_t kn, const char *v, size_t vn)
{
    if (ms->n == ms->cap) {
        size_t cap = ms->cap ? ms->cap * 2 : 16;
        member_t *p = realloc(ms->m, cap * sizeof(*p));
        if (p == NULL)
            return -1;
        ms->m = p;
        ms->cap = cap;
    }
    ms->m[ms->n++] = (member_t){k, kn, v, vn};
    return 0;
}

static int by_key(const void *a, const void *b)
{
    const member_t *x = a, *y = b;
    int c = memcmp(x->k, y->k, x->kn < y->kn ? x->kn : y->kn);
    return c ? c : (x->kn > y->kn) - (x->kn < y->kn);
}

/* Calls fn for each member of the object at p (well-formed). */
typedef int (*member_fn)(void *ctx, const char *k, size_t kn, const char *v, const char *ve, int kind);

static int each_member(const char *p, const char *end, member_fn fn, void *ctx)
{
    p = skip_ws(p + 1, end);
    while (p < end && *p != '}') {
        int kind;
        const char *ke = scan(p, end, 1, &kind);
        const char *v = skip_ws(skip_ws(ke, end) + 1, end);
        const char *ve = scan(v, end, 1, &kind);
        if (fn(ctx, p + 1, (size_t)(ke - 1 - (p + 1)), v, ve, kind) != 0)
            return -1;
        p = skip_ws(ve, end);
        if (p < end && *p == ',')
            p = skip_ws(p + 1, end);
    }
    return 0;
}

static int add_param(void *ctx, const char *k, size_t kn, const char *v, const char *ve, int kind)
{
    (void)kind;
    return push(ctx, k, kn, v, (size_t)(ve - v));
}

typedef struct out_s {
    const char *name, *data, *data_end;
    size_t name_len;
} out_t;

static int output_field(void *ctx, const char *k, size_t kn, const char *v, const char *ve, int kind)
{
    out_t *o = ctx;
    if (kn == 4 && memcmp(k, "name", 4) == 0 && kind == J_STRING) {
        o->name = v + 1;
        o->name_len = (size_t)(ve - v - 2);
    } else if (kn == 4 && memcmp(k, "data", 4) == 0 && kind == J_ARRAY) {
        o->data = v;
        o->data_end = ve;
    }
    return 0;
}

static int top_field(void *ctx, const char *k, size_t kn, const char *v, const char *ve, int kind)
{
    members_t *ms = ctx;
    const char *end = ve;
    if (kn == 2 && memcmp(k, "id", 2) == 0)
        return kind == J_STRING && ve - v > 2 ? push(ms, k, kn, v, (size_t)(ve - v)) : 0;
    if ((kn == 10 && memcmp(k, "model_name", 10) == 0) || (kn == 13 && memcmp(k, "model_version", 13) == 0))
        return push(ms, k, kn, v, (size_t)(ve - v));
    if (kn == 10 && memcmp(k, "parameters", 10) == 0 && kind == J_OBJECT)
        return each_member(v, end, add_param, ms);
    if (kn == 7 && memcmp(k, "outputs", 7) == 0 && kind == J_ARRAY) {
        const char *p = skip_ws(v + 1, end);
        while (p < end && *p != ']') {
            int ok;
            const char *oe = scan(p, end, 1, &ok);
            out_t o = {0};
            if (ok == J_OBJECT && each_member(p, oe, output_field, &o) == 0 && o.name && o.data) {
                const char *dv = o.data, *de = o.data_end;
                if (flat_count(dv, de) == 1) { /* one element: the value itself */
                    int ek;
                    dv = skip_ws(dv + 1, de);
                    de = scan(dv, de, 1, &ek);
                }
                if (push(ms, o.name, o.name_len, dv, (size_t)(de - dv)) != 0)
                    return -1;
            }
            p = skip_ws(oe, end);
            if (p < end && *p == ',')
                p = skip_ws(p + 1, end);
        }
    }
    return 0;
}

oi_status_t *oi_generate_response(const char *v2, size_t len, oi_sbuf_t *out)
{
    const char *end = v2 + len;
    int kind;
    const char *e = scan(v2, end, 0, &kind);
    if (e == NULL || kind != J_OBJECT)
        return oi_status_new(OI_INTERNAL, "cannot read back the inference response");
    members_t ms = {0};
    oi_status_t *st = NULL;
    if (each_member(skip_ws(v2, end), e, top_field, &ms) != 0)
        st = oom();
    if (st == NULL) {
        if (ms.n > 1)
            qsort(ms.m, ms.n, sizeof(member_t), by_key);
        int bad = oi_sbuf_append(out, "{", 1);
        for (size_t i = 0; !bad && i < ms.n; i++)
            bad = (i && oi_sbuf_append(out, ",", 1)) || oi_sbuf_append(out, "\"", 1) ||
                  oi_sbuf_append(out, ms.m[i].k, ms.m[i].kn) || oi_sbuf_append(out, "\":", 2) ||
                  oi_sbuf_append(out, ms.m[i].v, ms.m[i].vn);
        if (bad || oi_sbuf_append(out, "}", 1))
            st = oom();
    }
    free(ms.m);
    return st;
}
