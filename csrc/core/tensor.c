#include "tensor.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int oi_shape_elements(const int64_t *shape, int ndim, int64_t *count)
{
    int64_t span = 8; /* bytes of the non-zero dimensions at the widest element size */
    int empty = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        if (shape[i] == 0)
            empty = 1;
        else if (__builtin_mul_overflow(span, shape[i], &span))
            return -1;
    }
    *count = empty ? 0 : span / 8;
    return 0;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first name used twice among n (sorted in place), or NULL. Sorting keeps this
 * O(n log n) for requests with many tensors. */
static const char *find_duplicate(const char **names, uint32_t n)
{
    qsort(names, n, sizeof(*names), compare_names);
    for (uint32_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            return names[i];
    return NULL;
}

const char *oi_request_who(char *out, size_t cap, const char *id, size_t id_len)
{
    int known = id != NULL && id_len > 0;
    snprintf(out, cap, "[request id: %.*s]", known ? (int)(id_len < 256 ? id_len : 256) : 12,
             known ? id : "<id_unknown>");
    return out;
}

oi_status_t *oi_request_check_unique(const oi_request_t *r, const char *kind)
{
    uint32_t most = r->n_inputs > r->n_outputs ? r->n_inputs : r->n_outputs;
    if (most < 2)
        return NULL;
    const char **names = malloc(most * sizeof(*names));
    if (names == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory checking the request's names");
    for (uint32_t i = 0; i < r->n_inputs; i++)
        names[i] = r->inputs[i].name;
    const char *dup = find_duplicate(names, r->n_inputs);
    const char *dup_kind = kind;
    for (uint32_t i = 0; dup == NULL && i < r->n_outputs; i++)
        names[i] = r->outputs[i].name;
    if (dup == NULL && (dup = find_duplicate(names, r->n_outputs)) != NULL)
        dup_kind = "output";
    char who[300];
    oi_status_t *st = dup == NULL ? NULL
                                  : oi_status_new(OI_BAD_REQUEST, "%s %s '%.128s' already exists in request",
                                                  oi_request_who(who, sizeof(who), r->id, r->id_len), dup_kind, dup);
    free(names);
    return st;
}

oi_status_t *oi_shape_refusal(const int64_t *shape, int ndim, oi_dtype_t dtype, const char *kind, const char *name,
                              oi_words_t words)
{
    char shp[24 * OI_MAX_DIMS];
    oi_shape_format(shape, ndim, shp, sizeof(shp));
    int64_t count = 1;
    int too_many = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return words == OI_WORDS_HTTP
                       ? oi_status_new(OI_BAD_REQUEST,
                                       "invalid shape for %s '%s': shape %s contains one or more invalid dimensions",
                                       kind, name, shp)
                       : oi_status_new(OI_BAD_REQUEST, "tensor '%s' contains an invalid dimension in shape %s", name,
                                       shp);
        too_many |= __builtin_mul_overflow(count, shape[i], &count);
    }
    if (too_many && count != 0) /* tritonserver stops counting at a zero dimension */
        return words == OI_WORDS_HTTP
                   ? oi_status_new(OI_BAD_REQUEST,
                                   "invalid shape for %s '%s': shape %s causes total element count to exceed "
                                   "maximum size of %" PRId64,
                                   kind, name, shp, INT64_MAX)
                   : oi_status_new(OI_BAD_REQUEST, "element count for tensor '%s' exceeds maximum size of %" PRId64,
                                   name, INT64_MAX);
    size_t esize = dtype == OI_TYPE_BYTES ? 1 : oi_dtype_size(dtype);
    if (count > INT64_MAX / (int64_t)esize)
        return words == OI_WORDS_HTTP
                   ? oi_status_new(OI_BAD_REQUEST,
                                   "byte size overflow for %s '%s': element count (%" PRId64
                                   ") * data type size (%zu) exceeds maximum allowed size (%" PRId64 ")",
                                   kind, name, count, esize, INT64_MAX)
                   : oi_status_new(OI_BAD_REQUEST, "byte size for tensor '%s' exceeds maximum size of %" PRId64, name,
                                   INT64_MAX);
    return NULL;
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

int oi_shape_map_wildcards(const int64_t *from, int from_n, const int64_t *shape, const int64_t *to, int to_n,
                           int64_t *out)
{
    int j = 0, rc = 0;
    for (int i = 0; i < to_n; i++) {
        out[i] = to[i];
        if (to[i] != -1)
            continue;
        while (j < from_n && from[j] != -1)
            j++;
        if (j < from_n)
            out[i] = shape[j++];
        else
            rc = -1;
    }
    return rc;
}

oi_status_t *oi_tensor_reshape(const oi_tensor_t *t, const oi_io_spec_t *declared, const oi_io_spec_t *reshape,
                               int batched, int64_t *shape, int *ndim)
{
    int skip = batched && t->ndim > 0 ? 1 : 0, nd = reshape->ndim + skip;
    if (nd > OI_MAX_DIMS)
        nd = OI_MAX_DIMS;
    if (skip)
        shape[0] = t->shape[0];
    /* The declaration's variable dimensions are the request's, as validated: a rank that does
     * not match (a declaration of any shape) leaves -1s for the count check to refuse. */
    int dn = declared->ndim - skip;
    int matched = dn >= 0 && dn == t->ndim - skip;
    oi_shape_map_wildcards(declared->dims + skip, matched ? dn : 0, t->shape + skip, reshape->dims, nd - skip,
                           shape + skip);
    *ndim = nd;
    int64_t sent = 0, seen = 0;
    if (oi_shape_elements(t->shape, t->ndim, &sent) != 0 || oi_shape_elements(shape, nd, &seen) != 0 || sent != seen) {
        char got[24 * OI_MAX_DIMS], want[24 * OI_MAX_DIMS];
        return oi_status_new(OI_BAD_REQUEST, "input '%s': shape %s cannot be reshaped to %s", t->name,
                             oi_shape_format(t->shape, t->ndim, got, sizeof(got)),
                             oi_shape_format(shape, nd, want, sizeof(want)));
    }
    return NULL;
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
    oi_buf_unref(r->params_buf);
    memset(r, 0, sizeof(*r));
    r->binary_data_output = -1;
}

void oi_response_drop_absent(oi_response_t *r)
{
    uint32_t kept = 0;
    for (uint32_t i = 0; i < r->n_outputs; i++)
        if (r->outputs[i].absent)
            oi_tensor_clear(&r->outputs[i]);
        else
            r->outputs[kept++] = r->outputs[i];
    r->n_outputs = kept;
}

uint32_t oi_name_index(const char *const *names, uint32_t n, const char *name)
{
    uint32_t i = 0;
    while (i < n && strcmp(names[i], name) != 0)
        i++;
    return i;
}

void oi_response_clear(oi_response_t *r)
{
    for (uint32_t i = 0; i < r->n_outputs; i++)
        oi_tensor_clear(&r->outputs[i]);
    free(r->outputs);
    if (r->parameters != NULL)
        oi_buf_unref(r->parameters);
    memset(r, 0, sizeof(*r));
}

oi_status_t *oi_tensor_check_input(const oi_tensor_t *t, const char *kind, const char *name)
{
    int64_t count;
    return oi_shape_elements(t->shape, t->ndim, &count) == 0 ? NULL : oi_tensor_check_size(t, kind, name);
}

oi_status_t *oi_tensor_check_input_size(const oi_tensor_t *t, const char *model, const char *id, size_t id_len)
{
    int64_t count;
    if (oi_shape_elements(t->shape, t->ndim, &count) != 0)
        return oi_tensor_check_size(t, "input", t->name);
    if ((uint64_t)count * oi_dtype_size(t->dtype) == t->byte_size) /* oi_shape_elements: no overflow */
        return NULL;
    char who[300];
    return oi_status_new(OI_BAD_REQUEST,
                         "%s input byte size mismatch for input '%s' for model '%s'. Expected %" PRIu64 ", got %zu",
                         oi_request_who(who, sizeof(who), id, id_len), t->name, model,
                         (uint64_t)count * oi_dtype_size(t->dtype), t->byte_size);
}

oi_status_t *oi_tensor_check_bytes(const oi_tensor_t *t, const char *model, const char *id, size_t id_len)
{
    char who[300];
    oi_request_who(who, sizeof(who), id, id_len);
    int64_t count;
    if (oi_shape_elements(t->shape, t->ndim, &count) != 0)
        return oi_tensor_check_size(t, "input", t->name); /* its words for a shape too large */
    size_t off = 0;
    int64_t seen = 0;
    while (off < t->byte_size) {
        if (t->byte_size - off < 4)
            return oi_status_new(OI_BAD_REQUEST,
                                 "%s incomplete string length indicator for inference input '%s' for model '%s', "
                                 "expecting 4 bytes but only %zu bytes available. Please make sure the string "
                                 "length indicator is in one buffer.",
                                 who, t->name, model, t->byte_size - off);
        uint32_t n;
        memcpy(&n, t->data + off, 4); /* little-endian hosts only (x86-64, arm64) */
        off += 4;
        if (++seen > count)
            return oi_status_new(OI_BAD_REQUEST,
                                 "%s unexpected number of string elements %" PRId64
                                 " for inference input '%s' for model '%s', expecting %" PRId64,
                                 who, seen, t->name, model, count);
        if (n > t->byte_size - off)
            return oi_status_new(OI_BAD_REQUEST,
                                 "%s string element %" PRId64 " of inference input '%s' for model '%s' declares %u "
                                 "bytes but only %zu remain",
                                 who, seen - 1, t->name, model, n, t->byte_size - off);
        off += n;
    }
    if (seen != count)
        return oi_status_new(OI_BAD_REQUEST,
                             "%s expected %" PRId64 " string elements for inference input '%s' for model '%s', "
                             "got %" PRId64,
                             who, count, t->name, model, seen);
    return NULL;
}

oi_status_t *oi_tensor_check_size(const oi_tensor_t *t, const char *kind, const char *name)
{
    char shp[24 * OI_MAX_DIMS];
    int64_t count;
    if (oi_shape_elements(t->shape, t->ndim, &count) != 0) {
        oi_status_t *st = oi_shape_refusal(t->shape, t->ndim, t->dtype, kind, name, OI_WORDS_CORE);
        return st != NULL ? st
                          : oi_status_new(OI_BAD_REQUEST, "%s '%s': shape %s has too many elements", kind, name,
                                          oi_shape_format(t->shape, t->ndim, shp, sizeof(shp)));
    }
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
