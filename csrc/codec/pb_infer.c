#include "codec/pb_infer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "codec/json_internal.h"

/* Wire types of the protobuf encoding. */
enum { WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2, WT_SGROUP = 3, WT_EGROUP = 4, WT_I32 = 5 };

/* ---- reading ------------------------------------------------------------------------------ */

typedef struct rd_s {
    const uint8_t *p;
    const uint8_t *end;
} rd_t;

/* One field of a message: its number, wire type, and value (a varint or fixed value in `v`, a
 * length-delimited value in `s`). */
typedef struct field_s {
    uint32_t num;
    int wt;
    uint64_t v;
    oi_slice_t s;
} field_t;

enum { RD_OK = 0, RD_BAD_VARINT, RD_TRUNCATED, RD_BAD_WIRE_TYPE, RD_FIELD_ZERO };

static int rd_varint(rd_t *r, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (r->p >= r->end)
            return RD_BAD_VARINT;
        uint8_t b = *r->p++;
        if (shift == 63 && b > 1)
            return RD_BAD_VARINT; /* the 10th byte may only hold the top bit */
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return RD_OK;
        }
    }
    return RD_BAD_VARINT;
}

/* Reads the next field; RD_OK or a reason. Groups (wire types 3 and 4) are refused: proto3
 * has none and no field of these messages is one. */
static int rd_field(rd_t *r, field_t *f)
{
    uint64_t key;
    int rc = rd_varint(r, &key);
    if (rc != RD_OK)
        return rc;
    f->num = (uint32_t)(key >> 3);
    f->wt = (int)(key & 7);
    if ((key >> 3) == 0 || (key >> 3) > 0x1fffffff)
        return RD_FIELD_ZERO;
    switch (f->wt) {
    case WT_VARINT:
        return rd_varint(r, &f->v);
    case WT_I64:
        if (r->end - r->p < 8)
            return RD_TRUNCATED;
        memcpy(&f->v, r->p, 8);
        r->p += 8;
        return RD_OK;
    case WT_I32: {
        uint32_t v32;
        if (r->end - r->p < 4)
            return RD_TRUNCATED;
        memcpy(&v32, r->p, 4);
        f->v = v32;
        r->p += 4;
        return RD_OK;
    }
    case WT_LEN: {
        uint64_t n;
        if ((rc = rd_varint(r, &n)) != RD_OK)
            return rc;
        if (n > (uint64_t)(r->end - r->p))
            return RD_TRUNCATED;
        f->s.ptr = (const char *)r->p;
        f->s.len = (size_t)n;
        r->p += n;
        return RD_OK;
    }
    default:
        return RD_BAD_WIRE_TYPE;
    }
}

static const char *rd_reason(int rc)
{
    switch (rc) {
    case RD_BAD_VARINT: return "malformed varint";
    case RD_TRUNCATED: return "truncated field (its length runs past the end of the message)";
    case RD_BAD_WIRE_TYPE: return "unsupported wire type (groups are not protobuf 3)";
    default: return "field number 0 or out of range";
    }
}

static const char *wt_name(int wt)
{
    switch (wt) {
    case WT_VARINT: return "varint";
    case WT_I64: return "64-bit";
    case WT_LEN: return "length-delimited";
    case WT_I32: return "32-bit";
    default: return "group";
    }
}

/* ---- decoding state ---------------------------------------------------------------------- */

/* A growable array of slices. */
typedef struct slices_s {
    oi_slice_t *v;
    uint32_t n, cap;
} slices_t;

static int slices_push(slices_t *a, oi_slice_t s)
{
    if (a->n == a->cap) {
        uint32_t cap = a->cap ? a->cap * 2 : 8;
        oi_slice_t *p = realloc(a->v, cap * sizeof(*p));
        if (p == NULL)
            return -1;
        a->v = p;
        a->cap = cap;
    }
    a->v[a->n++] = s;
    return 0;
}

typedef struct dec_s {
    oi_buf_t *msg;
    oi_slice_t region; /* the message's bytes within msg (a stream response wraps it) */
    int response;      /* decoding a ModelInferResponse: tensors are outputs (field 5), raw
                        * contents field 6, and no requested outputs */
    const char *msg_name, *tensors_name, *raw_name, *kind; /* for error messages */
    oi_request_t *req;
    oi_sbuf_t aux; /* NUL-terminated strings and parameter JSON; offsets until rebased */
    oi_status_t *err;
    slices_t params, inputs, outputs, raw;
    oi_slice_t model_name, model_version, id, error_message;
    int have_id, have_error, have_seq_str;
    size_t seq_id_len;
    /* Offsets into aux, kept until aux is final. */
    size_t name_off, version_off, id_off, params_off, params_len, error_off, seq_id_off;
    size_t *in_name_off, *in_params_off, *in_params_len, *out_name_off, *out_params_off, *out_params_len;
} dec_t;

static oi_status_t *bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static oi_status_t *bad(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return oi_status_new(OI_BAD_REQUEST, "%s", msg);
}

static oi_status_t *oom(void) { return oi_status_new(OI_INTERNAL, "out of memory decoding the request"); }

/* A field of `what` with the wrong wire type. */
/* A shape oi_shape_elements refuses: in tritonserver's core's words where it refuses it too
 * (gRPC shapes meet only its core's checks), else in ours. */
static oi_status_t *uncountable(const oi_tensor_t *t, const char *label)
{
    char shape[24 * OI_MAX_DIMS];
    oi_status_t *st = oi_shape_refusal(t->shape, t->ndim, t->dtype, "input", t->name, OI_WORDS_CORE);
    return st != NULL ? st
                      : bad("%s: shape %s has too many elements", label,
                            oi_shape_format(t->shape, t->ndim, shape, sizeof(shape)));
}

static oi_status_t *bad_wire(const char *what, const field_t *f, int want)
{
    return bad("%s: field %u has wire type %d (%s), expected %d (%s)", what, f->num, f->wt, wt_name(f->wt), want,
               wt_name(want));
}

/* Appends a NUL-terminated copy of `s` to aux and returns its offset, or (size_t)-1. */
static size_t aux_str(dec_t *d, oi_slice_t s)
{
    size_t off = d->aux.len;
    if (oi_sbuf_append(&d->aux, s.ptr, s.len) != 0 || oi_sbuf_append(&d->aux, "", 1) != 0)
        return (size_t)-1;
    return off;
}

/* ---- parameters ---------------------------------------------------------------------------- */

/* Renders an InferParameter value as JSON: the last member of its oneof wins, as protobuf
 * has it; none set is null. */
