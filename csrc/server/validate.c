#include "server/validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "server/classify.h"

static const oi_io_spec_t *find_spec(const oi_io_spec_t *specs, uint32_t n, const char *name)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(specs[i].name, name) == 0)
            return &specs[i];
    return NULL;
}

/* "INPUT0, INPUT1" into buf. */
static const char *list_names(const oi_io_spec_t *specs, uint32_t n, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? ", " : "", specs[i].name);
    return buf;
}

static int shape_matches(const oi_io_spec_t *spec, const int64_t *shape, int ndim)
{
    if (spec->ndim < 0) /* declared as any shape */
        return 1;
    if (ndim != spec->ndim)
        return 0;
    for (int i = 0; i < ndim; i++)
        if (spec->dims[i] != -1 && spec->dims[i] != shape[i])
            return 0;
    return 1;
}

/* The classification extension's "classification" parameter of a requested output: *k set to
 * the class count, 0 when absent or 0 (a plain tensor, as Triton reads 0). */
static oi_status_t *class_count(const oi_io_spec_t *spec, const oi_output_request_t *o, uint32_t *k)
{
    oi_json_param_t cls, shm;
    char none[1];
    *k = 0;
    if (oi_json_param(o->parameters, "classification", &cls, none, sizeof(none)) != 0 ||
        cls.kind == OI_JSON_PARAM_ABSENT)
        return NULL;
    if (cls.kind != OI_JSON_PARAM_COUNT || cls.count > UINT32_MAX)
        return oi_status_new(OI_BAD_REQUEST,
                             "output '%s': parameter 'classification' must be a class count, an integer from 0 to "
                             "%u, got %.*s",
                             o->name, UINT32_MAX, (int)(cls.raw.len > 64 ? 64 : cls.raw.len), cls.raw.ptr);
    if (cls.count == 0)
        return NULL;
    oi_json_param(o->parameters, "shared_memory_region", &shm, none, sizeof(none));
    if (shm.kind != OI_JSON_PARAM_ABSENT)
        return oi_status_new(OI_BAD_REQUEST,
                             "output '%s': Output can't set both 'shared_memory_region' and "
                             "'classification'",
                             o->name);
    *k = (uint32_t)cls.count;
    return oi_classify_check_dtype(spec->dtype, o->name);
}

/* Appends 'name' to a Python-style list being built in buf ("['A','B']" once closed). */
static size_t list_add(char *buf, size_t cap, size_t k, const char *name)
{
    if (k < cap)
        k += (size_t)snprintf(buf + k, cap - k, "%s'%s'", k > 1 ? "," : "", name);
    return k;
}

static int has_input(const oi_request_t *req, const char *name)
{
    for (uint32_t j = 0; j < req->n_inputs; j++)
        if (strcmp(req->inputs[j].name, name) == 0)
            return 1;
    return 0;
}

/* A request lacking required inputs, in Triton's words (infer_request.cc), request id first:
 * "expected 3 inputs" when every input is required, "expected number of inputs between 2 and
 * 3" when some are optional. */
static oi_status_t *missing_inputs(const oi_model_t *m, const oi_request_t *req)
{
    char got[512] = "[", missing[512] = "[", expected[64];
    size_t g = 1, k = 1;
    uint32_t required = 0;
    for (uint32_t i = 0; i < m->n_inputs; i++) {
        if (m->inputs[i].optional)
            continue;
        required++;
        if (!has_input(req, m->inputs[i].name))
            k = list_add(missing, sizeof(missing) - 1, k, m->inputs[i].name);
    }
    if (k == 1)
        return NULL;
    if (required == m->n_inputs)
        snprintf(expected, sizeof(expected), "%u inputs", m->n_inputs);
    else
        snprintf(expected, sizeof(expected), "number of inputs between %u and %u", required, m->n_inputs);
    for (uint32_t j = 0; j < req->n_inputs; j++)
        g = list_add(got, sizeof(got) - 1, g, req->inputs[j].name);
    strcat(got, "]"); /* room kept: the lists were built one byte short */
    strcat(missing, "]");
    char who[300];
    return oi_status_new(OI_BAD_REQUEST,
                         "%s expected %s but got %u inputs for model '%s'. Got input(s) %s, "
                         "but missing required input(s) %s. Please provide all required input(s).",
                         oi_request_who(who, sizeof(who), req->id, req->id_len), expected, req->n_inputs, m->name,
                         got, missing);
}

