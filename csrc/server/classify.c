#include "server/classify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

oi_labels_t *oi_labels_parse(const char *text, size_t len)
{
    uint32_t n = 0;
    for (size_t i = 0; i < len; i++)
        if (text[i] == '\n')
            n++;
    if (len > 0 && text[len - 1] != '\n')
        n++;
    /* One allocation: the struct, the line and length arrays, then the text with each '\n'
     * turned into a NUL. */
    size_t head = sizeof(oi_labels_t) + (size_t)n * (sizeof(char *) + sizeof(uint32_t));
    oi_labels_t *l = malloc(head + len + 1);
    if (l == NULL)
        return NULL;
    l->n = n;
    l->line = (const char **)(l + 1);
    l->len = (uint32_t *)(l->line + n);
    char *copy = (char *)l + head;
    memcpy(copy, text, len);
    copy[len] = '\0';
    size_t start = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t end = start;
        while (end < len && copy[end] != '\n')
            end++;
        copy[end] = '\0';
        l->line[i] = copy + start;
        l->len[i] = (uint32_t)(end - start);
        start = end + 1;
    }
    return l;
}

void oi_labels_free(oi_labels_t *l)
{
    free(l);
}

oi_status_t *oi_classify_check_dtype(oi_dtype_t dt, const char *name)
{
    switch (dt) {
    case OI_TYPE_UINT8:
    case OI_TYPE_UINT16:
    case OI_TYPE_UINT32:
    case OI_TYPE_UINT64:
    case OI_TYPE_INT8:
    case OI_TYPE_INT16:
    case OI_TYPE_INT32:
    case OI_TYPE_INT64:
    case OI_TYPE_FP32:
    case OI_TYPE_FP64: return NULL;
    default:
        return oi_status_new(OI_BAD_REQUEST,
                             "output '%s': class result not available for output due to unsupported type '%s'", name,
                             oi_dtype_name(dt));
    }
}

/* Whether element a ranks before element b: the higher score first, the lower index among
 * equal scores (what std::sort gives Triton on small rows; a stable order everywhere), NaN
 * last. A total order, so that the sort is well defined whatever the data. */
typedef int (*before_fn)(const void *base, uint32_t a, uint32_t b);

#define INT_BEFORE(NAME, T)                                                                                            \
    static int NAME(const void *base, uint32_t a, uint32_t b)                                                          \
    {                                                                                                                  \
        T va, vb;                                                                                                      \
        memcpy(&va, (const char *)base + (size_t)a * sizeof(T), sizeof(T));                                            \
        memcpy(&vb, (const char *)base + (size_t)b * sizeof(T), sizeof(T));                                            \
        return va > vb || (va == vb && a < b);                                                                         \
    }
#define FLOAT_BEFORE(NAME, T)                                                                                          \
    static int NAME(const void *base, uint32_t a, uint32_t b)                                                          \
    {                                                                                                                  \
        T va, vb;                                                                                                      \
        memcpy(&va, (const char *)base + (size_t)a * sizeof(T), sizeof(T));                                            \
        memcpy(&vb, (const char *)base + (size_t)b * sizeof(T), sizeof(T));                                            \
        if (isnan(va) || isnan(vb))                                                                                    \
            return isnan(va) == isnan(vb) ? a < b : !isnan(va);                                                        \
        return va > vb || (va == vb && a < b);                                                                         \
    }
INT_BEFORE(before_u8, uint8_t)
INT_BEFORE(before_u16, uint16_t)
INT_BEFORE(before_u32, uint32_t)
INT_BEFORE(before_u64, uint64_t)
INT_BEFORE(before_i8, int8_t)
INT_BEFORE(before_i16, int16_t)
INT_BEFORE(before_i32, int32_t)
INT_BEFORE(before_i64, int64_t)
FLOAT_BEFORE(before_f32, float)
FLOAT_BEFORE(before_f64, double)

static before_fn before_of(oi_dtype_t dt)
{
    switch (dt) {
    case OI_TYPE_UINT8: return before_u8;
    case OI_TYPE_UINT16: return before_u16;
    case OI_TYPE_UINT32: return before_u32;
    case OI_TYPE_UINT64: return before_u64;
    case OI_TYPE_INT8: return before_i8;
    case OI_TYPE_INT16: return before_i16;
    case OI_TYPE_INT32: return before_i32;
    case OI_TYPE_INT64: return before_i64;
    case OI_TYPE_FP32: return before_f32;
    case OI_TYPE_FP64: return before_f64;
    default: return NULL;
    }
}