static oi_status_t *render_param_value(dec_t *d, oi_slice_t value, const char *what)
{
    rd_t r = {(const uint8_t *)value.ptr, (const uint8_t *)value.ptr + value.len};
    field_t f, last = {0};
    int rc;
    while (r.p < r.end) {
        if ((rc = rd_field(&r, &f)) != RD_OK)
            return bad("%s: %s", what, rd_reason(rc));
        static const int want[6] = {-1, WT_VARINT, WT_VARINT, WT_LEN, WT_I64, WT_VARINT};
        if (f.num >= 1 && f.num <= 5) {
            if (f.wt != want[f.num])
                return bad_wire(what, &f, want[f.num]);
            last = f;
        }
    }
    oi_sbuf_t *o = &d->aux;
    int w;
    switch (last.num) {
    case 1: w = oi_sbuf_append(o, last.v ? "true" : "false", last.v ? 4 : 5); break;
    case 2: w = oi_sbuf_printf(o, "%" PRId64, (int64_t)last.v); break;
    case 3: w = oi_json_write_string(o, last.s.ptr, last.s.len); break;
    case 4: {
        double x;
        memcpy(&x, &last.v, 8);
        if (isnan(x))
            w = oi_sbuf_append(o, "NaN", 3);
        else if (isinf(x))
            w = x > 0 ? oi_sbuf_append(o, "Infinity", 8) : oi_sbuf_append(o, "-Infinity", 9);
        else {
            /* The shortest of %.15g..%.17g that reads back exactly. */
            char buf[40];
            for (int prec = 15; prec <= 17; prec++) {
                snprintf(buf, sizeof(buf), "%.*g", prec, x);
                if (strtod(buf, NULL) == x)
                    break;
            }
            if (strpbrk(buf, ".eni") == NULL) /* keep it a float in JSON: 1 -> 1.0 */
                strcat(buf, ".0");
            w = oi_sbuf_append(o, buf, strlen(buf));
        }
        break;
    }
    case 5: w = oi_sbuf_printf(o, "%" PRIu64, last.v); break;
    default: w = oi_sbuf_append(o, "null", 4); break;
    }
    return w == 0 ? NULL : oom();
}

/* Renders map entries (each a message {1: key, 2: InferParameter}) as one JSON object in aux,
 * NUL-terminated; sets *off and *len (len excludes the NUL), and *shm (when not NULL) when a
 * key is "shared_memory_region". */
static oi_status_t *render_params(dec_t *d, const oi_slice_t *entries, uint32_t n, const char *what, size_t *off,
                                  size_t *len, uint8_t *shm)
{
    char path[300];
    *off = d->aux.len;
    if (oi_sbuf_append(&d->aux, "{", 1) != 0)
        return oom();
    for (uint32_t i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%.200s[%u]", what, i);
        rd_t r = {(const uint8_t *)entries[i].ptr, (const uint8_t *)entries[i].ptr + entries[i].len};
        oi_slice_t key = {"", 0}, value = {NULL, 0};
        field_t f;
        int rc;
        while (r.p < r.end) {
            if ((rc = rd_field(&r, &f)) != RD_OK)
                return bad("%s: %s", path, rd_reason(rc));
            if (f.num == 1 || f.num == 2) {
                if (f.wt != WT_LEN)
                    return bad_wire(path, &f, WT_LEN);
                if (f.num == 1)
                    key = f.s;
                else
                    value = f.s;
            }
        }
        if (shm != NULL && key.len == 20 && memcmp(key.ptr, "shared_memory_region", 20) == 0)
            *shm = 1;
        if ((i > 0 && oi_sbuf_append(&d->aux, ",", 1) != 0) || oi_json_write_string(&d->aux, key.ptr, key.len) != 0 ||
            oi_sbuf_append(&d->aux, ":", 1) != 0)
            return oom();
        char vpath[340];
        snprintf(vpath, sizeof(vpath), "%.300s.value", path);
        oi_status_t *st;
        if (value.ptr == NULL) {
            if (oi_sbuf_append(&d->aux, "null", 4) != 0)
                return oom();
        } else if ((st = render_param_value(d, value, vpath)) != NULL)
            return st;
    }
    if (oi_sbuf_append(&d->aux, "}", 2) != 0) /* with the NUL */
        return oom();
    *len = d->aux.len - 1 - *off;
    return NULL;
}

/* The request parameters the server acts on (already checked by render_params), typed and
 * worded as Triton's gRPC frontend has them: "timeout", an int64_param in microseconds (a
 * negative one is no limit: Triton takes it as a huge unsigned value); "sequence_id", an
 * int64_param or string_param (a string is copied into aux, its offset in d->seq_id_off);
 * "sequence_start" and "sequence_end", bool_params; "triton_enable_empty_final_response", a
 * bool_param (decoupled models' streams); "priority", an int64_param or uint64_param. */
static oi_status_t *request_params(dec_t *d, const oi_slice_t *entries, uint32_t n, oi_request_t *req)
{
    static const char *const names[] = {
        "timeout", "sequence_id", "sequence_start", "sequence_end", "triton_enable_empty_final_response", "priority"};
    for (uint32_t i = 0; i < n; i++) {
        rd_t r = {(const uint8_t *)entries[i].ptr, (const uint8_t *)entries[i].ptr + entries[i].len};
        oi_slice_t key = {"", 0}, value = {"", 0};
        field_t f;
        while (r.p < r.end && rd_field(&r, &f) == RD_OK)
            if (f.num == 1)
                key = f.s;
            else if (f.num == 2)
                value = f.s;
        int k = 0;
        while (k < 6 && !(key.len == strlen(names[k]) && memcmp(key.ptr, names[k], key.len) == 0))
            k++;
        if (k == 6 && key.len >= 7 && memcmp(key.ptr, "triton_", 7) == 0) /* as infer_handler.cc */
            return bad("parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
                       "keys starting with 'triton_' are allowed: triton_enable_empty_final_response");
        if (k == 6)
            continue;
        rd_t v = {(const uint8_t *)value.ptr, (const uint8_t *)value.ptr + value.len};
        field_t last = {0};
        while (v.p < v.end && rd_field(&v, &f) == RD_OK)
            if (f.num >= 1 && f.num <= 5)
                last = f;
        if (k == 5) { /* a negative int64 is past every level: the default, as Triton casts it */
            if (last.num != 2 && last.num != 5)
                return bad("invalid value type for 'priority' parameter, expected int64_param or uint64_param.");
            req->priority = last.v;
        } else if (k == 0) {
            if (last.num != 2)
                return bad("invalid value type for 'timeout' parameter, expected int64_param.");
            req->timeout_us = (int64_t)last.v > 0 ? last.v : 0;
        } else if (k == 1) {
            req->seq.id = 0;
            d->have_seq_str = 0;
            if (last.num == 2) {
                req->seq.id = last.v;
            } else if (last.num == 3) {
                if (last.s.len > OI_MAX_ID_BYTES)
                    return bad("'sequence_id' parameter: %zu bytes; at most %d are accepted", last.s.len,
                               OI_MAX_ID_BYTES);
                if ((d->seq_id_off = aux_str(d, last.s)) == (size_t)-1)
                    return oom();
                d->have_seq_str = 1;
                d->seq_id_len = last.s.len;
            } else {
                return bad("invalid value type for 'sequence_id' parameter, expected int64_param or string_param.");
            }
        } else {
            if (last.num != 1)
                return bad("invalid value type for '%s' parameter, expected bool_param.", names[k]);
            if (k == 2)
                req->seq.start = last.v != 0;
            else if (k == 3)
                req->seq.end = last.v != 0;
            else
                req->empty_final = last.v != 0;
        }
    }
    return NULL;
}

/* ---- typed contents ------------------------------------------------------------------------ */

/* The InferTensorContents field that carries each datatype; 0 for none (raw only). */
static uint32_t contents_field(oi_dtype_t t)
{
    switch (t) {
    case OI_TYPE_BOOL: return 1;
    case OI_TYPE_INT8:
    case OI_TYPE_INT16:
    case OI_TYPE_INT32: return 2;
    case OI_TYPE_INT64: return 3;
    case OI_TYPE_UINT8:
    case OI_TYPE_UINT16:
    case OI_TYPE_UINT32: return 4;
    case OI_TYPE_UINT64: return 5;
    case OI_TYPE_FP32: return 6;
    case OI_TYPE_FP64: return 7;
    case OI_TYPE_BYTES: return 8;
    default: return 0;
    }
}

static const char *const contents_names[9] = {
    "", "bool_contents", "int_contents", "int64_contents", "uint_contents",
    "uint64_contents", "fp32_contents", "fp64_contents", "bytes_contents",
};