oi_status_t *oi_validate_request(const oi_model_t *m, const oi_request_t *req, const char ***names, uint32_t *n,
                                 uint32_t **classes)
{
    char list[512], got[24 * OI_MAX_DIMS], want[24 * OI_MAX_DIMS];
    for (uint32_t i = 0; i < req->n_inputs; i++) {
        const oi_tensor_t *t = &req->inputs[i];
        const oi_io_spec_t *s = find_spec(m->inputs, m->n_inputs, t->name);
        if (s == NULL)
            return oi_status_new(OI_BAD_REQUEST, "unexpected input '%s' for model '%s'; its inputs are: %s",
                                 t->name, m->name, list_names(m->inputs, m->n_inputs, list, sizeof(list)));
        if (t->dtype != s->dtype)
            return oi_status_new(OI_BAD_REQUEST, "input '%s': expected datatype %s, got %s", t->name,
                                 oi_dtype_name(s->dtype), oi_dtype_name(t->dtype));
        if (!shape_matches(s, t->shape, t->ndim))
            return oi_status_new(OI_BAD_REQUEST, "input '%s': expected shape %s, got %s", t->name,
                                 oi_shape_format(s->dims, s->ndim, want, sizeof(want)),
                                 oi_shape_format(t->shape, t->ndim, got, sizeof(got)));
        oi_status_t *st = t->dtype == OI_TYPE_BYTES ? oi_tensor_check_bytes(t, m->name, req->id, req->id_len)
                                                     : oi_tensor_check_input_size(t, m->name, req->id, req->id_len);
        if (st != NULL)
            return st;
        if (m->max_batch_size > 0 && (t->shape[0] < 1 || t->shape[0] > m->max_batch_size))
            return oi_status_new(OI_BAD_REQUEST, "input '%s': batch size (first dimension) must be 1 to %d, got %lld",
                                 t->name, m->max_batch_size, (long long)t->shape[0]);
    }
    oi_status_t *st_missing = missing_inputs(m, req);
    if (st_missing != NULL)
        return st_missing;
    if (m->max_batch_size > 0) {
        for (uint32_t i = 1; i < req->n_inputs; i++)
            if (req->inputs[i].shape[0] != req->inputs[0].shape[0])
                return oi_status_new(OI_BAD_REQUEST,
                                     "input '%s': batch size %lld differs from input '%s' batch size %lld",
                                     req->inputs[i].name, (long long)req->inputs[i].shape[0], req->inputs[0].name,
                                     (long long)req->inputs[0].shape[0]);
    }
    uint32_t count = req->n_outputs ? req->n_outputs : m->n_outputs;
    const char **out = malloc((count ? count : 1) * sizeof(*out));
    uint32_t *counts = calloc(count ? count : 1, sizeof(*counts));
    int any = 0;
    if (out == NULL || counts == NULL) {
        free(out);
        free(counts);
        return oi_status_new(OI_INTERNAL, "out of memory");
    }
    for (uint32_t i = 0; i < count; i++) {
        if (req->n_outputs == 0) {
            out[i] = m->output_names[i];
            continue;
        }
        const char *name = req->outputs[i].name;
        const oi_io_spec_t *spec = find_spec(m->outputs, m->n_outputs, name);
        if (spec == NULL) {
            free(out);
            free(counts);
            return oi_status_new(OI_BAD_REQUEST, "unknown output '%s' for model '%s'; its outputs are: %s", name,
                                 m->name, list_names(m->outputs, m->n_outputs, list, sizeof(list)));
        }
        out[i] = name;
        oi_status_t *st = class_count(spec, &req->outputs[i], &counts[i]);
        if (st != NULL) {
            free(out);
            free(counts);
            return st;
        }
        any |= counts[i] > 0;
    }
    if (!any) {
        free(counts);
        counts = NULL;
    }
    *classes = counts;
    *names = out;
    *n = count;
    return NULL;
}

oi_status_t *oi_validate_response(const oi_model_t *m, const char *const *names, uint32_t n, oi_response_t *resp)
{
    char got[24 * OI_MAX_DIMS], want[24 * OI_MAX_DIMS];
    if (resp->n_outputs != n)
        return oi_status_new(OI_INTERNAL, "model '%s' produced %u outputs, expected %u", m->name, resp->n_outputs, n);
    for (uint32_t i = 0; i < n; i++) {
        const oi_tensor_t *t = &resp->outputs[i];
        const oi_io_spec_t *s = find_spec(m->outputs, m->n_outputs, names[i]);
        if (s == NULL || t->name == NULL || strcmp(t->name, names[i]) != 0)
            return oi_status_new(OI_INTERNAL, "model '%s' produced output %u as '%s', expected '%s'", m->name, i,
                                 t->name ? t->name : "(null)", names[i]);
        if (t->absent)
            continue;
        if (t->dtype != s->dtype)
            return oi_status_new(OI_INTERNAL, "model '%s' output '%s': declared %s, produced %s", m->name, s->name,
                                 oi_dtype_name(s->dtype), oi_dtype_name(t->dtype));
        if (!s->shape_as_produced && !shape_matches(s, t->shape, t->ndim))
            return oi_status_new(OI_INTERNAL, "model '%s' output '%s': declared shape %s, produced %s", m->name,
                                 s->name, oi_shape_format(s->dims, s->ndim, want, sizeof(want)),
                                 oi_shape_format(t->shape, t->ndim, got, sizeof(got)));
        oi_status_t *st = oi_tensor_check_size(t, "output", s->name);
        if (st != NULL) {
            oi_status_t *wrapped = oi_status_new(OI_INTERNAL, "model '%s' %s", m->name, st->message);
            oi_status_free(st);
            return wrapped;
        }
    }
    oi_response_drop_absent(resp);
    return NULL;
}
