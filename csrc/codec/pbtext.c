#include "codec/pbtext.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- writer ------------------------------------------------------------------------------- */

static int put_escaped(oi_sbuf_t *o, const uint8_t *s, size_t n)
{
    if (oi_sbuf_append(o, "\"", 1) != 0)
        return -1;
    size_t run = 0; /* plain bytes not yet appended, ending at s + i */
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        const char *e = NULL;
        switch (c) {
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '"': e = "\\\""; break;
        case '\'': e = "\\'"; break;
        case '\\': e = "\\\\"; break;
        default: break;
        }
        if (e == NULL && c >= 0x20 && c < 0x7f) {
            run++;
            continue;
        }
        if (oi_sbuf_append(o, s + i - run, run) != 0)
            return -1;
        run = 0;
        int rc = e != NULL ? oi_sbuf_append(o, e, 2) : oi_sbuf_printf(o, "\\%03o", c);
        if (rc != 0)
            return -1;
    }
    if (oi_sbuf_append(o, s + n - run, run) != 0)
        return -1;
    return oi_sbuf_append(o, "\"", 1);
}

/* Decimal digits of v (with a '-' when `neg`), without printf. */
static int put_uint(oi_sbuf_t *o, uint64_t v, int neg)
{
    char buf[24];
    char *p = buf + sizeof(buf);
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (neg)
        *--p = '-';
    return oi_sbuf_append(o, p, (size_t)(buf + sizeof(buf) - p));
}

static int put_int(oi_sbuf_t *o, int64_t v)
{
    return v < 0 ? put_uint(o, (uint64_t)0 - (uint64_t)v, 1) : put_uint(o, (uint64_t)v, 0);
}

/* Floating point as protobuf's SimpleFtoa / SimpleDtoa: the shorter of the type's digits and
 * enough digits to read the same value back. */
static int put_real(oi_sbuf_t *o, double v, int is_float)
{
    if (isnan(v))
        return oi_sbuf_append(o, "nan", 3);
    if (isinf(v))
        return v < 0 ? oi_sbuf_append(o, "-inf", 4) : oi_sbuf_append(o, "inf", 3);
    char buf[40];
    if (is_float) {
        snprintf(buf, sizeof(buf), "%.6g", v);
        if (strtof(buf, NULL) != (float)v)
            snprintf(buf, sizeof(buf), "%.9g", v);
    } else {
        snprintf(buf, sizeof(buf), "%.15g", v);
        if (strtod(buf, NULL) != v)
            snprintf(buf, sizeof(buf), "%.17g", v);
    }
    return oi_sbuf_append(o, buf, strlen(buf));
}

static size_t elem_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE: return 8;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    default: return 4; /* 32-bit numbers, enums, protobuf_c_boolean */
    }
}

/* Whether a singular field is at its proto3 default (and so is not printed). */
static int is_default(const ProtobufCFieldDescriptor *f, const void *v)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(const char *const *)v;
        return s == NULL || *s == '\0';
    }
    case PROTOBUF_C_TYPE_MESSAGE: return *(const void *const *)v == NULL;
    case PROTOBUF_C_TYPE_BYTES: return ((const ProtobufCBinaryData *)v)->len == 0;
    case PROTOBUF_C_TYPE_FLOAT: {
        float x;
        memcpy(&x, v, 4);
        return x == 0 && !signbit(x);
    }
    case PROTOBUF_C_TYPE_DOUBLE: {
        double x;
        memcpy(&x, v, 8);
        return x == 0 && !signbit(x);
    }
    default: {
        static const uint8_t zero[8];
        return memcmp(v, zero, elem_size(f->type)) == 0;
    }
    }
}

static int write_msg(oi_sbuf_t *o, const ProtobufCMessage *m, int one_line, int indent);

static int put_indent(oi_sbuf_t *o, int one_line, int indent)
{
    if (one_line)
        return 0;
    for (int i = 0; i < indent; i++)
        if (oi_sbuf_append(o, "  ", 2) != 0)
            return -1;
    return 0;
}