/* Stores one element; -1 when the value does not fit the datatype. */
static int put_int(oi_dtype_t t, char *dst, uint64_t raw)
{
    int64_t s = (int64_t)raw;
    switch (t) {
    case OI_TYPE_BOOL: *dst = raw != 0; return 0;
    case OI_TYPE_INT8: if (s < INT8_MIN || s > INT8_MAX) return -1; *(int8_t *)dst = (int8_t)s; return 0;
    case OI_TYPE_INT16: {
        if (s < INT16_MIN || s > INT16_MAX)
            return -1;
        int16_t v = (int16_t)s;
        memcpy(dst, &v, 2);
        return 0;
    }
    case OI_TYPE_INT32: {
        if (s < INT32_MIN || s > INT32_MAX)
            return -1;
        int32_t v = (int32_t)s;
        memcpy(dst, &v, 4);
        return 0;
    }
    case OI_TYPE_UINT8: if (raw > UINT8_MAX) return -1; *(uint8_t *)dst = (uint8_t)raw; return 0;
    case OI_TYPE_UINT16: {
        if (raw > UINT16_MAX)
            return -1;
        uint16_t v = (uint16_t)raw;
        memcpy(dst, &v, 2);
        return 0;
    }
    case OI_TYPE_UINT32: {
        if (raw > UINT32_MAX)
            return -1;
        uint32_t v = (uint32_t)raw;
        memcpy(dst, &v, 4);
        return 0;
    }
    default: /* INT64, UINT64 */
        memcpy(dst, &raw, 8);
        return 0;
    }
}

/* Packs the typed contents of input `t` (`label` names it) into a new buffer. Two passes:
 * count the elements (and check every field), then fill an exactly sized buffer. */
static oi_status_t *decode_contents(oi_tensor_t *t, oi_slice_t contents, const char *label)
{
    uint32_t want = contents_field(t->dtype);
    size_t esize = oi_dtype_size(t->dtype);
    int fixed = t->dtype == OI_TYPE_FP32 || t->dtype == OI_TYPE_FP64;
    int want_wt = t->dtype == OI_TYPE_BYTES ? WT_LEN : fixed ? (esize == 4 ? WT_I32 : WT_I64) : WT_VARINT;
    uint64_t count = 0, bytes = 0;
    field_t f;
    int rc;
    char what[300];
    for (int pass = 0; pass < 2; pass++) {
        rd_t r = {(const uint8_t *)contents.ptr, (const uint8_t *)contents.ptr + contents.len};
        char *out = t->data;
        while (r.p < r.end) {
            if ((rc = rd_field(&r, &f)) != RD_OK)
                return bad("%s contents: %s", label, rd_reason(rc));
            if (f.num < 1 || f.num > 8)
                continue; /* unknown field: skipped, as protobuf does */
            snprintf(what, sizeof(what), "%.250s contents.%s", label, contents_names[f.num]);
            if (f.num != want) {
                if (want == 0)
                    return bad("%s: datatype %s has no typed contents; send it in raw_input_contents", label,
                               oi_dtype_name(t->dtype));
                return bad("%s: datatype %s goes in contents.%s, got contents.%s", label, oi_dtype_name(t->dtype),
                           contents_names[want], contents_names[f.num]);
            }
            if (t->dtype == OI_TYPE_BYTES) {
                if (f.wt != WT_LEN)
                    return bad_wire(what, &f, WT_LEN);
                if (f.s.len > UINT32_MAX)
                    return bad("%s: element %" PRIu64 " is over 4 GiB", what, count);
                if (pass == 0) {
                    count++;
                    bytes += 4 + (uint64_t)f.s.len;
                } else {
                    uint32_t n = (uint32_t)f.s.len;
                    memcpy(out, &n, 4);
                    if (n > 0)
                        memcpy(out + 4, f.s.ptr, n);
                    out += 4 + n;
                }
                continue;
            }
            if (f.wt == want_wt) { /* one unpacked element */
                if (pass == 0)
                    count++;
                else if (fixed) {
                    if (esize == 4) {
                        uint32_t v32 = (uint32_t)f.v;
                        memcpy(out, &v32, 4);
                    } else
                        memcpy(out, &f.v, 8);
                    out += esize;
                } else {
                    if (put_int(t->dtype, out, f.v) != 0)
                        return bad("%s: value %" PRId64 " does not fit %s", what, (int64_t)f.v,
                                   oi_dtype_name(t->dtype));
                    out += esize;
                }
                continue;
            }
            if (f.wt != WT_LEN)
                return bad_wire(what, &f, want_wt);
            /* Packed elements. */
            if (fixed) {
                if (f.s.len % esize != 0)
                    return bad("%s: packed length %zu is not a multiple of %zu", what, f.s.len, esize);
                if (pass == 0)
                    count += f.s.len / esize;
                else if (f.s.len > 0) {
                    memcpy(out, f.s.ptr, f.s.len);
                    out += f.s.len;
                }
                continue;
            }
            rd_t pr = {(const uint8_t *)f.s.ptr, (const uint8_t *)f.s.ptr + f.s.len};
            while (pr.p < pr.end) {
                uint64_t v;
                if (rd_varint(&pr, &v) != RD_OK)
                    return bad("%s: malformed varint in packed element %" PRIu64, what, count);
                if (pass == 0)
                    count++;
                else {
                    if (put_int(t->dtype, out, v) != 0)
                        return bad("%s: value %" PRId64 " does not fit %s", what, (int64_t)v,
                                   oi_dtype_name(t->dtype));
                    out += esize;
                }
            }
        }
        if (pass == 0) {
            int64_t expect;
            char shp[24 * OI_MAX_DIMS];
            if (oi_shape_elements(t->shape, t->ndim, &expect) != 0)
                return uncountable(t, label);
            if ((uint64_t)expect != count)
                return bad("%s: shape %s needs %" PRId64 " elements, contents.%s has %" PRIu64, label,
                           oi_shape_format(t->shape, t->ndim, shp, sizeof(shp)), expect,
                           want ? contents_names[want] : "(none)", count);
            if (t->dtype != OI_TYPE_BYTES)
                bytes = count * esize; /* count fits the message, so no overflow */
            t->owner = oi_buf_new((size_t)bytes);
            if (t->owner == NULL)
                return oom();
            t->owner->len = (size_t)bytes;
            t->data = t->owner->data;
            t->byte_size = (size_t)bytes;
        }
    }
    return NULL;
}

/* ---- messages ------------------------------------------------------------------------------ */

/* "ModelInferRequest.inputs[2]": the path of tensor `i` in error messages, written into `buf`. */
static const char *tensor_path(const dec_t *d, uint32_t i, char *buf, size_t n)
{
    snprintf(buf, n, "%s.%s[%u]", d->msg_name, d->tensors_name, i);
    return buf;
}

/* InferInputTensor (or a response's InferOutputTensor, the same fields) `i` into req->inputs[i]
 * (data left for later). */
