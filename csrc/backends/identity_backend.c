#include "backends/identity_backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/thread.h"

typedef struct {
    char *output; /* OUTPUT<i> */
    char *input;  /* INPUT<i> */
    /* When the pair's declared shapes differ (a reshape in config.pbtxt made them equal for
     * Triton), the output takes these: its declared dims after the batch, holding the input's
     * elements (each -1 the size the request gave the input's matching -1, in `input_decl`);
     * ndim -1: the output has the input's shape as sent. */
    oi_io_spec_t reshape;
    oi_io_spec_t input_decl;
    /* An optional input left out of a request answers zeros, as Triton's identity backend
     * does: the output's declared dims after the batch, -1 read as 1; ndim -1: the input is
     * required. */
    oi_io_spec_t zeros;
} pair_t;

typedef struct {
    char *model_name;
    pair_t *pairs;
    uint32_t n_pairs;
    int batched;
    uint64_t delay_ms, delay_multiplier;
} identity_state_t;

static void id_release(void *state)
{
    identity_state_t *s = state;
    if (s == NULL)
        return;
    for (uint32_t i = 0; i < s->n_pairs; i++) {
        free(s->pairs[i].output);
        free(s->pairs[i].input);
    }
    free(s->pairs);
    free(s->model_name);
    free(s);
}

/* The digits after `prefix` in `name`, or NULL when name does not start with it. */
static const char *index_of(const char *name, const char *prefix)
{
    size_t n = strlen(prefix);
    return strncmp(name, prefix, n) == 0 ? name + n : NULL;
}

static int same_dims(const oi_io_spec_t *a, const oi_io_spec_t *b)
{
    return a->ndim == b->ndim && memcmp(a->dims, b->dims, (size_t)(a->ndim > 0 ? a->ndim : 0) * sizeof(int64_t)) == 0;
}

static char *error(const char *fmt, const char *model, const char *name)
{
    char msg[OI_MAX_NAME_BYTES + 256];
    snprintf(msg, sizeof(msg), fmt, model, name);
    return strdup(msg);
}

void *oi_identity_backend_state(const char *model_name, int max_batch_size, const oi_io_spec_t *inputs,
                                uint32_t n_inputs, const oi_io_spec_t *outputs, uint32_t n_outputs,
                                uint64_t delay_ms, uint64_t delay_multiplier, char **err)
{
    *err = NULL;
    identity_state_t *s = calloc(1, sizeof(*s));
    if (s == NULL || (s->model_name = strdup(model_name)) == NULL ||
        (s->pairs = calloc(n_outputs ? n_outputs : 1, sizeof(pair_t))) == NULL)
        goto oom;
    s->delay_ms = delay_ms;
    s->delay_multiplier = delay_multiplier;
    s->batched = max_batch_size > 0;
    for (uint32_t o = 0; o < n_outputs; o++) {
        const char *index = index_of(outputs[o].name, "OUTPUT");
        const oi_io_spec_t *in = NULL;
        for (uint32_t i = 0; index != NULL && i < n_inputs && in == NULL; i++) {
            const char *in_index = index_of(inputs[i].name, "INPUT");
            if (in_index != NULL && strcmp(in_index, index) == 0)
                in = &inputs[i];
        }
        if (in == NULL) {
            *err = error("model '%s': output '%s' has no input of its index (INPUT<i> for OUTPUT<i>)", model_name,
                         outputs[o].name);
            id_release(s);
            return NULL;
        }
        pair_t *p = &s->pairs[s->n_pairs++];
        if ((p->output = strdup(outputs[o].name)) == NULL || (p->input = strdup(in->name)) == NULL)
            goto oom;
        p->reshape.ndim = -1;
        int skip = s->batched && outputs[o].ndim > 0;
        if (!same_dims(in, &outputs[o])) {
            p->reshape.ndim = outputs[o].ndim - skip;
            memcpy(p->reshape.dims, outputs[o].dims + skip, (size_t)p->reshape.ndim * sizeof(int64_t));
            p->input_decl = *in;
            p->input_decl.name = NULL;
        }
        p->zeros.ndim = -1;
        if (in->optional) {
            p->zeros.dtype = outputs[o].dtype;
            p->zeros.ndim = outputs[o].ndim < 0 ? 1 : outputs[o].ndim - skip;
            for (int d = 0; d < p->zeros.ndim; d++)
                p->zeros.dims[d] = outputs[o].ndim < 0 || outputs[o].dims[skip + d] < 0 ? 1 : outputs[o].dims[skip + d];
        }
    }
    return s;
oom:
    id_release(s);
    *err = strdup("out of memory");
    return NULL;
}