static int write_value(oi_sbuf_t *o, const ProtobufCFieldDescriptor *f, const void *v, int one_line, int indent)
{
    if (put_indent(o, one_line, indent) != 0 || oi_sbuf_append(o, f->name, strlen(f->name)) != 0)
        return -1;
    if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
        const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)v;
        if (oi_sbuf_append(o, one_line ? " { " : " {\n", 3) != 0 || write_msg(o, sub, one_line, indent + 1) != 0 ||
            put_indent(o, one_line, indent) != 0)
            return -1;
        return oi_sbuf_append(o, one_line ? "} " : "}\n", 2);
    }
    if (oi_sbuf_append(o, ": ", 2) != 0)
        return -1;
    int rc = 0;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    float fl;
    double db;
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        memcpy(&i32, v, 4);
        rc = put_int(o, i32);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        memcpy(&u32, v, 4);
        rc = put_uint(o, u32, 0);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        memcpy(&i64, v, 8);
        rc = put_int(o, i64);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        memcpy(&u64, v, 8);
        rc = put_uint(o, u64, 0);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        memcpy(&fl, v, 4);
        rc = put_real(o, fl, 1);
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        memcpy(&db, v, 8);
        rc = put_real(o, db, 0);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        memcpy(&i32, v, 4);
        rc = i32 ? oi_sbuf_append(o, "true", 4) : oi_sbuf_append(o, "false", 5);
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        memcpy(&i32, v, 4);
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, i32);
        rc = ev != NULL ? oi_sbuf_append(o, ev->name, strlen(ev->name)) : oi_sbuf_printf(o, "%" PRId32, i32);
        break;
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(const char *const *)v;
        rc = put_escaped(o, (const uint8_t *)(s ? s : ""), s ? strlen(s) : 0);
        break;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = v;
        rc = put_escaped(o, b->data, b->len);
        break;
    }
    default: rc = -1;
    }
    if (rc != 0)
        return -1;
    return one_line ? oi_sbuf_append(o, " ", 1) : oi_sbuf_append(o, "\n", 1);
}

/* A map field's entry message ("...Entry" with key = 1 and value = 2): protobuf prints both of
 * its fields, defaults included. */
static int is_entry(const ProtobufCMessageDescriptor *d)
{
    size_t n = strlen(d->name);
    return d->n_fields == 2 && n > 5 && strcmp(d->name + n - 5, "Entry") == 0 && d->fields[0].id == 1 &&
           d->fields[1].id == 2 && strcmp(d->fields[0].name, "key") == 0 && strcmp(d->fields[1].name, "value") == 0;
}

static int write_msg(oi_sbuf_t *o, const ProtobufCMessage *m, int one_line, int indent)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    int entry = is_entry(d);
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const void *v = base + f->offset;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            const char *arr = *(const char *const *)v;
            for (size_t k = 0; k < n; k++)
                if (write_value(o, f, arr + k * elem_size(f->type), one_line, indent) != 0)
                    return -1;
            continue;
        }
        int present;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
            present = *(const uint32_t *)(base + f->quantifier_offset) == f->id;
        else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_MESSAGE &&
                 f->type != PROTOBUF_C_TYPE_STRING)
            present = *(const protobuf_c_boolean *)(base + f->quantifier_offset);
        else
            present = !is_default(f, v) || (entry && f->type != PROTOBUF_C_TYPE_MESSAGE);
        if (present && write_value(o, f, v, one_line, indent) != 0)
            return -1;
    }
    return 0;
}

int oi_pbtext_write(oi_sbuf_t *out, const ProtobufCMessage *m, int one_line)
{
    size_t start = out->len;
    if (write_msg(out, m, one_line, 0) != 0)
        return -1;
    if (one_line && out->len > start && out->data[out->len - 1] == ' ')
        out->len--;
    return oi_sbuf_append(out, "", 1) == 0 ? (out->len--, 0) : -1; /* keep it NUL-terminated */
}

/* ---- reader ------------------------------------------------------------------------------- */

#define MAX_DEPTH 32

typedef struct parser_s {
    const char *start, *p, *end;
    char *err;
    size_t cap;
    int depth;
} parser_t;