static oi_status_t *decode_input(dec_t *d, uint32_t i, oi_slice_t *contents)
{
    oi_tensor_t *t = &d->req->inputs[i];
    char what[80]; /* formatted only for an error message: WHAT */
#define WHAT tensor_path(d, i, what, sizeof(what))
    rd_t r = {(const uint8_t *)d->inputs.v[i].ptr, (const uint8_t *)d->inputs.v[i].ptr + d->inputs.v[i].len};
    oi_slice_t name = {NULL, 0}, dtype = {"", 0};
    slices_t params = {0};
    oi_status_t *st = NULL;
    field_t f;
    int rc;
    contents->ptr = NULL;
    contents->len = 0;
    while (st == NULL && r.p < r.end) {
        if ((rc = rd_field(&r, &f)) != RD_OK) {
            st = bad("%s: %s", WHAT, rd_reason(rc));
            break;
        }
        switch (f.num) {
        case 1:
        case 2:
        case 4:
        case 5:
            if (f.wt != WT_LEN) {
                char path[100];
                static const char *const names[] = {"", "name", "datatype", "", "parameters", "contents"};
                snprintf(path, sizeof(path), "%s.%s", WHAT, names[f.num]);
                st = bad_wire(path, &f, WT_LEN);
            } else if (f.num == 1 && f.s.len > OI_MAX_NAME_BYTES) { /* names go back in error messages */
                st = bad("%s.name: %zu bytes; at most %d are accepted", WHAT, f.s.len, OI_MAX_NAME_BYTES);
            } else if (f.num == 1)
                name = f.s;
            else if (f.num == 2)
                dtype = f.s;
            else if (f.num == 4) {
                if (slices_push(&params, f.s) != 0)
                    st = oom();
            } else
                *contents = f.s;
            break;
        case 3: /* shape: packed, or one varint per dimension */
            if (f.wt == WT_VARINT) {
                if (t->ndim >= OI_MAX_DIMS)
                    st = bad("%s.shape: more than %d dimensions", WHAT, OI_MAX_DIMS);
                else
                    t->shape[t->ndim++] = (int64_t)f.v;
            } else if (f.wt == WT_LEN) {
                rd_t pr = {(const uint8_t *)f.s.ptr, (const uint8_t *)f.s.ptr + f.s.len};
                while (st == NULL && pr.p < pr.end) {
                    uint64_t v;
                    if (rd_varint(&pr, &v) != RD_OK)
                        st = bad("%s.shape: malformed varint", WHAT);
                    else if (t->ndim >= OI_MAX_DIMS)
                        st = bad("%s.shape: more than %d dimensions", WHAT, OI_MAX_DIMS);
                    else
                        t->shape[t->ndim++] = (int64_t)v;
                }
            } else {
                char path[100];
                snprintf(path, sizeof(path), "%s.shape", WHAT);
                st = bad_wire(path, &f, WT_LEN);
            }
            break;
        default:
            break;
        }
    }
    if (st == NULL && name.ptr == NULL)
        st = bad("%s.name is missing", WHAT);
    if (st == NULL && (d->in_name_off[i] = aux_str(d, name)) == (size_t)-1)
        st = oom();
    if (st == NULL) {
        t->dtype = oi_dtype_from_name(dtype.ptr, dtype.len);
        if (t->dtype == OI_TYPE_INVALID)
            st = bad("%s ('%.*s').datatype: unknown datatype '%.*s'", WHAT,
                     (int)(name.len > 64 ? 64 : name.len), name.ptr, (int)(dtype.len > 32 ? 32 : dtype.len),
                     dtype.ptr);
    }
    if (st == NULL && params.n > 0) {
        char path[100];
        snprintf(path, sizeof(path), "%s.parameters", WHAT);
        st = render_params(d, params.v, params.n, path, &d->in_params_off[i], &d->in_params_len[i], &t->shm);
    }
    free(params.v);
    return st;
#undef WHAT
}

/* ModelInferRequest.InferRequestedOutputTensor `i` into req->outputs[i]. */
static oi_status_t *decode_output(dec_t *d, uint32_t i)
{
    oi_output_request_t *o = &d->req->outputs[i];
    char what[64]; /* formatted only for an error message: WHAT */
#define WHAT (snprintf(what, sizeof(what), "ModelInferRequest.outputs[%u]", i), what)
    rd_t r = {(const uint8_t *)d->outputs.v[i].ptr, (const uint8_t *)d->outputs.v[i].ptr + d->outputs.v[i].len};
    oi_slice_t name = {NULL, 0};
    slices_t params = {0};
    oi_status_t *st = NULL;
    field_t f;
    int rc;
    o->binary_data = -1;
    while (st == NULL && r.p < r.end) {
        if ((rc = rd_field(&r, &f)) != RD_OK)
            st = bad("%s: %s", WHAT, rd_reason(rc));
        else if ((f.num == 1 || f.num == 2) && f.wt != WT_LEN)
            st = bad_wire(WHAT, &f, WT_LEN);
        else if (f.num == 1 && f.s.len > OI_MAX_NAME_BYTES)
            st = bad("%s.name: %zu bytes; at most %d are accepted", WHAT, f.s.len, OI_MAX_NAME_BYTES);
        else if (f.num == 1)
            name = f.s;
        else if (f.num == 2 && slices_push(&params, f.s) != 0)
            st = oom();
    }
    if (st == NULL && name.ptr == NULL)
        st = bad("%s.name is missing", WHAT);
    if (st == NULL && (d->out_name_off[i] = aux_str(d, name)) == (size_t)-1)
        st = oom();
    if (st == NULL && params.n > 0) {
        char path[100];
        snprintf(path, sizeof(path), "%s.parameters", WHAT);
        st = render_params(d, params.v, params.n, path, &d->out_params_off[i], &d->out_params_len[i], NULL);
    }
    free(params.v);
    return st;
#undef WHAT
}

/* The top-level fields, recorded as slices for the passes that follow. A request's fields 1-7
 * are model_name, model_version, id, parameters, inputs, outputs and raw_input_contents; a
 * response has the same first four, then outputs (tensors with the fields of an input) and
 * raw_output_contents. */
static oi_status_t *scan_top(dec_t *d)
{
    rd_t r = {(const uint8_t *)d->region.ptr, (const uint8_t *)d->region.ptr + d->region.len};
    static const char *const names[2][8] = {
        {"", "model_name", "model_version", "id", "parameters", "inputs", "outputs", "raw_input_contents"},
        {"", "model_name", "model_version", "id", "parameters", "outputs", "raw_output_contents", ""},
    };
    int last = d->response ? 6 : 7;
    field_t f;
    int rc;
    while (r.p < r.end) {
        if ((rc = rd_field(&r, &f)) != RD_OK)
            return bad("%s: %s at byte %zu", d->msg_name, rd_reason(rc),
                       (size_t)(r.p - (const uint8_t *)d->region.ptr));
        if (f.num < 1 || (int)f.num > last)
            continue;
        if (f.wt != WT_LEN) {
            char path[64];
            snprintf(path, sizeof(path), "%s.%s", d->msg_name, names[d->response][f.num]);
            return bad_wire(path, &f, WT_LEN);
        }
        int rc2 = 0;
        switch (f.num) {
        case 1: d->model_name = f.s; break;
        case 2: d->model_version = f.s; break;
        case 3:
            if (f.s.len > OI_MAX_ID_BYTES) /* the id goes back with the answer: keep it small */
                return bad("%s.id: %zu bytes; at most %d are accepted", d->msg_name, f.s.len, OI_MAX_ID_BYTES);
            d->id = f.s;
            d->have_id = 1;
            break;
        case 4: rc2 = slices_push(&d->params, f.s); break;
        case 5: rc2 = slices_push(&d->inputs, f.s); break;
        case 6: rc2 = slices_push(d->response ? &d->raw : &d->outputs, f.s); break;
        case 7: rc2 = slices_push(&d->raw, f.s); break;
        }
        if (rc2 != 0)
            return oom();
    }
    return NULL;
}

/* Gives every tensor its data: raw contents in place, or typed contents packed. Request
 * inputs in shared memory have none here, and raw_input_contents lists only the others, in
 * order (as tritonclient sends them and Triton reads them); a response keeps one raw entry,
 * empty, for each output in shared memory (as Triton sends it). */
