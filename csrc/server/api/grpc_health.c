/* The standard gRPC health service (grpc.health.v1.Health) on the gRPC port: Check answers
 * the server's readiness now; Watch answers it now and again on every change, until the
 * client leaves or the server stops (NOT_SERVING, then UNAVAILABLE). As Triton does, the
 * service name in the request is not looked at: every name gets the server's status.
 * That status is the one /v2/health/ready and ServerReady give: where strict readiness asks
 * models that answer their own (oi__server_ready_asks), it is asked on a control thread
 * (OI_REPO_READY) and answered when the models have, so a loop never waits on a model.
 *
 * Watchers are kept in one list under a mutex, each touched only on its call's loop thread
 * (a call is not thread-safe): a change posts one task to every loop, and each task updates
 * the watchers of its own loop. Nothing here is on the inference path. */
#include <stdlib.h>
#include <string.h>

#include "health.pb-c.h"

#include "server/api/grpc_api_impl.h"

struct oi_health_watch_s {
    oi_grpc_call_t *call; /* one reference, dropped on the call's loop thread */
    int last;             /* the status last sent */
    struct oi_health_watch_s *next;
};

static int status_of(int ready)
{
    return ready ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                 : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
}

/* The status every service name gets when no model need be asked: SERVING while the server is
 * ready (oi__server_ready). */
static int current_status(oi_server_t *s) { return status_of(oi__server_ready(s)); }

/* Whether the status must be asked of the models (on a control thread) rather than read here. */
static int must_ask(oi_server_t *s) { return oi__server_ready(s) && oi__server_ready_asks(s); }

/* Queues one HealthCheckResponse; 0, or -1 when out of memory (the call is then ended). */
static int send_status(oi_grpc_call_t *call, int status)
{
    Grpc__Health__V1__HealthCheckResponse r = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    r.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
    size_t n = grpc__health__v1__health_check_response__get_packed_size(&r);
    oi_buf_t *b = oi_buf_new(n ? n : 1);
    if (b == NULL) {
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
        return -1;
    }
    b->len = grpc__health__v1__health_check_response__pack(&r, (uint8_t *)b->data);
    oi_iov_t part = {b->data, b->len, b};
    oi_grpc_send(call, &part, 1, b->len);
    return 0;
}

/* Drops the watchers of `loop` whose call has ended. Caller holds health_mu, on that loop. */
static void prune(oi_server_t *s, const oi_loop_t *loop)
{
    for (oi_health_watch_t **pp = &s->watchers; *pp != NULL;) {
        oi_health_watch_t *w = *pp;
        if (w->call->loop == loop && !oi_grpc_call_open(w->call)) {
            *pp = w->next;
            oi_grpc_call_unref(w->call);
            free(w);
        } else {
            pp = &w->next;
        }
    }
}

/* Answers `call` with `status`: Check ends there, Watch is kept to hear of changes. */
static void answer(oi_server_t *s, oi_grpc_call_t *call, int status)
{
    if (send_status(call, status) != 0)
        return;
    if (call->kind != RPC_HEALTH_WATCH) {
        oi_grpc_finish(call, OI_GRPC_OK, NULL);
        return;
    }
    if (atomic_load(&s->stopping)) { /* answered after oi__health_stop ended the others */
        oi_grpc_finish(call, OI_GRPC_UNAVAILABLE, "the server is shutting down");
        return;
    }
    oi_health_watch_t *w = calloc(1, sizeof(*w));
    if (w == NULL) {
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
        return;
    }
    oi_grpc_call_ref(call);
    w->call = call;
    w->last = status;
    pthread_mutex_lock(&s->health_mu);
    prune(s, call->loop); /* clients that left since the last change */
    w->next = s->watchers;
    s->watchers = w;
    pthread_mutex_unlock(&s->health_mu);
}

void oi__health_answer(oi_server_t *s, oi_grpc_call_t *call, int ready)
{
    /* The server may have begun to drain or stop while the models were asked. */
    answer(s, call, status_of(ready && oi__server_ready(s)));
}

void oi__health_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
{
    Grpc__Health__V1__HealthCheckRequest *req =
        grpc__health__v1__health_check_request__unpack(NULL, msg->len, (const uint8_t *)msg->data);
    if (req == NULL) {
        oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, "malformed HealthCheckRequest");
        return;
    }
    grpc__health__v1__health_check_request__free_unpacked(req, NULL);
    if (!must_ask(s))
        answer(s, call, current_status(s));
    else if (oi__grpc_probe_ready(s, call, NULL) != 0)
        answer(s, call, status_of(0)); /* as ServerReady: one that could not be asked is not ready */
    /* else oi__health_answer, on this loop, once the models have answered */
}

