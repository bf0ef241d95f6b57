#include "tensor.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int oi_shape_elements(const int64_t *shape, int ndim, int64_t *count)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        if (__builtin_mul_overflow(n, shape[i], &n))
            return -1;
    }
    *count = n;
    return 0;
}

char *oi_shape_format(const int64_t *shape, int ndim, char *out, size_t cap)
{
    size_t k = 0;
    if (cap == 0)
        return out;
    out[0] = '\0';
    k += (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%" PRId64, i ? "," : "", shape[i]);
    if (k < cap)
        snprintf(out + k, cap - k, "]");
    return out;
}

oi_tensor_t *oi_tensor_push(oi_tensor_t **arr, uint32_t *n)
{
    /* Capacity is implied by the count: 4, then doubled each time the count reaches a power
     * of two. */
    uint32_t cnt = *n;
    if (cnt == 0 || (cnt >= 4 && (cnt & (cnt - 1)) == 0)) {
        size_t cap = cnt ? (size_t)cnt * 2 : 4;
        oi_tensor_t *p = realloc(*arr, cap * sizeof(**arr));
        if (p == NULL)
            return NULL;
        *arr = p;
    }
    oi_tensor_t *t = &(*arr)[cnt];
    memset(t, 0, sizeof(*t));
    *n = cnt + 1;
    return t;
}

void oi_tensor_clear(oi_tensor_t *t)
{
    oi_buf_unref(t->owner);
    t->owner = NULL;
    t->data = NULL;
    t->byte_size = 0;
}

void oi_request_clear(oi_request_t *r)
{
    for (uint32_t i = 0; i < r->n_inputs; i++)
        oi_tensor_clear(&r->inputs[i]);
    free(r->inputs);
    free(r->outputs);
    oi_buf_unref(r->body);
    oi_buf_unref(r->aux);
    memset(r, 0, sizeof(*r));
    r->binary_data_output = -1;
}

void oi_response_clear(oi_response_t *r)
{
    for (uint32_t i = 0; i < r->n_outputs; i++)
        oi_tensor_clear(&r->outputs[i]);
    free(r->outputs);
    memset(r, 0, sizeof(*r));
}

oi_status_t *oi_tensor_check_size(const oi_tensor_t *t, const char *kind, const char *name)
{
    char shp[24 * OI_MAX_DIMS];
    int64_t count;
    if (oi_shape_elements(t->shape, t->ndim, &count) != 0)
        return oi_status_new(OI_BAD_REQUEST, "%s '%s': shape %s has a negative dimension or too many elements",
                             kind, name, oi_shape_format(t->shape, t->ndim, shp, sizeof(shp)));
    size_t esize = oi_dtype_size(t->dtype);
    if (t->dtype != OI_TYPE_BYTES) {
        uint64_t want;
        if (__builtin_mul_overflow((uint64_t)count, (uint64_t)esize, &want) || want != t->byte_size)
            return oi_status_new(OI_BAD_REQUEST,
                                 "%s '%s': shape %s of %s needs %" PRId64 " x %zu bytes, got %zu bytes", kind, name,
                                 oi_shape_format(t->shape, t->ndim, shp, sizeof(shp)),
                                 oi_dtype_name(t->dtype), count, esize, t->byte_size);
        return NULL;
    }
    /* BYTES: walk the 4-byte length prefixes. */
    size_t off = 0;
    int64_t seen = 0;
    while (off < t->byte_size) {
        if (t->byte_size - off < 4)
            return oi_status_new(OI_BAD_REQUEST, "%s '%s': BYTES element %" PRId64 " has a truncated 4-byte length",
                                 kind, name, seen);
        uint32_t n;
        memcpy(&n, t->data + off, 4); /* little-endian hosts only (x86-64, arm64) */
        off += 4;
        if (n > t->byte_size - off)
            return oi_status_new(OI_BAD_REQUEST,
                                 "%s '%s': BYTES element %" PRId64 " declares %u bytes but only %zu remain",
                                 kind, name, seen, n, t->byte_size - off);
        off += n;
        seen++;
    }
    if (seen != count)
        return oi_status_new(OI_BAD_REQUEST, "%s '%s': shape %s needs %" PRId64 " BYTES elements, got %" PRId64,
                             kind, name, oi_shape_format(t->shape, t->ndim, shp, sizeof(shp)), count, seen);
    return NULL;
}
