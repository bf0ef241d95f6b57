/* The V2 server: routes HTTP requests to health, metadata and inference, runs inference
 * through the registry's schedulers and answers on the connection's loop thread. */
#ifndef OI_SERVER_SERVER_H
#define OI_SERVER_SERVER_H

#include "server/observe/metrics.h"
#include "server/models/registry.h"
#include "server/models/repository.h"
#include "server/restrict.h"
#include "transport/http1.h"
#include "transport/http2.h"

typedef struct oi_server_config_s {
    oi_http_config_t http;
    uint32_t max_json_depth;
    int grpc_port;                 /* gRPC on its own port, on the HTTP loops; -1: none over TCP */
    int grpc_listen_fd;            /* > 0: gRPC on this listening socket (see http.listen_fd) */
    oi_tls_ctx_t *grpc_tls;        /* gRPC over TCP speaks TLS with this (see oi_h2_config_t.tls); NULL: h2c */
    const char *grpc_unix_path;    /* gRPC on this Unix-domain socket too (mode http.unix_mode); NULL: none.
                                    * With neither a port nor a path, no gRPC at all */
    size_t grpc_max_message_bytes; /* largest gRPC request message; 0: 2 GiB */
    size_t grpc_max_queued_bytes;  /* see oi_h2_config_t.max_queued_bytes; 0: 64 MiB */
    /* The budget for request bodies and gRPC request messages in flight, as received and as
     * inflated (core/budget.h): past it, HTTP 503 / RESOURCE_EXHAUSTED. 0: the default,
     * oi_budget_default_limit() (half of the memory the process may use). */
    size_t max_inflight_body_bytes;
    unsigned max_inflate_ratio; /* inflated bytes per compressed byte (oi_inflate_limit_t.max_ratio); 0: none */
    /* --grpc-infer-response-compression-level: 0 none, 1 low, 2 medium, 3 high. Inference
     * responses are compressed for clients that accept it (see oi_grpc_call_compress). */
    int grpc_infer_compression_level;
    /* Whether clients may register shared-memory regions: 1 yes, 0 no, -1 (the default a
     * zeroed config does not give: set it) only when http.host is a loopback address, since a
     * region is memory of the server's own host. */
    int allow_shared_memory;
    /* Whether inferences are counted (the statistics extension and the per-model metrics);
     * 0 leaves the request path without counters or clock reads. */
    int statistics;
    int metrics_port;            /* Prometheus /metrics on its own listener (0 picks a free
                                  * port), on metrics_host; -1: none */
    const char *metrics_host;    /* --metrics-address; NULL: http.host, as tritonserver defaults it */
    const char *grpc_host;       /* --grpc-address; NULL: http.host */
    /* tritonserver's --http-header-forward-pattern and --grpc-header-forward-pattern (POSIX
     * extended regular expressions, matched case-insensitively): request headers whose names
     * match reach the model as string request parameters. NULL: none. Compiled by
     * oi_server_new, which fails on one regcomp refuses (check it first). */
    const char *http_forward_pattern;
    const char *grpc_forward_pattern;
    /* tritonserver's --strict-readiness false: the server is ready once it serves, whatever
     * its models' state. 0 (the default): ready only while every model is ready. */
    int lax_readiness;
    int metrics_listen_fd;       /* > 0: /metrics on this listening socket (see http.listen_fd) */
    oi_metrics_config_t metrics; /* what /metrics shows */
    /* The access log's file ("-": standard output), opened by oi_server_start, which is the
     * last to read this pointer; NULL: no access log, and requests take no timestamps. */
    const char *access_log;
    const char *trace_file; /* the trace extension's file (NULL: no tracing); copied at start */
    /* --http-restricted-api and --grpc-restricted-protocol (the gRPC headers with Triton's
     * "triton-grpc-protocol-" prefix already on): borrowed until oi_server_new, which copies
     * them; NULL: nothing restricted. Legacy and generate routes share their protocol's. */
    const oi_restricted_t *http_restricted;
    const oi_restricted_t *grpc_restricted;
    size_t response_cache_bytes; /* --cache-config local,size=N: the response cache's capacity;
                                  * 0: no cache (models that enable one run uncached, as Triton) */
} oi_server_config_t;

typedef struct oi_server_s oi_server_t;

/* Returns a new, stopped server, or NULL when out of memory. */
oi_server_t *oi_server_new(const oi_server_config_t *cfg);

/* Sets the body of GET /v2 (copied). 0 or -1 (out of memory). */
int oi_server_set_metadata(oi_server_t *s, const char *json, size_t len);

/* Gives the server the caller's reference to `m`: 0, or -1 when that name and version are
 * already registered (the reference then stays the caller's). Once serving, health watchers
 * hear of the change (oi_server_health_changed). */
int oi_server_add_model(oi_server_t *s, oi_model_t *m);

/* Serves the model repository extension through `fn` (see server/models/repository.h), which runs
 * on control threads, never a loop thread. `release` (may be NULL) is called once on `ctx`
 * when the server is freed, after the last call has been answered. Call before start. */
void oi_server_set_repository(oi_server_t *s, oi_repo_handler_fn fn, void *ctx, void (*release)(void *ctx));