static int fail(parser_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(parser_t *p, const char *fmt, ...)
{
    if (p->err[0] != '\0') /* the innermost message wins */
        return -1;
    int n = snprintf(p->err, p->cap, "column %zu: ", (size_t)(p->p - p->start) + 1);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < p->cap)
        vsnprintf(p->err + n, p->cap - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static void skip_space(parser_t *p)
{
    while (p->p < p->end) {
        char c = *p->p;
        if (c == '#') {
            while (p->p < p->end && *p->p != '\n')
                p->p++;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
            p->p++;
        } else {
            break;
        }
    }
}

static int peek(parser_t *p, char c)
{
    skip_space(p);
    return p->p < p->end && *p->p == c;
}

static int is_ident(char c, int first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!first && c >= '0' && c <= '9');
}

/* A name or number token (letters, digits, '.', '+', '-'), copied NUL-terminated into buf. */
static int word(parser_t *p, char *buf, size_t cap)
{
    skip_space(p);
    size_t n = 0;
    while (p->p + n < p->end) {
        char c = p->p[n];
        if (!(is_ident(c, 0) || c == '.' || c == '+' || c == '-'))
            break;
        n++;
    }
    if (n == 0 || n >= cap)
        return n == 0 ? fail(p, "expected a value") : fail(p, "value too long");
    memcpy(buf, p->p, n);
    buf[n] = '\0';
    p->p += n;
    return 0;
}

static int put_varint(oi_sbuf_t *w, uint64_t v)
{
    uint8_t b[10];
    size_t n = 0;
    do {
        b[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v)
            b[n] |= 0x80;
        n++;
    } while (v);
    return oi_sbuf_append(w, b, n);
}

static int put_tag(oi_sbuf_t *w, uint32_t id, int wire)
{
    return put_varint(w, ((uint64_t)id << 3) | (unsigned)wire);
}

static int put_fixed(oi_sbuf_t *w, uint64_t v, size_t n)
{
    uint8_t b[8];
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    return oi_sbuf_append(w, b, n);
}

static int oom(parser_t *p)
{
    return fail(p, "out of memory");
}

/* One or more adjacent quoted strings, unescaped into s. */
static int quoted(parser_t *p, oi_sbuf_t *s, const char *field)
{
    skip_space(p);
    if (p->p >= p->end || (*p->p != '"' && *p->p != '\''))
        return fail(p, "field '%s': expected a quoted string", field);
    while (p->p < p->end && (*p->p == '"' || *p->p == '\'')) {
        char q = *p->p++;
        for (;;) {
            if (p->p >= p->end || *p->p == '\n')
                return fail(p, "field '%s': unterminated string", field);
            char c = *p->p++;
            if (c == q)
                break;
            if (c != '\\') {
                if (oi_sbuf_append(s, &c, 1) != 0)
                    return oom(p);
                continue;
            }
            if (p->p >= p->end)
                return fail(p, "field '%s': unterminated string", field);
            c = *p->p++;
            unsigned v;
            switch (c) {
            case 'n': v = '\n'; break;
            case 'r': v = '\r'; break;
            case 't': v = '\t'; break;
            case 'a': v = '\a'; break;
            case 'b': v = '\b'; break;
            case 'f': v = '\f'; break;
            case 'v': v = '\v'; break;
            case '\\':
            case '\'':
            case '"':
            case '?': v = (unsigned char)c; break;
            case 'x':
                v = 0;
                for (int k = 0; k < 2 && p->p < p->end && strchr("0123456789abcdefABCDEF", *p->p) && *p->p; k++) {
                    char h = *p->p++;
                    v = v * 16 + (unsigned)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
                }
                break;
            default:
                if (c < '0' || c > '7')
                    return fail(p, "field '%s': unknown escape '\\%c'", field, c);
                v = (unsigned)(c - '0');
                for (int k = 0; k < 2 && p->p < p->end && *p->p >= '0' && *p->p <= '7'; k++)
                    v = v * 8 + (unsigned)(*p->p++ - '0');
                if (v > 255)
                    return fail(p, "field '%s': octal escape out of range", field);
            }
            uint8_t b = (uint8_t)v;
            if (oi_sbuf_append(s, &b, 1) != 0)
                return oom(p);
        }
        skip_space(p);
    }
    return 0;
}

static int parse_fields(parser_t *p, const ProtobufCMessageDescriptor *d, oi_sbuf_t *w, char close);

static int parse_int(parser_t *p, const ProtobufCFieldDescriptor *f, const char *tok, int is_signed, uint64_t *out)
{
    char *end;
    errno = 0;
    if (is_signed) {
        long long v = strtoll(tok, &end, 0);
        *out = (uint64_t)v;
    } else {
        if (tok[0] == '-')
            return fail(p, "field '%s': expected a non-negative integer, got '%s'", f->name, tok);
        *out = strtoull(tok, &end, 0);
    }
    if (*end != '\0' || end == tok)
        return fail(p, "field '%s': expected an integer, got '%s'", f->name, tok);
    if (errno == ERANGE)
        return fail(p, "field '%s': integer '%s' out of range", f->name, tok);
    return 0;
}

/* One value of field f, appended to w with its tag. */
static int parse_value(parser_t *p, const ProtobufCFieldDescriptor *f, oi_sbuf_t *w)
{
    if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
        skip_space(p);
        char open = p->p < p->end ? *p->p : '\0';
        if (open != '{' && open != '<')
            return fail(p, "field '%s': expected '{' to open the message", f->name);
        p->p++;
        if (++p->depth > MAX_DEPTH)
            return fail(p, "field '%s': messages nested deeper than %d", f->name, MAX_DEPTH);
        oi_sbuf_t sub = {0};
        int rc = parse_fields(p, f->descriptor, &sub, open == '{' ? '}' : '>');
        p->depth--;
        if (rc == 0 &&
            (put_tag(w, f->id, 2) != 0 || put_varint(w, sub.len) != 0 || oi_sbuf_append(w, sub.data, sub.len) != 0))
            rc = oom(p);
        oi_sbuf_free(&sub);
        return rc;
    }
    if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES) {
        oi_sbuf_t s = {0};
        int rc = quoted(p, &s, f->name);
        if (rc == 0 &&
            (put_tag(w, f->id, 2) != 0 || put_varint(w, s.len) != 0 || oi_sbuf_append(w, s.data, s.len) != 0))
            rc = oom(p);
        oi_sbuf_free(&s);
        return rc;
    }
    char tok[128];
    if (word(p, tok, sizeof(tok)) != 0)
        return fail(p, "field '%s': expected a value", f->name);
    uint64_t u = 0;
    int rc = 0;
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        if (parse_int(p, f, tok, 1, &u) != 0)
            return -1;
        if ((int64_t)u < INT32_MIN || (int64_t)u > INT32_MAX)
            return fail(p, "field '%s': integer '%s' out of the int32 range", f->name, tok);
        if (f->type == PROTOBUF_C_TYPE_SFIXED32)
            rc = put_tag(w, f->id, 5) || put_fixed(w, (uint32_t)(int32_t)u, 4);
        else if (f->type == PROTOBUF_C_TYPE_SINT32)
            rc = put_tag(w, f->id, 0) || put_varint(w, ((uint32_t)(int32_t)u << 1) ^ (uint32_t)((int32_t)u >> 31));
        else
            rc = put_tag(w, f->id, 0) || put_varint(w, (uint64_t)(int64_t)(int32_t)u);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        if (parse_int(p, f, tok, 1, &u) != 0)
            return -1;
        if (f->type == PROTOBUF_C_TYPE_SFIXED64)
            rc = put_tag(w, f->id, 1) || put_fixed(w, u, 8);
        else if (f->type == PROTOBUF_C_TYPE_SINT64)
            rc = put_tag(w, f->id, 0) || put_varint(w, (u << 1) ^ (uint64_t)((int64_t)u >> 63));
        else
            rc = put_tag(w, f->id, 0) || put_varint(w, u);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        if (parse_int(p, f, tok, 0, &u) != 0)
            return -1;
        if (u > UINT32_MAX)
            return fail(p, "field '%s': integer '%s' out of the uint32 range", f->name, tok);
        rc = f->type == PROTOBUF_C_TYPE_FIXED32 ? put_tag(w, f->id, 5) || put_fixed(w, u, 4)
                                                : put_tag(w, f->id, 0) || put_varint(w, u);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        if (parse_int(p, f, tok, 0, &u) != 0)
            return -1;
        rc = f->type == PROTOBUF_C_TYPE_FIXED64 ? put_tag(w, f->id, 1) || put_fixed(w, u, 8)
                                                : put_tag(w, f->id, 0) || put_varint(w, u);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE: {
        size_t n = strlen(tok);
        if (n > 1 && (tok[n - 1] == 'f' || tok[n - 1] == 'F') && strncmp(tok, "0x", 2) != 0 &&
            strcasecmp(tok, "inf") != 0 && strcasecmp(tok, "-inf") != 0)
            tok[n - 1] = '\0';
        char *end;
        double v = strtod(tok, &end);
        if (*end != '\0' || end == tok)
            return fail(p, "field '%s': expected a number, got '%s'", f->name, tok);
        if (f->type == PROTOBUF_C_TYPE_FLOAT) {
            float fv = (float)v;
            uint32_t bits;
            memcpy(&bits, &fv, 4);
            rc = put_tag(w, f->id, 5) || put_fixed(w, bits, 4);
        } else {
            uint64_t bits;
            memcpy(&bits, &v, 8);
            rc = put_tag(w, f->id, 1) || put_fixed(w, bits, 8);
        }
        break;
    }
    case PROTOBUF_C_TYPE_BOOL: {
        int b;
        if (!strcmp(tok, "true") || !strcmp(tok, "True") || !strcmp(tok, "t") || !strcmp(tok, "1"))
            b = 1;
        else if (!strcmp(tok, "false") || !strcmp(tok, "False") || !strcmp(tok, "f") || !strcmp(tok, "0"))
            b = 0;
        else
            return fail(p, "field '%s': expected true or false, got '%s'", f->name, tok);
        rc = put_tag(w, f->id, 0) || put_varint(w, (uint64_t)b);
        break;
    }
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *ed = f->descriptor;
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value_by_name(ed, tok);
        int64_t v;
        if (ev != NULL) {
            v = ev->value;
        } else {
            if (!((tok[0] >= '0' && tok[0] <= '9') || tok[0] == '-'))
                return fail(p, "field '%s': unknown value '%s' of enum %s", f->name, tok, ed->name);
            if (parse_int(p, f, tok, 1, &u) != 0)
                return -1;
            v = (int64_t)u;
            if (v < INT32_MIN || v > INT32_MAX)
                return fail(p, "field '%s': enum value '%s' out of range", f->name, tok);
        }
        rc = put_tag(w, f->id, 0) || put_varint(w, (uint64_t)v);
        break;
    }
    default: return fail(p, "field '%s': unsupported type", f->name);
    }
    return rc ? oom(p) : 0;
}

