/* The classification extension: an output's top-k classes as BYTES strings
 * "score:index[:label]", formatted as Triton formats them. Shared by V2 (the "classification"
 * output parameter) and the legacy v1 API (`cls { count }`). Pure functions over buffers. */
#ifndef OI_SERVER_CLASSIFY_H
#define OI_SERVER_CLASSIFY_H

#include <stdint.h>

#include "core/tensor.h"

/* The most elements one row may have, as in Triton: a bigger row is refused rather than
 * sorted. */
#define OI_CLASSIFY_MAX_ELEMENTS 1000000

/* The lines of an output's label file (Triton's label_filename), immutable once made, so
 * that any thread may read them. Owned by the model that holds it. */
typedef struct oi_labels_s {
    uint32_t n;
    const char **line; /* line[i], NUL-terminated, points into the same allocation */
    uint32_t *len;
} oi_labels_t;

/* Splits a label file's text at '\n' as std::getline does (a final line without '\n' still
 * counts, a '\r' stays). Returns a new set (free with oi_labels_free), or NULL when out of
 * memory. */
oi_labels_t *oi_labels_parse(const char *text, size_t len);

void oi_labels_free(oi_labels_t *l);

/* Whether classification can read elements of `dt` (the integer and FP32/FP64 types, as in
 * Triton); NULL, or a 400 status naming output `name` in Triton's words. */
oi_status_t *oi_classify_check_dtype(oi_dtype_t dt, const char *name);

/* The top-k classes of each row of an output, by rank. */
typedef struct oi_topk_s {
    int64_t batch; /* the batch size the rows came from; 0: the tensor was one row */
    int64_t rows;  /* rows ranked: batch, or 1 */
    uint32_t kept; /* classes per row: min(k, row elements) */
    uint32_t *idx; /* rows * kept class indices, row by row, best first (owned) */
} oi_topk_t;

/* Ranks the classes of each row of `t` (per row when `batched` and dimension 0 is not 0, else
 * the whole tensor): descending score, ties by ascending index, NaN last. Returns NULL with
 * *out filled (free with oi_topk_free), or a status (400 unsupported type or a row too large,
 * 500 out of memory) with nothing to free. */
oi_status_t *oi_classify_rank(const oi_tensor_t *t, int batched, uint32_t k, oi_topk_t *out);

void oi_topk_free(oi_topk_t *r);

/* The element of row `row` at rank `rank` (0: best), pointing into t's data. */
const char *oi_classify_elem(const oi_tensor_t *t, const oi_topk_t *r, int64_t row, uint32_t rank);

/* An element's score as a double, whatever the tensor's numeric type. */
double oi_classify_score(const oi_tensor_t *t, const char *elem);

/* The label of class `index` and its length in *len, or NULL (no labels, past the file's end,
 * or an empty line: no label, as in Triton). */
const char *oi_labels_get(const oi_labels_t *l, uint32_t index, uint32_t *len);

/* Replaces the tensor `t` (a model output) by its top-k classification, computed per row when
 * `batched` (the model batches: dimension 0 is the batch), else over the whole tensor: a BYTES
 * tensor of shape [rows, min(k, row elements)] (or [min(k, elements)] unbatched), classes by
 * descending score, ties by ascending index; `labels` (may be NULL) add the class's label
 * where its line is not empty. Drops `t`'s owner reference and gives `t` a new one. Returns NULL, or a status (400
 * unsupported type or a row too large, 500 out of memory) with `t` untouched. Runs on an executor thread. */
oi_status_t *oi_classify(oi_tensor_t *t, int batched, uint32_t k, const oi_labels_t *labels);

#endif
