/* The V2 JSON codec's reader of "parameters" objects (and of any small JSON object) kept as
 * text by the decoders: looked up, compared and walked with the decoder's reader. */
#include "json.h"
#include "json_internal.h"

#include <string.h>

/* ---- Parameters ------------------------------------------------------------------------- */

/* The next member of the object at c whose key is not in `ignored`: its key and value text.
 * 1, 0 at the object's end, -1 on malformed text. */
static int next_kept_member(cursor_t *c, uint32_t *n, const char *const *ignored, short_str_t *k, oi_slice_t *value)
{
    int r;
    while ((r = oi__json_next_member(c, n, k)) == 1) {
        int skip = 0;
        for (const char *const *i = ignored; *i != NULL && !skip; i++)
            skip = oi__json_str_is(k, *i);
        char *at = c->p;
        if (oi__json_skip_value(c) != 0)
            return -1;
        *value = (oi_slice_t){at, (size_t)(c->p - at)};
        if (!skip)
            return 1;
    }
    return r;
}

static cursor_t read_cursor(oi_slice_t text)
{
    /* The cursor's functions take mutable text but only read_string_in_place and the float
     * conversions write, and neither is used by the readers below. */
    return (cursor_t){.base = (char *)text.ptr, .p = (char *)text.ptr, .end = (char *)text.ptr + text.len,
                      .max_depth = OI_JSON_MAX_DEPTH};
}

int oi_json_params_each(oi_slice_t params, const char *const *ignored,
                        void (*fn)(void *ctx, const char *key, size_t key_len, oi_slice_t value), void *ctx)
{
    if (params.ptr == NULL)
        return 0;
    cursor_t c = read_cursor(params);
    short_str_t k;
    oi_slice_t v;
    uint32_t n = 0;
    int r = oi__json_enter(&c, '{') == 0 ? 1 : -1;
    while (r == 1 && (r = next_kept_member(&c, &n, ignored, &k, &v)) == 1)
        fn(ctx, k.s, k.n, v);
    oi_status_free(c.err);
    return r == 0 && oi__json_peek(&c) == -1 ? 0 : -1;
}

int oi_json_params_same(oi_slice_t a, oi_slice_t b, const char *const *ignored)
{
    static const char empty[] = "{}";
    cursor_t ca = read_cursor(a.ptr ? a : (oi_slice_t){empty, 2}), cb = read_cursor(b.ptr ? b : (oi_slice_t){empty, 2});
    short_str_t ka, kb;
    oi_slice_t va, vb;
    uint32_t na = 0, nb = 0;
    int same = oi__json_enter(&ca, '{') == 0 && oi__json_enter(&cb, '{') == 0;
    while (same) {
        int ra = next_kept_member(&ca, &na, ignored, &ka, &va), rb = next_kept_member(&cb, &nb, ignored, &kb, &vb);
        if (ra != rb || ra < 0 || ra == 0) {
            same = ra == 0 && rb == 0 && oi__json_peek(&ca) == -1 && oi__json_peek(&cb) == -1;
            break;
        }
        same = ka.n == kb.n && memcmp(ka.s, kb.s, ka.n) == 0 && va.len == vb.len && memcmp(va.ptr, vb.ptr, va.len) == 0;
    }
    oi_status_free(ca.err);
    oi_status_free(cb.err);
    return same;
}

int oi_json_param(oi_slice_t params, const char *key, oi_json_param_t *out, char *buf, size_t cap)
{
    memset(out, 0, sizeof(*out));
    if (params.ptr == NULL)
        return 0;
    cursor_t c = read_cursor(params);
    short_str_t k;
    uint32_t n = 0;
    int r, found = 0;
    if (oi__json_enter(&c, '{') != 0)
        goto fail;
    /* Every member is walked, so that a malformed object is refused wherever it breaks; the
     * first occurrence of a repeated key counts. */
    while ((r = oi__json_next_member(&c, &n, &k)) == 1) {
        if (found || !oi__json_str_is(&k, key)) {
            if (oi__json_skip_value(&c) != 0)
                goto fail;
            continue;
        }
        found = 1;
        int ch = oi__json_peek(&c);
        char *value = c.p;
        if (ch == '"') {
            char *raw;
            size_t len;
            int escaped;
            if (oi__json_scan_string(&c, &raw, &len, &escaped) != 0)
                goto fail;
            out->kind = OI_JSON_PARAM_STRING;
            if (len >= cap) { /* decoding never lengthens text, but may not shorten it enough */
                out->len = len;
                out->too_long = 1;
            } else {
                out->len = escaped ? oi__json_unescape(buf, raw, len) : len;
                if (!escaped)
                    memcpy(buf, raw, len);
                buf[out->len] = '\0';
            }
        } else if (oi__json_is_number_start(ch)) {
            char got[48];
            int64_t v;
            int rc = oi__json_read_count(&c, &v, got);
            if (rc < 0)
                goto fail;
            out->kind = rc == 0 ? OI_JSON_PARAM_COUNT : OI_JSON_PARAM_OTHER;
            out->count = rc == 0 ? v : 0;
        } else {
            if (oi__json_skip_value(&c) != 0)
                goto fail;
            out->kind = OI_JSON_PARAM_OTHER;
        }
        out->raw = (oi_slice_t){value, (size_t)(c.p - value)};
    }
    if (r == 0 && c.err == NULL && oi__json_peek(&c) == -1)
        return 0;
fail:
    oi_status_free(c.err);
    memset(out, 0, sizeof(*out));
    return -1;
}

oi_buf_t *oi_json_params_extend(oi_slice_t params, const char *members, size_t n)
{
    /* The object's text up to its closing brace, and whether it has members of its own. */
    size_t end = params.ptr != NULL ? params.len : 0;
    while (end > 0 && params.ptr[end - 1] != '}')
        end--;
    size_t keep = end > 0 ? end - 1 : 0;
    int own = 0;
    for (size_t i = 0; i < keep && !own; i++)
        own = params.ptr[i] != '{' && params.ptr[i] != ' ' && params.ptr[i] != '\t' && params.ptr[i] != '\n' &&
              params.ptr[i] != '\r';
    oi_buf_t *b = oi_buf_new(keep + n + 3);
    if (b == NULL)
        return NULL;
    if (own) {
        memcpy(b->data, params.ptr, keep);
        b->data[keep] = ',';
        b->len = keep + 1;
    } else {
        b->data[0] = '{';
        b->len = 1;
    }
    memcpy(b->data + b->len, members, n);
    b->len += n;
    b->data[b->len++] = '}';
    b->data[b->len] = '\0';
    return b;
}