static oi_status_t *attach_data(dec_t *d, const oi_slice_t *contents)
{
    oi_request_t *req = d->req;
    uint32_t skipped = 0, k = 0;
    for (uint32_t i = 0; i < req->n_inputs && !d->response; i++)
        skipped += req->inputs[i].shm;
    if (d->raw.n > 0 && d->raw.n != req->n_inputs - skipped) {
        if (skipped == 0)
            return bad("%s.%s has %u entries for %u %s; expected one per %s", d->msg_name, d->raw_name, d->raw.n,
                       req->n_inputs, d->tensors_name, d->kind);
        return bad("%s.%s has %u entries for %u %s, %u of them in shared memory; expected one per %s not in "
                   "shared memory",
                   d->msg_name, d->raw_name, d->raw.n, req->n_inputs, d->tensors_name, skipped, d->kind);
    }
    for (uint32_t i = 0; i < req->n_inputs; i++) {
        oi_tensor_t *t = &req->inputs[i];
        char label[300]; /* formatted where an error message or typed contents need it */
#define LABEL (snprintf(label, sizeof(label), "%s '%.200s'", d->kind, t->name), label)
        oi_status_t *st;
        if (t->shm) {
            if (contents[i].len > 0)
                return bad("%s has both contents and parameters.shared_memory_region; give one", LABEL);
            if (d->response && d->raw.n > 0)
                k++; /* its entry is there, empty */
        } else if (d->raw.n > 0) {
            if (contents[i].len > 0)
                return bad("%s has both contents and %s; give one", LABEL, d->raw_name);
            t->data = (char *)d->raw.v[k].ptr;
            t->byte_size = d->raw.v[k].len;
            k++;
            t->owner = oi_buf_ref(d->msg);
            if ((st = (d->response ? oi_tensor_check_size : oi_tensor_check_input)(t, d->kind, t->name)) != NULL)
                return st;
        } else if (contents[i].len > 0) {
            if ((st = decode_contents(t, contents[i], LABEL)) != NULL)
                return st;
        } else {
            int64_t n;
            if (oi_shape_elements(t->shape, t->ndim, &n) != 0)
                return uncountable(t, LABEL);
            if (n != 0)
                return bad("%s has no data; expected contents or %s", LABEL, d->raw_name);
        }
#undef LABEL
    }
    return NULL;
}

static oi_status_t *decode(dec_t *d, oi_slice_t *model_name, oi_slice_t *model_version)
{
    oi_request_t *req = d->req;
    oi_status_t *st = scan_top(d);
    if (st != NULL)
        return st;
    if (d->model_name.len == 0 && !d->response)
        return bad("ModelInferRequest.model_name is empty; expected the name of a model");
    if ((d->name_off = aux_str(d, d->model_name)) == (size_t)-1 ||
        (d->version_off = aux_str(d, d->model_version)) == (size_t)-1 ||
        (d->have_id && (d->id_off = aux_str(d, d->id)) == (size_t)-1) ||
        (d->have_error && (d->error_off = aux_str(d, d->error_message)) == (size_t)-1))
        return oom();
    if (d->params.n > 0) {
        char params_path[64];
        snprintf(params_path, sizeof(params_path), "%s.parameters", d->msg_name);
        if ((st = render_params(d, d->params.v, d->params.n, params_path, &d->params_off, &d->params_len, NULL)) != NULL)
            return st;
        if (!d->response && (st = request_params(d, d->params.v, d->params.n, req)) != NULL)
            return st;
    }

    uint32_t ni = d->inputs.n, no = d->outputs.n;
    size_t nslots = (size_t)ni * 3 + (size_t)no * 3 + 1;
    size_t *offs = calloc(nslots, sizeof(size_t));
    oi_slice_t *contents = calloc(ni ? ni : 1, sizeof(oi_slice_t));
    req->inputs = calloc(ni ? ni : 1, sizeof(oi_tensor_t));
    req->outputs = no ? calloc(no, sizeof(oi_output_request_t)) : NULL;
    if (offs == NULL || contents == NULL || req->inputs == NULL || (no && req->outputs == NULL)) {
        free(offs);
        free(contents);
        return oom();
    }
    d->in_name_off = offs;
    d->in_params_off = offs + ni;
    d->in_params_len = offs + 2 * (size_t)ni;
    d->out_name_off = offs + 3 * (size_t)ni;
    d->out_params_off = d->out_name_off + no;
    d->out_params_len = d->out_params_off + no;

    /* Inputs first without names (aux still moves), then outputs; names are set once aux is
     * final. Data is attached after that, so that error messages can name the inputs. */
    for (uint32_t i = 0; st == NULL && i < ni; i++) {
        req->n_inputs = i + 1;
        st = decode_input(d, i, &contents[i]);
    }
    for (uint32_t i = 0; st == NULL && i < no; i++) {
        req->n_outputs = i + 1;
        st = decode_output(d, i);
    }
    if (st == NULL) {
        req->aux = oi_sbuf_detach(&d->aux);
        if (req->aux == NULL)
            st = oom();
    }
    if (st == NULL) {
        char *base = req->aux->data;
        *model_name = (oi_slice_t){base + d->name_off, d->model_name.len};
        *model_version = (oi_slice_t){base + d->version_off, d->model_version.len};
        if (d->have_id) {
            req->id = base + d->id_off;
            req->id_len = d->id.len;
        }
        if (d->params.n > 0)
            req->parameters = (oi_slice_t){base + d->params_off, d->params_len};
        if (d->have_seq_str) {
            req->seq.id_str = base + d->seq_id_off;
            req->seq.id_str_len = d->seq_id_len;
        }
        if (d->have_error)
            d->error_message = (oi_slice_t){base + d->error_off, d->error_message.len};
        for (uint32_t i = 0; i < ni; i++) {
            req->inputs[i].name = base + d->in_name_off[i];
            if (d->in_params_len[i] > 0)
                req->inputs[i].parameters = (oi_slice_t){base + d->in_params_off[i], d->in_params_len[i]};
        }
        for (uint32_t i = 0; i < no; i++) {
            req->outputs[i].name = base + d->out_name_off[i];
            if (d->out_params_len[i] > 0)
                req->outputs[i].parameters = (oi_slice_t){base + d->out_params_off[i], d->out_params_len[i]};
        }
        st = attach_data(d, contents);
    }
    if (st == NULL)
        st = oi_request_check_unique(req, d->kind); /* the check the JSON codec makes too */
    free(offs);
    free(contents);
    return st;
}

/* Frees what decoding borrowed and, on failure, clears the half-decoded request. */
static oi_status_t *decode_done(dec_t *d, oi_status_t *st)
{
    oi_sbuf_free(&d->aux);
    free(d->params.v);
    free(d->inputs.v);
    free(d->outputs.v);
    free(d->raw.v);
    if (st != NULL)
        oi_request_clear(d->req); /* tensors were zeroed by calloc: clearing is safe */
    return st;
}

oi_status_t *oi_pb_decode_infer_request(oi_buf_t *msg, oi_request_t *req, oi_slice_t *model_name,
                                        oi_slice_t *model_version)
{
    dec_t d = {.msg = msg, .req = req, .region = {msg->data, msg->len}, .msg_name = "ModelInferRequest",
               .tensors_name = "inputs", .raw_name = "raw_input_contents", .kind = "input"};
    req->body = oi_buf_ref(msg);
    oi_status_t *st = decode_done(&d, decode(&d, model_name, model_version));
    if (st != NULL) {
        *model_name = (oi_slice_t){NULL, 0};
        *model_version = (oi_slice_t){NULL, 0};
    }
    return st;
}