/* On one loop's thread: tells that loop's watchers `status` if it changed; when the server
 * is stopping, ends their calls too. */
static void update_loop(oi_server_t *s, const oi_loop_t *loop, int status)
{
    int stopping = atomic_load(&s->stopping);
    pthread_mutex_lock(&s->health_mu);
    prune(s, loop);
    for (oi_health_watch_t **pp = &s->watchers; *pp != NULL;) {
        oi_health_watch_t *w = *pp;
        if (w->call->loop != loop) {
            pp = &w->next;
            continue;
        }
        if (w->last != status && send_status(w->call, status) == 0)
            w->last = status;
        if (!stopping) {
            pp = &w->next;
            continue;
        }
        oi_grpc_finish(w->call, OI_GRPC_UNAVAILABLE, "the server is shutting down");
        *pp = w->next;
        oi_grpc_call_unref(w->call);
        free(w);
    }
    pthread_mutex_unlock(&s->health_mu);
}

typedef struct {
    oi_task_t task;
    oi_server_t *server;
    oi_loop_t *loop;
} health_task_t;

/* Whether `loop` has a watcher (that may still be open). */
static int has_watchers(oi_server_t *s, const oi_loop_t *loop)
{
    int any = 0;
    pthread_mutex_lock(&s->health_mu);
    for (oi_health_watch_t *w = s->watchers; w != NULL && !any; w = w->next)
        any = w->call->loop == loop;
    pthread_mutex_unlock(&s->health_mu);
    return any;
}

/* On the loop's thread: the models' answer for that loop's watchers. Counted in grpc_inflight
 * from the ask (as a control call of a client is), so the server's stop waits for it. */
static void finish_probe(oi_repo_call_t *rc)
{
    health_task_t *h = rc->ctx;
    oi_server_t *s = h->server;
    update_loop(s, h->loop, status_of(rc->status == NULL && rc->ready && oi__server_ready(s)));
    oi_repo_call_free(rc);
    free(h);
    atomic_fetch_sub(&s->grpc_inflight, 1);
}

/* Asks the models for the watchers of h->loop; 0, or -1 when it could not (h not taken). */
static int ask_for_watchers(health_task_t *h)
{
    oi_server_t *s = h->server;
    oi_repo_call_t *rc = oi_repo_call_new(OI_REPO_READY);
    if (rc == NULL)
        return -1;
    rc->version = -1;
    atomic_fetch_add(&s->grpc_inflight, 1);
    oi_status_t *st = oi__repo_submit(s, rc, h->loop, finish_probe, h);
    if (st == NULL)
        return 0;
    atomic_fetch_sub(&s->grpc_inflight, 1);
    oi_status_free(st);
    oi_repo_call_free(rc);
    return -1;
}

static void run_health_task(oi_task_t *t)
{
    health_task_t *h = (health_task_t *)t;
    oi_server_t *s = h->server;
    if (!must_ask(s) || atomic_load(&s->stopping) || !has_watchers(s, h->loop)) {
        update_loop(s, h->loop, current_status(s));
    } else if (ask_for_watchers(h) == 0) {
        return; /* finish_probe frees h */
    } else {
        update_loop(s, h->loop, status_of(0)); /* one that could not be asked is not ready */
    }
    free(h);
}

void oi_server_health_changed(oi_server_t *s)
{
    if (atomic_load(&s->stopping)) /* the stop tells the watchers itself */
        return;
    for (int i = 0; s->grpc != NULL && i < oi_http_server_nloops(s->http); i++) {
        health_task_t *h = calloc(1, sizeof(*h));
        if (h == NULL)
            return; /* watchers learn of it at the next change */
        h->task.run = run_health_task;
        h->server = s;
        h->loop = oi_http_server_loop(s->http, i);
        oi_loop_post(h->loop, &h->task);
    }
}

typedef struct {
    oi_server_t *server;
    oi_loop_t *loop;
} stop_arg_t;

static void stop_on_loop(void *arg)
{
    stop_arg_t *a = arg;
    update_loop(a->server, a->loop, current_status(a->server));
}

void oi__health_stop(oi_server_t *s)
{
    for (int i = 0; s->grpc != NULL && i < oi_http_server_nloops(s->http); i++) {
        stop_arg_t a = {s, oi_http_server_loop(s->http, i)};
        oi_loop_call(a.loop, stop_on_loop, &a);
    }
}