static int parse_fields(parser_t *p, const ProtobufCMessageDescriptor *d, oi_sbuf_t *w, char close)
{
    uint8_t seen[d->n_fields ? d->n_fields : 1];
    memset(seen, 0, sizeof(seen));
    for (;;) {
        skip_space(p);
        if (p->p >= p->end) {
            if (close == '\0')
                return 0;
            return fail(p, "expected '%c' to close %s", close, d->name);
        }
        if (*p->p == close) {
            p->p++;
            return 0;
        }
        if (!is_ident(*p->p, 1))
            return fail(p, "expected a field name of %s, got '%c'", d->name, *p->p);
        char name[128];
        size_t n = 0;
        while (p->p + n < p->end && is_ident(p->p[n], 0))
            n++;
        if (n >= sizeof(name))
            return fail(p, "field name too long");
        memcpy(name, p->p, n);
        name[n] = '\0';
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, name);
        if (f == NULL)
            return fail(p, "unknown field '%s' in %s", name, d->name);
        p->p += n;
        size_t idx = (size_t)(f - d->fields);
        if (f->label != PROTOBUF_C_LABEL_REPEATED && seen[idx])
            return fail(p, "field '%s' of %s is given more than once", name, d->name);
        seen[idx] = 1;
        int colon = peek(p, ':');
        if (colon)
            p->p++;
        else if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            return fail(p, "expected ':' after field '%s'", name);
        if (peek(p, '[')) {
            if (f->label != PROTOBUF_C_LABEL_REPEATED)
                return fail(p, "field '%s' is not repeated: a list is not allowed", name);
            p->p++;
            if (!peek(p, ']'))
                for (;;) {
                    if (parse_value(p, f, w) != 0)
                        return -1;
                    if (peek(p, ','))
                        p->p++;
                    else
                        break;
                }
            if (!peek(p, ']'))
                return fail(p, "expected ']' to close the list of field '%s'", name);
            p->p++;
        } else if (parse_value(p, f, w) != 0) {
            return -1;
        }
        if (peek(p, ',') || peek(p, ';'))
            p->p++;
    }
}