oi_status_t *oi_pb_decode_infer_response(oi_buf_t *msg, int stream, oi_pb_response_t *resp)
{
    memset(resp, 0, sizeof(*resp));
    resp->result.binary_data_output = -1;
    dec_t d = {.msg = msg, .req = &resp->result, .region = {msg->data, msg->len}, .response = 1,
               .msg_name = "ModelInferResponse", .tensors_name = "outputs", .raw_name = "raw_output_contents",
               .kind = "output"};
    resp->result.body = oi_buf_ref(msg);
    if (stream) {
        /* ModelStreamInferResponse: error_message = 1, infer_response = 2 (the last of each
         * wins, as protobuf has it). Without an infer_response the region stays empty. */
        rd_t r = {(const uint8_t *)msg->data, (const uint8_t *)msg->data + msg->len};
        field_t f;
        int rc;
        d.region = (oi_slice_t){msg->data, 0};
        while (r.p < r.end) {
            if ((rc = rd_field(&r, &f)) != RD_OK)
                return decode_done(&d, bad("ModelStreamInferResponse: %s at byte %zu", rd_reason(rc),
                                           (size_t)(r.p - (const uint8_t *)msg->data)));
            if ((f.num == 1 || f.num == 2) && f.wt != WT_LEN)
                return decode_done(&d, bad_wire(f.num == 1 ? "ModelStreamInferResponse.error_message"
                                                           : "ModelStreamInferResponse.infer_response",
                                                &f, WT_LEN));
            if (f.num == 1) {
                d.error_message = f.s;
                d.have_error = f.s.len > 0;
            } else if (f.num == 2) {
                d.region = f.s;
            }
        }
    }
    oi_status_t *st = decode_done(&d, decode(&d, &resp->model_name, &resp->model_version));
    if (st != NULL) {
        memset(resp, 0, sizeof(*resp));
        return st;
    }
    if (d.have_error)
        resp->error_message = d.error_message;
    return NULL;
}

int oi_pb_peek_request_id(const char *data, size_t len, oi_slice_t *id)
{
    rd_t r = {(const uint8_t *)data, (const uint8_t *)data + len};
    field_t f;
    int found = -1;
    while (r.p < r.end && rd_field(&r, &f) == RD_OK)
        if (f.num == 3 && f.wt == WT_LEN) {
            *id = f.s;
            found = f.s.len <= OI_MAX_ID_BYTES ? 0 : -1; /* too long to send back */
        }
    return found;
}

/* ---- writing ------------------------------------------------------------------------------- */

static size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* Appends a key and varint value; the caller reserved room. */
static void w_varint(oi_sbuf_t *o, uint64_t v) { o->len += put_varint((uint8_t *)o->data + o->len, v); }

static void w_bytes_field(oi_sbuf_t *o, uint32_t num, const char *s, size_t n)
{
    w_varint(o, (uint64_t)num << 3 | WT_LEN);
    w_varint(o, n);
    memcpy(o->data + o->len, s, n);
    o->len += n;
}

/* Bytes a length-delimited field of `n` bytes takes with a one-byte key. */
static size_t ld_size(size_t n) { return 1 + varint_size(n) + n; }

static size_t shape_size(const oi_tensor_t *t)
{
    size_t n = 0;
    for (int k = 0; k < t->ndim; k++)
        n += varint_size((uint64_t)t->shape[k]);
    return n;
}

/* The bytes of an output that travel in raw_output_contents: none for one written into shared
 * memory, whose entry stays (empty) so that entries keep matching outputs by position. */
static size_t raw_size(const oi_tensor_t *t) { return t->shm ? 0 : t->byte_size; }

/* Cuts the encoded message header `hb` into runs around the tensors' raw bytes, which go out
 * from their own memory: header run, tensor bytes, header run, ... key_off[i] is where
 * tensor i's raw-contents field starts in `hb`. Tensors without raw bytes (empty, or in
 * shared memory when `skip_shm`) stay in the header run. Takes references for every part
 * and drops the caller's on `hb`; returns the number of parts (at most 2n + 1). */
static size_t interleave(oi_buf_t *hb, const size_t *key_off, const oi_tensor_t *ts, uint32_t count, int skip_shm,
                         oi_pb_iov_t *parts)
{
    size_t n = 0, run_start = 0;
    for (uint32_t i = 0; i < count; i++) {
        const oi_tensor_t *t = &ts[i];
        if ((skip_shm ? raw_size(t) : t->byte_size) == 0)
            continue;
        size_t run_end = i + 1 < count ? key_off[i + 1] : hb->len;
        parts[n++] = (oi_pb_iov_t){hb->data + run_start, run_end - run_start, oi_buf_ref(hb)};
        parts[n++] = (oi_pb_iov_t){t->data, t->byte_size, t->owner ? oi_buf_ref(t->owner) : NULL};
        run_start = run_end;
    }
    if (run_start < hb->len)
        parts[n++] = (oi_pb_iov_t){hb->data + run_start, hb->len - run_start, oi_buf_ref(hb)};
    oi_buf_unref(hb);
    return n;
}

/* An output in shared memory: name, datatype and shape, and an empty raw_output_contents
 * entry (tritonclient reads them by position), with no `parameters`, as tritonserver sends. */
static size_t output_tensor_size(const oi_tensor_t *t)
{
    size_t s = ld_size(strlen(t->name)) + ld_size(strlen(oi_dtype_name(t->dtype)));
    if (t->ndim > 0)
        s += ld_size(shape_size(t));
    return s;
}

/* Bytes of an InferParameter message holding `p`'s value. */
static size_t param_value_size(const oi_pb_param_t *p)
{
    switch (p->type) {
    case OI_PB_PARAM_BOOL: return 2;
    case OI_PB_PARAM_INT64: return 1 + varint_size((uint64_t)p->i);
    case OI_PB_PARAM_UINT64: return 1 + varint_size(p->u);
    case OI_PB_PARAM_DOUBLE: return 9;
    default: return ld_size(p->s_len);
    }
}

/* Bytes of a map entry {1: key, 2: InferParameter}. */
static size_t param_entry_size(const oi_pb_param_t *p)
{
    return ld_size(strlen(p->key)) + ld_size(param_value_size(p));
}

static void w_param_entry(oi_sbuf_t *o, uint32_t num, const oi_pb_param_t *p)
{
    w_varint(o, (uint64_t)num << 3 | WT_LEN);
    w_varint(o, param_entry_size(p));
    w_bytes_field(o, 1, p->key, strlen(p->key));
    w_varint(o, 2 << 3 | WT_LEN);
    w_varint(o, param_value_size(p));
    switch (p->type) {
    case OI_PB_PARAM_BOOL:
        w_varint(o, 1 << 3 | WT_VARINT);
        w_varint(o, p->b != 0);
        break;
    case OI_PB_PARAM_INT64:
        w_varint(o, 2 << 3 | WT_VARINT);
        w_varint(o, (uint64_t)p->i); /* int64: two's complement, ten bytes when negative */
        break;
    case OI_PB_PARAM_UINT64:
        w_varint(o, 5 << 3 | WT_VARINT);
        w_varint(o, p->u);
        break;
    case OI_PB_PARAM_DOUBLE:
        w_varint(o, 4 << 3 | WT_I64);
        memcpy(o->data + o->len, &p->d, 8);
        o->len += 8;
        break;
    default:
        w_bytes_field(o, 3, p->s, p->s_len);
        break;
    }
}

