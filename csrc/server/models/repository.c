#include "server/models/repository.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/thread.h"
#include "server/server_impl.h"

/* Control calls running at once; more are refused rather than queued behind slow loads. */
#define MAX_CALLS 16

oi_repo_call_t *oi_repo_call_new(oi_repo_op_t op)
{
    oi_repo_call_t *c = calloc(1, sizeof(*c));
    if (c != NULL)
        c->op = op;
    return c;
}

static int add_param(oi_repo_param_t **list, size_t *n, const char *name, oi_repo_param_kind_t kind, int64_t number,
                     const void *data, size_t len)
{
    oi_repo_param_t *grown = realloc(*list, (*n + 1) * sizeof(*grown));
    if (grown == NULL)
        return -1;
    *list = grown;
    oi_repo_param_t *p = &grown[*n];
    *p = (oi_repo_param_t){.kind = kind, .number = number, .len = len};
    p->name = strdup(name);
    p->data = malloc(len + 1); /* NUL-terminated: a STRING reads as a C string */
    if (p->name == NULL || p->data == NULL) {
        free(p->name);
        free(p->data);
        return -1;
    }
    if (len > 0)
        memcpy(p->data, data, len);
    p->data[len] = '\0';
    (*n)++;
    return 0;
}

int oi_repo_call_add_param(oi_repo_call_t *call, const char *name, oi_repo_param_kind_t kind, int64_t number,
                           const void *data, size_t len)
{
    return add_param(&call->params, &call->n_params, name, kind, number, data, len);
}

int oi_repo_call_add_result(oi_repo_call_t *call, const char *name, oi_repo_param_kind_t kind, int64_t number,
                            const void *data, size_t len)
{
    return add_param(&call->results, &call->n_results, name, kind, number, data, len);
}

static int dup_field(char **dst, const char *src)
{
    *dst = src ? strdup(src) : NULL;
    return src != NULL && *dst == NULL ? -1 : 0;
}

int oi_repo_call_add_entry(oi_repo_call_t *call, const char *name, const char *version, const char *state,
                           const char *reason)
{
    oi_repo_entry_t *grown = realloc(call->entries, (call->n_entries + 1) * sizeof(*grown));
    if (grown == NULL)
        return -1;
    call->entries = grown;
    oi_repo_entry_t *e = &grown[call->n_entries];
    memset(e, 0, sizeof(*e));
    if (dup_field(&e->name, name ? name : "") != 0 || dup_field(&e->version, version) != 0 ||
        dup_field(&e->state, state) != 0 || dup_field(&e->reason, reason) != 0) {
        free(e->name);
        free(e->version);
        free(e->state);
        free(e->reason);
        return -1;
    }
    call->n_entries++;
    return 0;
}

void oi_repo_call_stop(oi_repo_call_t *call) { __atomic_store_n(&call->stop, 1, __ATOMIC_RELAXED); }

void oi_repo_call_free(oi_repo_call_t *call)
{
    if (call == NULL)
        return;
    free(call->model);
    oi_buf_unref(call->body);
    for (size_t i = 0; i < call->n_params; i++) {
        free(call->params[i].name);
        free(call->params[i].data);
    }
    free(call->params);
    for (size_t i = 0; i < call->n_results; i++) {
        free(call->results[i].name);
        free(call->results[i].data);
    }
    free(call->results);
    for (size_t i = 0; i < call->n_entries; i++) {
        free(call->entries[i].name);
        free(call->entries[i].version);
        free(call->entries[i].state);
        free(call->entries[i].reason);
    }
    free(call->entries);
    oi_status_free(call->status);
    free(call);
}

/* On the loop thread that asked. */
static void run_done(oi_task_t *t)
{
    oi_repo_call_t *call = (oi_repo_call_t *)((char *)t - offsetof(oi_repo_call_t, task));
    call->done(call);
}

/* The control thread: one call, then back to its loop. The call may be freed as soon as it is
 * posted; the server lives until repo_calls is back to 0 (see finish_stop in server.c). */
static void *control_main(void *arg)
{
    oi_repo_call_t *call = arg;
    oi_server_t *s = call->server;
    /* A compressed body is inflated here, off the loop that received it. */
    oi_buf_t *plain = NULL;
    if (call->body != NULL && call->body_encoding != OI_ENCODING_IDENTITY) {
        oi_inflate_limit_t lim = {.max_out = call->max_body_bytes,
                                  .what = "request body",
                                  .limit_name = "max_body_bytes",
                                  .max_ratio = s->cfg.max_inflate_ratio,
                                  .budget = s->body_budget,
                                  .expect = OI_INFLATE_JSON,
                                  .json_len = SIZE_MAX};
        call->status = oi_inflate(call->body->data, call->body->len, call->body_encoding, &lim, &plain);
        oi_buf_unref(call->body);
        call->body = plain;
    }
    if (call->status == NULL)
        s->repo_fn(s->repo_ctx, call);
    call->task.run = run_done;
    oi_loop_post(call->loop, &call->task);
    atomic_fetch_sub(&s->repo_calls, 1);
    return NULL;
}

oi_status_t *oi__repo_submit(oi_server_t *s, oi_repo_call_t *call, oi_loop_t *loop, oi_repo_done_cb done, void *ctx)
{
    if (s->repo_fn == NULL)
        return oi_status_new(OI_UNIMPLEMENTED, "the model repository extension is not served here");
    if (atomic_fetch_add(&s->repo_calls, 1) >= MAX_CALLS) {
        atomic_fetch_sub(&s->repo_calls, 1);
        return oi_status_new(OI_UNAVAILABLE, "%d model repository requests are already in progress; retry later",
                             MAX_CALLS);
    }
    call->server = s;
    call->loop = loop;
    call->done = done;
    call->ctx = ctx;
    pthread_t t;
    int rc = oi_thread_create(&t, "oi-repo-ctl", control_main, call, 1);
    if (rc != 0) {
        atomic_fetch_sub(&s->repo_calls, 1);
        return oi_status_new(OI_UNAVAILABLE, "cannot start a model repository thread: %s", strerror(rc));
    }
    return NULL;
}