ProtobufCMessage *oi_pbtext_parse(const ProtobufCMessageDescriptor *d, const char *text, size_t len, char *err,
                                  size_t errcap)
{
    parser_t p = {text, text, text + len, err, errcap, 0};
    err[0] = '\0';
    oi_sbuf_t wire = {0};
    ProtobufCMessage *m = NULL;
    if (parse_fields(&p, d, &wire, '\0') == 0) {
        m = protobuf_c_message_unpack(d, NULL, wire.len, (const uint8_t *)(wire.data ? wire.data : ""));
        if (m == NULL)
            snprintf(err, errcap, "not a valid %s", d->name);
    }
    oi_sbuf_free(&wire);
    return m;
}

/* ---- JSON --------------------------------------------------------------------------------- */

static int json_name(oi_sbuf_t *o, const char *name)
{
    /* protobuf's JSON name: lowerCamelCase of the field name. */
    if (oi_sbuf_append(o, "\"", 1) != 0)
        return -1;
    for (int up = 0; *name; name++) {
        if (*name == '_') {
            up = 1;
            continue;
        }
        char c = up && *name >= 'a' && *name <= 'z' ? (char)(*name - 32) : *name;
        up = 0;
        if (oi_sbuf_append(o, &c, 1) != 0)
            return -1;
    }
    return oi_sbuf_append(o, "\":", 2);
}