/* A response's parameters (oi_response_t.parameters, the backend's JSON object of booleans,
 * int64 integers and strings) as InferParameter map entries: bool_param, int64_param and
 * string_param, as Triton's gRPC frontend types them. Keys and strings are decoded into
 * `text`, which the entries point into. */
typedef struct resp_params_s {
    oi_pb_param_t *v;
    uint32_t n, cap;
    oi_sbuf_t text;
    int bad; /* a value of another kind, or out of memory */
} resp_params_t;

/* The value's decoded text appended to rp->text and NUL-terminated; its offset, or -1. */
static int64_t keep_text(resp_params_t *rp, const char *s, size_t n, int escaped)
{
    size_t off = rp->text.len;
    if (oi_sbuf_reserve(&rp->text, n + 1) != 0)
        return -1;
    size_t len = escaped ? oi__json_unescape(rp->text.data + off, s, n) : (memcpy(rp->text.data + off, s, n), n);
    rp->text.data[off + len] = '\0';
    rp->text.len = off + len + 1;
    return (int64_t)off;
}

/* The value's kind and value in *p (its string's offset in rp->text in *str_off); -1 for a
 * value of another kind (or an integer past int64), or out of memory. */
static int read_value(resp_params_t *rp, oi_slice_t value, oi_pb_param_t *p, int64_t *str_off)
{
    if (value.len >= 2 && value.ptr[0] == '"') {
        p->type = OI_PB_PARAM_STRING;
        if ((*str_off = keep_text(rp, value.ptr + 1, value.len - 2, 1)) < 0)
            return -1;
        p->s_len = strlen(rp->text.data + *str_off); /* JSON text holds no NUL: \u0000 is refused */
        return 0;
    }
    int is_true = value.len == 4 && memcmp(value.ptr, "true", 4) == 0;
    if (is_true || (value.len == 5 && memcmp(value.ptr, "false", 5) == 0)) {
        p->type = OI_PB_PARAM_BOOL, p->b = is_true;
        return 0;
    }
    char num[24], *end;
    if (value.len == 0 || value.len >= sizeof(num))
        return -1;
    memcpy(num, value.ptr, value.len);
    num[value.len] = '\0';
    errno = 0;
    p->type = OI_PB_PARAM_INT64, p->i = strtoll(num, &end, 10);
    return end == num + value.len && errno == 0 ? 0 : -1;
}

static void take_param(void *ctx, const char *key, size_t key_len, oi_slice_t value)
{
    resp_params_t *rp = ctx;
    if (rp->bad)
        return;
    if (rp->n == rp->cap) {
        oi_pb_param_t *v = realloc(rp->v, (rp->cap ? 2 * rp->cap : 8) * sizeof(*v));
        if ((rp->bad = v == NULL))
            return;
        rp->v = v, rp->cap = rp->cap ? 2 * rp->cap : 8;
    }
    oi_pb_param_t *p = memset(&rp->v[rp->n], 0, sizeof(*p));
    /* The reader decodes keys up to short_str_t's buffer; a longer one with escapes comes raw. */
    int raw_escaped = key_len > sizeof(((short_str_t *)NULL)->buf) && memchr(key, '\\', key_len) != NULL;
    int64_t key_off = keep_text(rp, key, key_len, raw_escaped), str_off = 0;
    if ((rp->bad = key_off < 0 || read_value(rp, value, p, &str_off) != 0))
        return;
    p->key = (const char *)(uintptr_t)key_off; /* offsets until read_resp_params rebases them */
    p->s = (const char *)(uintptr_t)str_off;
    rp->n++;
}

/* Reads resp->parameters into rp (zeroed); NULL, or a 500 naming what is wrong. Free rp with
 * free_resp_params either way. *size: the bytes of their map entries (field 4). */
static oi_status_t *read_resp_params(const oi_response_t *resp, resp_params_t *rp, size_t *size)
{
    *size = 0;
    if (resp->parameters == NULL)
        return NULL;
    oi_slice_t text = {resp->parameters->data, resp->parameters->len};
    if (oi_json_params_each(text, (const char *const[]){NULL}, take_param, rp) != 0 || rp->bad)
        return oi_status_new(OI_INTERNAL, "the model's response parameters must be bool, int64 or string values");
    for (uint32_t i = 0; i < rp->n; i++) {
        rp->v[i].key = rp->text.data + (uintptr_t)rp->v[i].key;
        rp->v[i].s = rp->text.data + (uintptr_t)rp->v[i].s;
        *size += ld_size(param_entry_size(&rp->v[i]));
    }
    return NULL;
}

static void free_resp_params(resp_params_t *rp)
{
    free(rp->v);
    oi_sbuf_free(&rp->text);
}

/* ModelInferResponse.parameters {"triton_final_response": bool_param}: field 4, one map
 * entry (key, then an InferParameter whose bool_param is the last byte). */
#define FINAL_KEY "triton_final_response"
#define FINAL_PARAM_LEN (2 + 2 + (sizeof(FINAL_KEY) - 1) + 4)

static void w_final_param(oi_sbuf_t *o, int final)
{
    w_varint(o, 4 << 3 | WT_LEN);
    w_varint(o, FINAL_PARAM_LEN - 2);
    w_bytes_field(o, 1, FINAL_KEY, sizeof(FINAL_KEY) - 1);
    static const char value[2][4] = {{2 << 3 | WT_LEN, 2, 1 << 3, 0}, {2 << 3 | WT_LEN, 2, 1 << 3, 1}};
    oi_sbuf_append(o, value[final != 0], 4); /* reserved by the caller */
}

oi_status_t *oi_pb_encode_infer_response(const char *model_name, const char *model_version,
                                         const oi_request_t *req, const oi_response_t *resp, int stream,
                                         oi_pb_iov_t *parts, size_t *nparts, size_t *total)
{
    /* Sizes first: the header of the message, then its total length. */
    size_t name_len = strlen(model_name), ver_len = model_version ? strlen(model_version) : 0;
    int with_id = req != NULL && req->id != NULL;
    size_t head = ld_size(name_len) + (model_version ? ld_size(ver_len) : 0) + (with_id ? ld_size(req->id_len) : 0);
    if (stream)
        head += FINAL_PARAM_LEN;
    resp_params_t rp = {0};
    size_t params_size;
    oi_status_t *st = read_resp_params(resp, &rp, &params_size);
    if (st != NULL) {
        free_resp_params(&rp);
        return st;
    }
    head += params_size;
    uint64_t body = 0;
    for (uint32_t i = 0; i < resp->n_outputs; i++) {
        const oi_tensor_t *t = &resp->outputs[i];
        head += ld_size(output_tensor_size(t));
        head += 1 + varint_size(raw_size(t));
        body += raw_size(t);
    }
    uint64_t inner = head + body;
    uint64_t len = stream ? 1 + varint_size(inner) + inner : inner;
    oi_sbuf_t o = {0};
    if (len > UINT32_MAX)
        st = oi_status_new(OI_INTERNAL, "response of %" PRIu64 " bytes is over gRPC's 4 GiB message limit", len);
    else if (oi_sbuf_reserve(&o, head + 16) != 0)
        st = oi_status_new(OI_INTERNAL, "out of memory");
    if (st != NULL) {
        free_resp_params(&rp);
        return st;
    }
    if (stream) {
        w_varint(&o, 2 << 3 | WT_LEN);
        w_varint(&o, inner);
    }
    w_bytes_field(&o, 1, model_name, name_len);
    if (model_version)
        w_bytes_field(&o, 2, model_version, ver_len);
    if (with_id)
        w_bytes_field(&o, 3, req->id, req->id_len);
    for (uint32_t i = 0; i < rp.n; i++)
        w_param_entry(&o, 4, &rp.v[i]);
    free_resp_params(&rp);
    if (stream)
        w_final_param(&o, stream == OI_PB_STREAM_FINAL);
    for (uint32_t i = 0; i < resp->n_outputs; i++) {
        const oi_tensor_t *t = &resp->outputs[i];
        w_varint(&o, 5 << 3 | WT_LEN);
        w_varint(&o, output_tensor_size(t));
        const char *dt = oi_dtype_name(t->dtype);
        w_bytes_field(&o, 1, t->name, strlen(t->name));
        w_bytes_field(&o, 2, dt, strlen(dt));
        if (t->ndim > 0) {
            w_varint(&o, 3 << 3 | WT_LEN);
            w_varint(&o, shape_size(t));
            for (int k = 0; k < t->ndim; k++)
                w_varint(&o, (uint64_t)t->shape[k]);
        }
    }
    /* The raw_output_contents keys and lengths follow in the same buffer; the parts
     * interleave them with the outputs' own memory. */
    size_t key_small[64];
    size_t *key_off = resp->n_outputs <= 64 ? key_small : malloc(resp->n_outputs * sizeof(size_t));
    if (key_off == NULL) {
        oi_sbuf_free(&o);
        return oi_status_new(OI_INTERNAL, "out of memory");
    }
    for (uint32_t i = 0; i < resp->n_outputs; i++) {
        key_off[i] = o.len;
        w_varint(&o, 6 << 3 | WT_LEN);
        w_varint(&o, raw_size(&resp->outputs[i]));
    }
    oi_buf_t *hb = oi_sbuf_detach(&o);
    if (hb == NULL) {
        oi_sbuf_free(&o);
        if (key_off != key_small)
            free(key_off);
        return oi_status_new(OI_INTERNAL, "out of memory");
    }
    size_t n = interleave(hb, key_off, resp->outputs, resp->n_outputs, 1, parts);
    if (key_off != key_small)
        free(key_off);
    *nparts = n;
    *total = (size_t)len;
    return NULL;
}