/* Bottom-up merge sort of idx[0..n) with tmp as scratch; the result ends in idx. */
static void sort_indices(uint32_t *idx, uint32_t *tmp, uint32_t n, before_fn before, const void *base)
{
    uint32_t *src = idx, *dst = tmp;
    for (uint32_t width = 1; width < n; width *= 2) {
        for (uint32_t lo = 0; lo < n; lo += 2 * width) {
            uint32_t mid = lo + width < n ? lo + width : n;
            uint32_t hi = mid + width < n ? mid + width : n;
            uint32_t i = lo, j = mid, o = lo;
            while (i < mid && j < hi)
                dst[o++] = before(base, src[j], src[i]) ? src[j++] : src[i++];
            while (i < mid)
                dst[o++] = src[i++];
            while (j < hi)
                dst[o++] = src[j++];
        }
        uint32_t *swap = src;
        src = dst;
        dst = swap;
    }
    if (src != idx)
        memcpy(idx, src, (size_t)n * sizeof(*idx));
}

/* Triton prints scores with std::to_string: "%f" for floating point, decimal for integers. */
static int format_score(char *out, size_t cap, oi_dtype_t dt, const char *p)
{
    switch (dt) {
#define INT_CASE(TYPE, T, FMT, CAST)                                                                                   \
    case TYPE: {                                                                                                       \
        T v;                                                                                                           \
        memcpy(&v, p, sizeof(v));                                                                                      \
        return snprintf(out, cap, FMT, (CAST)v);                                                                       \
    }
        INT_CASE(OI_TYPE_UINT8, uint8_t, "%d", int)
        INT_CASE(OI_TYPE_UINT16, uint16_t, "%d", int)
        INT_CASE(OI_TYPE_UINT32, uint32_t, "%u", unsigned)
        INT_CASE(OI_TYPE_UINT64, uint64_t, "%llu", unsigned long long)
        INT_CASE(OI_TYPE_INT8, int8_t, "%d", int)
        INT_CASE(OI_TYPE_INT16, int16_t, "%d", int)
        INT_CASE(OI_TYPE_INT32, int32_t, "%d", int)
        INT_CASE(OI_TYPE_INT64, int64_t, "%lld", long long)
        INT_CASE(OI_TYPE_FP32, float, "%f", double)
        INT_CASE(OI_TYPE_FP64, double, "%f", double)
#undef INT_CASE
    default: return snprintf(out, cap, "?");
    }
}

/* Appends one BYTES element: its 4-byte little-endian length, then "score:index[:label]". */
static int append_class(oi_sbuf_t *out, oi_dtype_t dt, const char *elem, uint32_t index, const oi_labels_t *labels)
{
    /* "%f" of the largest double is 309 digits and 7 more characters. */
    char text[400];
    int n = format_score(text, sizeof(text), dt, elem);
    n += snprintf(text + n, sizeof(text) - (size_t)n, ":%u", index);
    uint32_t label_len;
    const char *label = oi_labels_get(labels, index, &label_len);
    uint32_t total = (uint32_t)n + (label_len ? label_len + 1 : 0);
    uint8_t prefix[4] = {(uint8_t)total, (uint8_t)(total >> 8), (uint8_t)(total >> 16), (uint8_t)(total >> 24)};
    if (oi_sbuf_append(out, prefix, 4) != 0 || oi_sbuf_append(out, text, (size_t)n) != 0)
        return -1;
    if (label_len && (oi_sbuf_append(out, ":", 1) != 0 || oi_sbuf_append(out, label, label_len) != 0))
        return -1;
    return 0;
}