static void delay(const identity_state_t *s)
{
    uint64_t times = 1;
    int instance = oi_thread_instance();
    if (s->delay_multiplier > 0 && instance > 0)
        times = s->delay_multiplier * (uint64_t)instance;
    uint64_t ms = s->delay_ms * times;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* The zeros answered for a missing optional input: a batching model's output takes the
 * request's batch (its first input's first dimension; 1 when it sent none). BYTES elements
 * are empty strings (a zero length each). */
static oi_status_t *zeros(const identity_state_t *s, const pair_t *p, const oi_request_t *req, oi_tensor_t *t)
{
    int lead = s->batched;
    t->dtype = p->zeros.dtype;
    t->ndim = p->zeros.ndim + lead;
    if (lead)
        t->shape[0] = req->n_inputs > 0 && req->inputs[0].ndim > 0 ? req->inputs[0].shape[0] : 1;
    memcpy(t->shape + lead, p->zeros.dims, (size_t)p->zeros.ndim * sizeof(int64_t));
    int64_t count = 0;
    if (oi_shape_elements(t->shape, t->ndim, &count) != 0)
        return oi_status_new(OI_BAD_REQUEST, "model '%s': output '%s' is too large", s->model_name, t->name);
    size_t size = t->dtype == OI_TYPE_BYTES ? sizeof(uint32_t) : oi_dtype_size(t->dtype);
    if ((t->owner = oi_buf_new((size_t)count * size)) == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    t->data = t->owner->data;
    t->byte_size = t->owner->len = (size_t)count * size;
    memset(t->data, 0, t->byte_size);
    return NULL;
}

static oi_status_t *id_execute(void *state, const oi_request_t *req, const char *const *names, uint32_t n,
                               oi_response_t *resp)
{
    const identity_state_t *s = state;
    if (s->delay_ms > 0)
        delay(s);
    resp->outputs = calloc(n ? n : 1, sizeof(oi_tensor_t));
    if (resp->outputs == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        const pair_t *p = s->pairs;
        while (p < s->pairs + s->n_pairs && strcmp(p->output, names[i]) != 0)
            p++;
        if (p == s->pairs + s->n_pairs)
            return oi_status_new(OI_INTERNAL, "model '%s' has no output '%s'", s->model_name, names[i]);
        const oi_tensor_t *in = NULL;
        for (uint32_t j = 0; j < req->n_inputs && in == NULL; j++)
            if (strcmp(req->inputs[j].name, p->input) == 0)
                in = &req->inputs[j];
        oi_tensor_t *t = &resp->outputs[i];
        t->name = names[i];
        if (in == NULL && p->zeros.ndim >= 0) {
            resp->n_outputs = i + 1;
            oi_status_t *st = zeros(s, p, req, t);
            if (st != NULL)
                return st;
            continue;
        }
        if (in == NULL) /* validation requires every required input */
            return oi_status_new(OI_BAD_REQUEST, "missing input '%s' for model '%s'", p->input, s->model_name);
        t->dtype = in->dtype;
        if (p->reshape.ndim >= 0) {
            oi_status_t *st = oi_tensor_reshape(in, &p->input_decl, &p->reshape, s->batched, t->shape, &t->ndim);
            if (st != NULL)
                return st;
        } else {
            t->ndim = in->ndim;
            memcpy(t->shape, in->shape, (size_t)in->ndim * sizeof(int64_t));
        }
        t->data = in->data;
        t->byte_size = in->byte_size;
        t->owner = in->owner ? oi_buf_ref(in->owner) : NULL;
        resp->n_outputs = i + 1;
    }
    return NULL;
}

const oi_backend_t oi_identity_backend = {
    .name = "identity",
    .execute = id_execute,
    .release = id_release,
    .runs_on_loop = 1,
};

const oi_backend_t oi_identity_delayed_backend = {
    .name = "identity",
    .execute = id_execute,
    .release = id_release,
};