int oi_pb_encode_stream_error(oi_sbuf_t *out, const char *error_message, const char *model_name,
                              const char *model_version, const char *id, size_t id_len)
{
    size_t start = out->len;
    size_t mlen = strlen(error_message);
    size_t nlen = model_name ? strlen(model_name) : 0, vlen = model_version ? strlen(model_version) : 0;
    if (id == NULL)
        id_len = 0;
    size_t inner =
        (nlen ? ld_size(nlen) : 0) + (vlen ? ld_size(vlen) : 0) + (id_len ? ld_size(id_len) : 0) + FINAL_PARAM_LEN;
    if (oi_sbuf_reserve(out, ld_size(mlen) + ld_size(inner)) != 0) {
        out->len = start;
        return -1;
    }
    w_bytes_field(out, 1, error_message, mlen);
    w_varint(out, 2 << 3 | WT_LEN);
    w_varint(out, inner);
    if (nlen)
        w_bytes_field(out, 1, model_name, nlen);
    if (vlen)
        w_bytes_field(out, 2, model_version, vlen);
    if (id_len)
        w_bytes_field(out, 3, id, id_len);
    w_final_param(out, 1);
    return 0;
}

/* ---- the client's side: requests out ------------------------------------------------------ */

/* Bytes of an InferInputTensor {name, datatype, shape} (no parameters, no typed contents). */
static size_t input_tensor_size(const oi_tensor_t *t) { return output_tensor_size(t); }

oi_status_t *oi_pb_encode_infer_request(const oi_pb_request_head_t *head, const oi_tensor_t *inputs,
                                        uint32_t n_inputs, oi_pb_iov_t *parts, size_t *nparts, size_t *total)
{
    size_t name_len = strlen(head->model_name);
    size_t ver_len = head->model_version ? strlen(head->model_version) : 0;
    size_t id_len = head->id ? strlen(head->id) : 0;
    /* Sizes first, so that the 5-byte prefix can be written before any byte goes out. */
    size_t hsize = ld_size(name_len) + (ver_len ? ld_size(ver_len) : 0) + (id_len ? ld_size(id_len) : 0);
    uint64_t body = 0;
    for (size_t i = 0; i < head->n_params; i++)
        hsize += ld_size(param_entry_size(&head->params[i]));
    for (uint32_t i = 0; i < n_inputs; i++) {
        hsize += ld_size(input_tensor_size(&inputs[i]));
        hsize += 1 + varint_size(inputs[i].byte_size);
        body += inputs[i].byte_size;
    }
    for (uint32_t i = 0; i < head->n_outputs; i++)
        hsize += ld_size(ld_size(strlen(head->outputs[i])));
    uint64_t len = hsize + body;
    if (len > UINT32_MAX)
        return oi_status_new(OI_BAD_REQUEST, "request of %" PRIu64 " bytes is over gRPC's 4 GiB message limit", len);

    oi_sbuf_t o = {0};
    if (oi_sbuf_reserve(&o, hsize) != 0)
        return oi_status_new(OI_INTERNAL, "out of memory");
    w_bytes_field(&o, 1, head->model_name, name_len);
    if (ver_len)
        w_bytes_field(&o, 2, head->model_version, ver_len);
    if (id_len)
        w_bytes_field(&o, 3, head->id, id_len);
    for (size_t i = 0; i < head->n_params; i++)
        w_param_entry(&o, 4, &head->params[i]);
    for (uint32_t i = 0; i < n_inputs; i++) {
        const oi_tensor_t *t = &inputs[i];
        const char *dt = oi_dtype_name(t->dtype);
        w_varint(&o, 5 << 3 | WT_LEN);
        w_varint(&o, input_tensor_size(t));
        w_bytes_field(&o, 1, t->name, strlen(t->name));
        w_bytes_field(&o, 2, dt, strlen(dt));
        if (t->ndim > 0) {
            w_varint(&o, 3 << 3 | WT_LEN);
            w_varint(&o, shape_size(t));
            for (int k = 0; k < t->ndim; k++)
                w_varint(&o, (uint64_t)t->shape[k]);
        }
    }
    for (uint32_t i = 0; i < head->n_outputs; i++) {
        size_t n = strlen(head->outputs[i]);
        w_varint(&o, 6 << 3 | WT_LEN);
        w_varint(&o, ld_size(n));
        w_bytes_field(&o, 1, head->outputs[i], n);
    }
    /* raw_input_contents, one per input (also empty ones: the server counts them), each a key
     * and length in the header buffer followed by the input's own memory. */
    size_t key_small[64] = {0}; /* zeroed: gcc cannot see interleave() reads only what was written */
    size_t *key_off = n_inputs <= 64 ? key_small : malloc(n_inputs * sizeof(size_t));
    if (key_off == NULL) {
        oi_sbuf_free(&o);
        return oi_status_new(OI_INTERNAL, "out of memory");
    }
    for (uint32_t i = 0; i < n_inputs; i++) {
        key_off[i] = o.len;
        w_varint(&o, 7 << 3 | WT_LEN);
        w_varint(&o, inputs[i].byte_size);
    }
    oi_buf_t *hb = oi_sbuf_detach(&o);
    if (hb == NULL) {
        oi_sbuf_free(&o);
        if (key_off != key_small)
            free(key_off);
        return oi_status_new(OI_INTERNAL, "out of memory");
    }
    size_t n = interleave(hb, key_off, inputs, n_inputs, 0, parts);
    if (key_off != key_small)
        free(key_off);
    *nparts = n;
    *total = (size_t)len;
    return NULL;
}