oi_status_t *oi_classify_rank(const oi_tensor_t *t, int batched, uint32_t k, oi_topk_t *out)
{
    memset(out, 0, sizeof(*out));
    oi_status_t *st = oi_classify_check_dtype(t->dtype, t->name);
    if (st != NULL)
        return st;
    size_t esize = oi_dtype_size(t->dtype);
    /* Triton takes dimension 0 as the batch of a batching model's output, and the whole
     * tensor as one row otherwise (or when that dimension is 0). */
    int64_t batch = batched && t->ndim > 0 ? t->shape[0] : 0;
    uint64_t row_elems = 1;
    for (int d = batch > 0 ? 1 : 0; d < t->ndim; d++)
        row_elems *= (uint64_t)t->shape[d];
    if (row_elems > OI_CLASSIFY_MAX_ELEMENTS)
        return oi_status_new(OI_BAD_REQUEST, "output '%s': classification output tensor too large", t->name);
    uint32_t n = (uint32_t)row_elems;
    int64_t rows = batch > 0 ? batch : 1;
    if ((uint64_t)rows * n * esize > t->byte_size)
        return oi_status_new(OI_INTERNAL, "output '%s': %zu bytes, fewer than its shape needs", t->name, t->byte_size);
    out->batch = batch;
    out->rows = rows;
    out->kept = k < n ? k : n;
    uint32_t *scratch = malloc(((size_t)n ? n : 1) * 2 * sizeof(uint32_t));
    out->idx = malloc(((size_t)rows * out->kept + 1) * sizeof(uint32_t));
    if (scratch == NULL || out->idx == NULL) {
        free(scratch);
        oi_topk_free(out);
        return oi_status_new(OI_INTERNAL, "out of memory");
    }
    before_fn before = before_of(t->dtype);
    for (int64_t r = 0; r < rows; r++) {
        const char *base = t->data + (size_t)r * n * esize;
        for (uint32_t i = 0; i < n; i++)
            scratch[i] = i;
        sort_indices(scratch, scratch + n, n, before, base);
        memcpy(out->idx + (size_t)r * out->kept, scratch, (size_t)out->kept * sizeof(uint32_t));
    }
    free(scratch);
    return NULL;
}

void oi_topk_free(oi_topk_t *r)
{
    free(r->idx);
    r->idx = NULL;
}

const char *oi_classify_elem(const oi_tensor_t *t, const oi_topk_t *r, int64_t row, uint32_t rank)
{
    size_t esize = oi_dtype_size(t->dtype);
    size_t row_elems = r->rows ? t->byte_size / esize / (size_t)r->rows : 0;
    return t->data + ((size_t)row * row_elems + r->idx[(size_t)row * r->kept + rank]) * esize;
}

double oi_classify_score(const oi_tensor_t *t, const char *elem)
{
    switch (t->dtype) {
#define SCORE_CASE(TYPE, T)                                                                                            \
    case TYPE: {                                                                                                       \
        T v;                                                                                                           \
        memcpy(&v, elem, sizeof(v));                                                                                   \
        return (double)v;                                                                                              \
    }
        SCORE_CASE(OI_TYPE_UINT8, uint8_t)
        SCORE_CASE(OI_TYPE_UINT16, uint16_t)
        SCORE_CASE(OI_TYPE_UINT32, uint32_t)
        SCORE_CASE(OI_TYPE_UINT64, uint64_t)
        SCORE_CASE(OI_TYPE_INT8, int8_t)
        SCORE_CASE(OI_TYPE_INT16, int16_t)
        SCORE_CASE(OI_TYPE_INT32, int32_t)
        SCORE_CASE(OI_TYPE_INT64, int64_t)
        SCORE_CASE(OI_TYPE_FP32, float)
        SCORE_CASE(OI_TYPE_FP64, double)
#undef SCORE_CASE
    default: return 0;
    }
}

const char *oi_labels_get(const oi_labels_t *l, uint32_t index, uint32_t *len)
{
    *len = l != NULL && index < l->n ? l->len[index] : 0;
    return *len ? l->line[index] : NULL;
}

oi_status_t *oi_classify(oi_tensor_t *t, int batched, uint32_t k, const oi_labels_t *labels)
{
    oi_topk_t r;
    oi_status_t *st = oi_classify_rank(t, batched, k, &r);
    if (st != NULL)
        return st;
    oi_sbuf_t out = {0};
    for (int64_t row = 0; row < r.rows; row++)
        for (uint32_t i = 0; i < r.kept; i++) {
            uint32_t index = r.idx[(size_t)row * r.kept + i];
            if (append_class(&out, t->dtype, oi_classify_elem(t, &r, row, i), index, labels) != 0) {
                oi_topk_free(&r);
                oi_sbuf_free(&out);
                return oi_status_new(OI_INTERNAL, "out of memory");
            }
        }
    oi_buf_t *owner = oi_sbuf_detach(&out);
    if (owner == NULL) {
        oi_topk_free(&r);
        oi_sbuf_free(&out);
        return oi_status_new(OI_INTERNAL, "out of memory");
    }
    oi_buf_unref(t->owner);
    t->owner = owner;
    t->data = owner->data;
    t->byte_size = owner->len;
    t->dtype = OI_TYPE_BYTES;
    if (r.batch > 0) {
        t->ndim = 2;
        t->shape[0] = r.batch;
        t->shape[1] = r.kept;
    } else {
        t->ndim = 1;
        t->shape[0] = r.kept;
    }
    oi_topk_free(&r);
    return NULL;
}
