#include "server/server_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/thread.h"
#include "llhttp.h"
#include "server/observe/statistics.h"
#include "transport/hdr_forward.h"

#include <arpa/inet.h>
#include <netinet/in.h>

/* ---- the access log ---------------------------------------------------------------------- */

static void copy_text(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* The transports' hooks, on loop threads: a record per answer, formatted by the writer. */
static void http_answered(void *ctx, const oi_http_request_t *req, const oi_http_answer_t *a)
{
    oi_server_t *s = ctx;
    if (s->access_log == NULL)
        return;
    oi_access_rec_t rec = {.status = a->status, .bytes_in = a->bytes_in, .bytes_out = a->bytes_out};
    if (a->peer != NULL) {
        rec.peer = *a->peer;
        rec.has_peer = 1;
    }
    if (req->method >= 0) /* -1: the request line never got that far */
        copy_text(rec.method, sizeof(rec.method), llhttp_method_name((llhttp_method_t)req->method));
    copy_text(rec.target, sizeof(rec.target), req->path);
    oi_access_rec_stamp(&rec, a->start_ns);
    oi_access_log_push(s->access_log, &rec);
}

static void grpc_finished(void *ctx, oi_grpc_call_t *call, int grpc_status)
{
    oi_server_t *s = ctx;
    if (s->access_log == NULL)
        return;
    oi_access_rec_t rec = {.grpc = 1, .status = grpc_status, .bytes_in = call->bytes_in, .bytes_out = call->bytes_sent};
    const oi_peer_addr_t *peer = oi_grpc_call_addr(call);
    if (peer != NULL) {
        rec.peer = *peer;
        rec.has_peer = 1;
    }
    const char *rpc = strrchr(call->method, '/');
    copy_text(rec.method, sizeof(rec.method), rpc ? rpc + 1 : call->method);
    copy_text(rec.target, sizeof(rec.target), call->log_model);
    copy_text(rec.version, sizeof(rec.version), call->log_version);
    oi_access_rec_stamp(&rec, call->start_ns);
    oi_access_log_push(s->access_log, &rec);
}

/* ---- the trace extension ------------------------------------------------------------------ */

int oi_server_trace_set(oi_server_t *s, const char *model, int clear, int level, uint32_t rate, int32_t count,
                        uint32_t log_frequency)
{
    if (s->tracer == NULL)
        return -1;
    return oi_tracer_set(s->tracer, model, clear, level, rate, count, log_frequency);
}

int32_t oi_server_trace_count(oi_server_t *s, const char *model)
{
    return s->tracer != NULL ? oi_tracer_count(s->tracer, model) : -1;
}

/* ---- life cycle --------------------------------------------------------------------------- */

/* Whether `host` names only this machine: 127.0.0.0/8, ::1, or localhost. */
static int is_loopback(const char *host)
{
    if (host == NULL) /* the transport's default, 127.0.0.1 */
        return 1;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return strcmp(host, "localhost") == 0;
}

/* Compiles the header forward patterns into `s` (the transports borrow them). 0, or -1 when
 * regcomp fails (then neither pattern is set: free_forward has nothing to free). */
static int compile_forward(oi_server_t *s)
{
    int http_bad = s->cfg.http_forward_pattern != NULL &&
                   oi_hdr_forward_compile(&s->http_forward, s->cfg.http_forward_pattern) != 0;
    if (http_bad || (s->cfg.grpc_forward_pattern != NULL &&
                     oi_hdr_forward_compile(&s->grpc_forward, s->cfg.grpc_forward_pattern) != 0)) {
        if (s->cfg.http_forward_pattern != NULL && !http_bad)
            regfree(&s->http_forward);
        s->cfg.http_forward_pattern = s->cfg.grpc_forward_pattern = NULL;
        return -1;
    }
    s->cfg.http.forward_headers = s->cfg.http_forward_pattern != NULL ? &s->http_forward : NULL;
    return 0;
}

static void free_forward(oi_server_t *s)
{
    if (s->cfg.http_forward_pattern != NULL)
        regfree(&s->http_forward);
    if (s->cfg.grpc_forward_pattern != NULL)
        regfree(&s->grpc_forward);
}

oi_server_t *oi_server_new(const oi_server_config_t *cfg)
{
    oi_server_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->cfg = *cfg;
    s->cfg.http_restricted = s->cfg.grpc_restricted = NULL; /* borrowed: the copies below stay */
    int restricted_bad = (cfg->http_restricted && oi_restricted_copy(&s->http_restricted, cfg->http_restricted) != 0) ||
                         (cfg->grpc_restricted && oi_restricted_copy(&s->grpc_restricted, cfg->grpc_restricted) != 0);
    s->cfg.http.capture_headers = (const char *const *)s->http_restricted.names;
    s->cfg.http.n_capture_headers = s->http_restricted.n_names;
    s->start_ns = oi_now_ns();
    s->cfg.max_inflight_body_bytes = cfg->max_inflight_body_bytes ? cfg->max_inflight_body_bytes
                                                                   : oi_budget_default_limit();
    s->body_budget = oi_budget_new(s->cfg.max_inflight_body_bytes, "max_inflight_body_bytes");
    s->cfg.http.body_budget = s->body_budget;
    int forward_bad = compile_forward(s) != 0;
    pthread_mutex_init(&s->health_mu, NULL);
    oi_registry_init(&s->registry);
    oi_shm_init(&s->shm, cfg->allow_shared_memory < 0 ? is_loopback(cfg->http.host) : cfg->allow_shared_memory != 0);
    if (cfg->access_log != NULL || cfg->trace_file != NULL) /* both need the requests' start */
        s->cfg.http.on_answered = http_answered;
    s->http = oi_http_server_new(&s->cfg.http, oi__http_api_handle, s);
    int grpc = s->cfg.grpc_port >= 0 || s->cfg.grpc_unix_path != NULL;
    if (grpc) {
        s->grpc_captured[OI_GRPC_ERROR_SLOT] = OI_GRPC_ERROR_HEADER;
        for (int i = 0; i < s->grpc_restricted.n_names; i++)
            s->grpc_captured[i + 1] = s->grpc_restricted.names[i];
        oi_h2_config_t h2 = {
            .host = s->cfg.grpc_host != NULL ? s->cfg.grpc_host : s->cfg.http.host,
            .port = s->cfg.http.inline_loop ? -1 : s->cfg.grpc_port,
            .listen_fd = s->cfg.grpc_listen_fd,
            .tls = s->cfg.grpc_tls,
            .unix_path = s->cfg.http.inline_loop ? NULL : s->cfg.grpc_unix_path,
            .unix_mode = s->cfg.http.unix_mode,
            .max_message_bytes = s->cfg.grpc_max_message_bytes ? s->cfg.grpc_max_message_bytes : (size_t)2 << 30,
            .message_budget = s->body_budget,
            .max_inflate_ratio = s->cfg.max_inflate_ratio,
            .message_min_rate = s->cfg.http.body_timeout_ms > 0 ? s->cfg.http.body_min_rate : 0,
            .message_grace_ms = s->cfg.http.body_timeout_ms,
            .max_connections = s->cfg.http.max_connections,
            .max_connections_per_peer = s->cfg.http.max_connections_per_peer,
            .preface_timeout_ms = s->cfg.http.first_byte_timeout_ms,
            .idle_timeout_ms = s->cfg.http.idle_timeout_ms,
            .max_queued_bytes = s->cfg.grpc_max_queued_bytes,
            .capture_headers = s->grpc_captured,
            .n_capture_headers = s->grpc_restricted.n_names + 1,
            .on_finished = cfg->access_log != NULL || cfg->trace_file != NULL ? grpc_finished : NULL,
            .forward_headers = cfg->grpc_forward_pattern != NULL ? &s->grpc_forward : NULL,
        };
        s->grpc = oi_h2_server_new(&h2, &oi__grpc_api_handler, s);
    }
    if (s->cfg.metrics_port >= 0) {
        /* Its own TCP listener with one loop thread: a scrape never waits behind inferences,
         * and they never wait behind it. Connection limits as for the API. */
        oi_http_config_t mcfg = s->cfg.http;
        mcfg.port = s->cfg.metrics_port;
        if (s->cfg.metrics_host != NULL)
            mcfg.host = s->cfg.metrics_host;
        mcfg.listen_fd = s->cfg.metrics_listen_fd;
        mcfg.unix_path = NULL;
        mcfg.threads = 1;
        mcfg.thread_name = "oi-metrics";
        mcfg.on_answered = NULL; /* scrapes are not API requests */
        mcfg.n_capture_headers = 0; /* nor restricted, as in tritonserver */
        mcfg.forward_headers = NULL; /* nor inference requests */
        s->metrics = oi_metrics_new(&s->cfg.metrics);
        s->metrics_http = s->metrics ? oi_http_server_new(&mcfg, oi__metrics_api_handle, s) : NULL;
    }
    if (cfg->response_cache_bytes > 0)
        s->cache = oi_rcache_new(cfg->response_cache_bytes);
    if (restricted_bad || forward_bad || s->body_budget == NULL || s->http == NULL || (grpc && s->grpc == NULL) ||
        (s->cfg.metrics_port >= 0 && s->metrics_http == NULL) || (cfg->response_cache_bytes > 0 && s->cache == NULL)) {
        oi_budget_release(s->body_budget);
        oi_rcache_free(s->cache);
        oi_http_server_free(s->metrics_http);
        oi_metrics_free(s->metrics);
        oi_http_server_free(s->http);
        oi_h2_server_free(s->grpc);
        oi_registry_destroy(&s->registry);
        oi_shm_destroy(&s->shm);
        free_forward(s);
        pthread_mutex_destroy(&s->health_mu);
        oi_restricted_free(&s->http_restricted);
        oi_restricted_free(&s->grpc_restricted);
        free(s);
        return NULL;
    }
    return s;
}

int oi_server_set_metadata(oi_server_t *s, const char *json, size_t len)
{
    oi_buf_t *b = oi_buf_new(len);
    if (b == NULL)
        return -1;
    memcpy(b->data, json, len);
    b->len = len;
    oi_buf_unref(s->metadata);
    s->metadata = b;
    return 0;
}

int oi_server_add_model(oi_server_t *s, oi_model_t *m)
{
    if (oi_registry_add(&s->registry, m) != 0)
        return -1;
    oi_server_health_changed(s); /* a version added while serving may change readiness */
    return 0;
}

void oi_server_set_repository(oi_server_t *s, oi_repo_handler_fn fn, void *ctx, void (*release)(void *ctx))
{
    if (s->repo_release)
        s->repo_release(s->repo_ctx);
    s->repo_fn = fn;
    s->repo_ctx = ctx;
    s->repo_release = release;
}

void oi_server_set_chat_renderer(oi_server_t *s, oi_chat_render_fn fn, void *ctx, void (*release)(void *ctx))
{
    if (s->chat_release)
        s->chat_release(s->chat_ctx);
    s->chat_fn = fn;
    s->chat_ctx = ctx;
    s->chat_release = release;
}

int oi_server_swap_models(oi_server_t *s, oi_model_t **add, size_t n_add, const char *const *remove_ns,
                          const char *const *remove_names, const int64_t *remove_versions, size_t n_remove,
                          oi_model_t ***retired, size_t *n_retired)
{
    if (oi_registry_swap(&s->registry, add, n_add, remove_ns, remove_names, remove_versions, n_remove, retired,
                         n_retired) != 0)
        return -1;
    oi_server_health_changed(s); /* loads and unloads change readiness */
    return 0;
}

int oi_server_start(oi_server_t *s, char *err, size_t errlen)
{
    if (s->cfg.access_log != NULL && s->access_log == NULL &&
        (s->access_log = oi_access_log_open(s->cfg.access_log, err, errlen)) == NULL)
        return UV_EINVAL;
    s->cfg.access_log = NULL; /* the caller's string is not ours to keep */
    if (s->cfg.trace_file != NULL && s->tracer == NULL &&
        (s->tracer = oi_tracer_open(s->cfg.trace_file, err, errlen)) == NULL)
        return UV_EINVAL;
    s->cfg.trace_file = NULL;
    int rc = oi_http_server_start(s->http, err, errlen);
    if (rc == 0 && s->metrics_http != NULL) {
        char merr[400];
        rc = oi_http_server_start(s->metrics_http, merr, sizeof(merr));
        if (rc != 0)
            snprintf(err, errlen, "metrics: %s", merr);
    }
    if (rc != 0 || s->grpc == NULL)
        return rc;
    /* gRPC connections live on the HTTP server's loops: one set of threads for both. */
    int n = oi_http_server_nloops(s->http);
    oi_loop_t **loops = calloc((size_t)n, sizeof(*loops));
    if (loops == NULL) {
        snprintf(err, errlen, "out of memory");
        return UV_ENOMEM;
    }
    for (int i = 0; i < n; i++)
        loops[i] = oi_http_server_loop(s->http, i);
    rc = oi_h2_server_start(s->grpc, loops, n, err, errlen);
    free(loops);
    return rc;
}

int oi_server_adopt(oi_server_t *s, int fd, int grpc)
{
    if (grpc)
        return s->grpc ? oi_h2_server_adopt(s->grpc, fd) : UV_EINVAL;
    return oi_http_server_adopt(s->http, fd);
}

oi_loop_t *oi_server_inline_loop(oi_server_t *s) { return oi_http_server_loop(s->http, 0); }

int oi_server_shm_allowed(const oi_server_t *s) { return s->shm.allowed; }

oi_registry_t *oi_server_registry(oi_server_t *s) { return &s->registry; }

int oi_server_counts_statistics(const oi_server_t *s) { return s->cfg.statistics; }

struct oi_rcache_s *oi_server_response_cache(oi_server_t *s) { return s->cache; }

int oi_server_port(const oi_server_t *s) { return oi_http_server_port(s->http); }

int oi_server_grpc_port(const oi_server_t *s) { return s->grpc ? oi_h2_server_port(s->grpc) : 0; }

int oi_server_metrics_port(const oi_server_t *s) { return s->metrics_http ? oi_http_server_port(s->metrics_http) : 0; }

int oi_server_set_custom_metrics(oi_server_t *s, const char *text, size_t len)
{
    return s->metrics ? oi_metrics_set_custom(s->metrics, text, len) : 0;
}

oi_status_t *oi__statistics_off(const oi_server_t *s)
{
    return s->cfg.statistics ? NULL : oi_status_new(OI_UNAVAILABLE, "the server does not support model statistics");
}

oi_buf_t *oi_server_statistics(oi_server_t *s, const char *name, const char *version, oi_status_t **err)
{
    oi_model_stats_t *items = NULL;
    size_t n = 0;
    *err = oi__statistics_off(s);
    if (*err == NULL)
        *err = oi_statistics_collect(&s->registry, name, version, &items, &n);
    if (*err != NULL)
        return NULL;
    oi_sbuf_t body = {0};
    oi_buf_t *b = oi_statistics_json(&body, items, n) == 0 ? oi_sbuf_detach(&body) : NULL;
    oi_statistics_release(items, n);
    if (b == NULL) {
        oi_sbuf_free(&body);
        *err = oi_status_new(OI_INTERNAL, "out of memory");
    }
    return b;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Whether requests are in flight: with a handler or a model, or (gRPC) a message still being
 * (de)compressed on a worker thread, whose completion will run on a loop. */
int oi_server_inflight(oi_server_t *s)
{
    return oi_http_server_inflight(s->http) + atomic_load(&s->grpc_inflight) +
           (s->grpc != NULL ? oi_h2_server_working(s->grpc) : 0);
}

static int inflight(oi_server_t *s) { return oi_server_inflight(s) > 0; }

static void wait_inflight(oi_server_t *s, uint64_t deadline)
{
    while (inflight(s) && now_ms() < deadline) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Requests in flight whose clients still wait for them (a cancelled one may still run). */
static int awaited(oi_server_t *s)
{
    return oi_http_server_inflight(s->http) - oi_http_server_orphans(s->http) > 0 ||
           atomic_load(&s->grpc_inflight) - atomic_load(&s->grpc_orphans) > 0 ||
           (s->grpc != NULL && oi_h2_server_working(s->grpc) > 0);
}

static void finish_stop(oi_server_t *s);

/* A stop whose time ran out while models still ran: waits for them on its own thread, then
 * frees what their completions would touch (loops, registry, regions). */
static void *reap(void *arg)
{
    oi_server_t *s = arg;
    while (inflight(s)) { /* a model may take minutes: no need to look often */
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    finish_stop(s);
    return NULL;
}

int oi__server_ready(oi_server_t *s)
{
    return !atomic_load(&s->stopping) && !atomic_load(&s->draining) &&
           (s->cfg.lax_readiness || oi_registry_all_ready(&s->registry));
}

static int asks_readiness(void *ctx, oi_model_t *m)
{
    (void)ctx;
    return m->ready_probe;
}

int oi__server_ready_asks(oi_server_t *s)
{
    return !s->cfg.lax_readiness && s->repo_fn != NULL &&
           oi_registry_visit_ready(&s->registry, NULL, asks_readiness, NULL) != 0;
}

void oi_server_drain(oi_server_t *s)
{
    if (s != NULL && !atomic_exchange(&s->draining, 1))
        oi_server_health_changed(s); /* Watch calls hear NOT_SERVING now */
}

void oi_server_stop(oi_server_t *s, uint64_t timeout_ms)
{
    if (s == NULL)
        return;
    /* Handlers that started before the flag finish before the barrier inside
     * stop_accepting; later ones see it and touch neither registry nor schedulers. */
    atomic_store(&s->stopping, 1);
    /* The metrics listener goes first: its handler answers at once (nothing in flight), and
     * once its loop has ended no scrape can read the registry that finish_stop destroys. */
    oi_http_server_free(s->metrics_http);
    s->metrics_http = NULL;
    oi_http_server_stop_accepting(s->http);
    if (s->grpc)
        oi_h2_server_stop_accepting(s->grpc); /* GOAWAY: calls under way go on */
    oi__health_stop(s);                       /* health watchers hear NOT_SERVING now, not when the loops end */
    /* Only for requests whose clients are still there: one whose client has gone is dropped
     * from its queue, and one its model still runs is left to the reaper below. */
    for (uint64_t deadline = now_ms() + timeout_ms; awaited(s) && now_ms() < deadline;) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (inflight(s)) {
        /* Time is up, or only requests whose clients have gone remain. Queued requests
         * fail with 503 through the usual path (their answers are posted to the loops ahead
         * of what follows); the transports then answer the ones a model is still running
         * with 503 / UNAVAILABLE themselves, and close. A
         * running model cannot be stopped, and its completion will touch the loops and the
         * registry: those stay until it is back, freed by a detached thread, so that the
         * caller returns now. */
        oi_registry_cancel_queued(&s->registry);
        static const char msg[] = "the server is shutting down: the model did not finish within the stop timeout";
        oi_http_server_abandon(s->http, 503, msg);
        if (s->grpc)
            oi_h2_server_abandon(s->grpc, msg);
        pthread_t t;
        if (inflight(s) && oi_thread_create(&t, "oi-stop-wait", reap, s, 1) == 0)
            return;
    }
    finish_stop(s);
}

/* Everything after the requests in flight are answered: executors, connections, loops. */
static void finish_stop(oi_server_t *s)
{
    /* Executors finish their current job; queued ones are failed with 503 and answered. */
    oi_registry_destroy(&s->registry);
    wait_inflight(s, now_ms() + 5000);
    while (atomic_load(&s->repo_calls) > 0) { /* control threads still leaving oi_loop_post */
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* gRPC connections close while the loops still run; the loops end with the HTTP server,
     * and only then may the gRPC server's memory go. */
    if (s->grpc)
        oi_h2_server_close(s->grpc);
    oi_http_server_free(s->http);
    oi_h2_server_free(s->grpc);
    oi_metrics_free(s->metrics);
    oi_access_log_close(s->access_log); /* the loops are gone: nothing pushes now */
    oi_tracer_close(s->tracer);
    oi_buf_unref(s->metadata);
    if (s->repo_release) /* every call is answered: the loops are gone */
        s->repo_release(s->repo_ctx);
    if (s->chat_release) /* likewise: no rendering runs once the loops are gone */
        s->chat_release(s->chat_ctx);
    /* After the loops: no request holds a region now, so each is unmapped here. */
    oi_shm_destroy(&s->shm);
    oi_rcache_free(s->cache);
    oi_budget_release(s->body_budget); /* a body a model still holds gives back to it later */
    free_forward(s);
    pthread_mutex_destroy(&s->health_mu);
    oi_restricted_free(&s->http_restricted);
    oi_restricted_free(&s->grpc_restricted);
    free(s);
}