/* Renders a chat request's "messages" (messages[0 .. len), a JSON array) into the prompt text
 * of version `version` of model `model` with the model's chat template, appending it to
 * `prompt`: NULL, or a status (400 when the messages or the model cannot make a prompt). Runs
 * on libuv's worker threads, never a loop thread, for /v1/chat/completions. */
typedef oi_status_t *(*oi_chat_render_fn)(void *ctx, const char *model, int64_t version, const char *messages,
                                          size_t len, oi_sbuf_t *prompt);

/* Serves /v1/chat/completions through `fn` (without one, only /v1/completions answers);
 * `release` (may be NULL) is called once on `ctx` when the server is freed. Call before start. */
void oi_server_set_chat_renderer(oi_server_t *s, oi_chat_render_fn fn, void *ctx, void (*release)(void *ctx));

/* Swaps registry entries in one step as oi_registry_swap does (loads and unloads); the entries
 * that left come back in *retired for the caller to end with oi_model_retire, which waits for
 * their requests in flight. Returns 0, or -1 when out of memory (nothing changed). */
int oi_server_swap_models(oi_server_t *s, oi_model_t **add, size_t n_add, const char *const *remove_ns,
                          const char *const *remove_names, const int64_t *remove_versions, size_t n_remove,
                          oi_model_t ***retired, size_t *n_retired);

/* Tells the grpc.health.v1 Watch calls that readiness may have changed (a model version was
 * loaded, unloaded or failed): each gets the new status if it differs from what it last got.
 * Safe from any thread, loop threads included; returns at once. */
void oi_server_health_changed(oi_server_t *s);

/* Starts a drain, for a rolling update: from now on server readiness (HTTP, gRPC ServerReady,
 * grpc.health.v1) is false, so load balancers stop sending new work, while connections are
 * still accepted and every request is served as before until oi_server_stop. Safe from any
 * thread; idempotent. */
void oi_server_drain(oi_server_t *s);

/* Listens and starts the loops. 0, or an error with a message in `err`. */
int oi_server_start(oi_server_t *s, char *err, size_t errlen);

/* The trace extension's sampling settings of `model` (NULL: the global ones), as
 * oi_tracer_set takes them; after start, from the application's control thread. -1 without a
 * trace file or when out of room. */
int oi_server_trace_set(oi_server_t *s, const char *model, int clear, int level, uint32_t rate, int32_t count,
                        uint32_t log_frequency);

/* The traces `model` (NULL: globally) may still take; -1: no limit (or no trace file). */
int32_t oi_server_trace_count(oi_server_t *s, const char *model);

/* For tests and fuzz targets, on a server whose config sets http.inline_loop: the one loop,
 * which the caller runs on its own thread after oi_server_start (nothing listens), and the
 * connections it serves there: the connected stream socket `fd` (a socketpair end), taken on
 * success, is served as HTTP/1.1, or as gRPC when `grpc`, as if accepted. 0 or a libuv error. */
oi_loop_t *oi_server_inline_loop(oi_server_t *s);
int oi_server_adopt(oi_server_t *s, int fd, int grpc);

/* Requests with a handler and not yet answered: HTTP requests and gRPC inferences. */
int oi_server_inflight(oi_server_t *s);

/* Whether this server accepts shared-memory registrations (the config, resolved). */
int oi_server_shm_allowed(const oi_server_t *s);

/* For backends that run the server's other models (ensembles): its registry (borrowed; it
 * outlives every model in it) and whether inferences are counted (config.statistics). */
oi_registry_t *oi_server_registry(oi_server_t *s);
int oi_server_counts_statistics(const oi_server_t *s);

/* The response cache (config.response_cache_bytes > 0), borrowed: it outlives every model;
 * NULL when the server has none. */
struct oi_rcache_s *oi_server_response_cache(oi_server_t *s);

/* The bound HTTP port, 0 before start. */
int oi_server_port(const oi_server_t *s);

/* The bound gRPC port; 0 before start or without gRPC. */
int oi_server_grpc_port(const oi_server_t *s);

/* The bound metrics port; 0 before start or without metrics. */
int oi_server_metrics_port(const oi_server_t *s);

/* The models' own metric families for /metrics (see oi_metrics_set_custom); a server without
 * metrics ignores them. 0, or -1 when out of memory. */
int oi_server_set_custom_metrics(oi_server_t *s, const char *text, size_t len);

/* Triton's statistics body for `name` and `version` (see oi_statistics_collect) in a new
 * buffer, or NULL with a status: the 400s of the selection, 503 when the server counts no
 * statistics. For the Python API; the endpoints answer the same. */
oi_buf_t *oi_server_statistics(oi_server_t *s, const char *name, const char *version, oi_status_t **err);

/* Stops accepting, waits up to `timeout_ms` for requests in flight, then stops every
 * executor, closes every connection and frees the server. When the time is up and requests
 * are still in flight, they are answered with 503 / UNAVAILABLE at once and this returns;
 * models still running finish on their own, and a detached thread frees the server after
 * them. Must be called without the GIL. */
void oi_server_stop(oi_server_t *s, uint64_t timeout_ms);

#endif