static int json_string(oi_sbuf_t *o, const char *s, size_t n)
{
    if (oi_sbuf_append(o, "\"", 1) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int rc = c == '"' || c == '\\' ? oi_sbuf_printf(o, "\\%c", c)
                 : c < 0x20            ? oi_sbuf_printf(o, "\\u%04x", c)
                                       : oi_sbuf_append(o, &s[i], 1);
        if (rc != 0)
            return -1;
    }
    return oi_sbuf_append(o, "\"", 1);
}

static int json_base64(oi_sbuf_t *o, const uint8_t *p, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (oi_sbuf_append(o, "\"", 1) != 0)
        return -1;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        char q[4] = {tab[v >> 18], tab[(v >> 12) & 63], i + 1 < n ? tab[(v >> 6) & 63] : '=',
                     i + 2 < n ? tab[v & 63] : '='};
        if (oi_sbuf_append(o, q, 4) != 0)
            return -1;
    }
    return oi_sbuf_append(o, "\"", 1);
}

static int json_msg(oi_sbuf_t *o, const ProtobufCMessage *m);

/* One value; `key` quotes numbers, as map keys must be strings. */
static int json_value(oi_sbuf_t *o, const ProtobufCFieldDescriptor *f, const void *v, int key)
{
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    float fl;
    double db;
    const char *q = key ? "\"" : "";
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32: memcpy(&i32, v, 4); return oi_sbuf_printf(o, "%s%" PRId32 "%s", q, i32, q);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: memcpy(&u32, v, 4); return oi_sbuf_printf(o, "%s%" PRIu32 "%s", q, u32, q);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: memcpy(&i64, v, 8); return oi_sbuf_printf(o, "\"%" PRId64 "\"", i64);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: memcpy(&u64, v, 8); return oi_sbuf_printf(o, "\"%" PRIu64 "\"", u64);
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE:
        if (f->type == PROTOBUF_C_TYPE_FLOAT) {
            memcpy(&fl, v, 4);
            db = fl;
        } else {
            memcpy(&db, v, 8);
        }
        if (isnan(db))
            return oi_sbuf_append(o, "\"NaN\"", 5);
        if (isinf(db))
            return db < 0 ? oi_sbuf_append(o, "\"-Infinity\"", 11) : oi_sbuf_append(o, "\"Infinity\"", 10);
        return put_real(o, db, f->type == PROTOBUF_C_TYPE_FLOAT);
    case PROTOBUF_C_TYPE_BOOL:
        memcpy(&i32, v, 4);
        return key ? oi_sbuf_printf(o, "\"%s\"", i32 ? "true" : "false")
                   : oi_sbuf_printf(o, "%s", i32 ? "true" : "false");
    case PROTOBUF_C_TYPE_ENUM: {
        memcpy(&i32, v, 4);
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, i32);
        return ev != NULL ? oi_sbuf_printf(o, "\"%s\"", ev->name) : oi_sbuf_printf(o, "%" PRId32, i32);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(const char *const *)v;
        return json_string(o, s ? s : "", s ? strlen(s) : 0);
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = v;
        return json_base64(o, b->data, b->len);
    }
    case PROTOBUF_C_TYPE_MESSAGE: return json_msg(o, *(const ProtobufCMessage *const *)v);
    default: return -1;
    }
}

/* A map field's entry type: a message "...Entry" of two fields, key (1) and value (2). */
static int is_map_entry(const ProtobufCFieldDescriptor *f)
{
    if (f->type != PROTOBUF_C_TYPE_MESSAGE || f->label != PROTOBUF_C_LABEL_REPEATED)
        return 0;
    return is_entry(f->descriptor);
}

static int json_msg(oi_sbuf_t *o, const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    int first = 1;
    if (oi_sbuf_append(o, "{", 1) != 0)
        return -1;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const void *v = base + f->offset;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            if (n == 0)
                continue;
            const char *arr = *(const char *const *)v;
            int map = is_map_entry(f);
            if ((!first && oi_sbuf_append(o, ",", 1) != 0) || json_name(o, f->name) != 0 ||
                oi_sbuf_append(o, map ? "{" : "[", 1) != 0)
                return -1;
            first = 0;
            for (size_t k = 0; k < n; k++) {
                const void *ev = arr + k * elem_size(f->type);
                if (k && oi_sbuf_append(o, ",", 1) != 0)
                    return -1;
                if (map) {
                    const ProtobufCMessage *entry = *(const ProtobufCMessage *const *)ev;
                    const ProtobufCMessageDescriptor *ed = f->descriptor;
                    const char *eb = (const char *)entry;
                    if (json_value(o, &ed->fields[0], eb + ed->fields[0].offset, 1) != 0 ||
                        oi_sbuf_append(o, ":", 1) != 0)
                        return -1;
                    const ProtobufCFieldDescriptor *vf = &ed->fields[1];
                    const void *val = eb + vf->offset;
                    int rc = vf->type == PROTOBUF_C_TYPE_MESSAGE && *(const void *const *)val == NULL
                                 ? oi_sbuf_append(o, "{}", 2)
                                 : json_value(o, vf, val, 0);
                    if (rc != 0)
                        return -1;
                } else if (json_value(o, f, ev, 0) != 0) {
                    return -1;
                }
            }
            if (oi_sbuf_append(o, map ? "}" : "]", 1) != 0)
                return -1;
            continue;
        }
        int present;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
            present = *(const uint32_t *)(base + f->quantifier_offset) == f->id;
        else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_MESSAGE &&
                 f->type != PROTOBUF_C_TYPE_STRING)
            present = *(const protobuf_c_boolean *)(base + f->quantifier_offset);
        else
            present = !is_default(f, v);
        if (!present)
            continue;
        if ((!first && oi_sbuf_append(o, ",", 1) != 0) || json_name(o, f->name) != 0 || json_value(o, f, v, 0) != 0)
            return -1;
        first = 0;
    }
    return oi_sbuf_append(o, "}", 1);
}

int oi_pbjson_write(oi_sbuf_t *out, const ProtobufCMessage *m)
{
    return json_msg(out, m);
}
