/* The server's state, shared by its own files (server.c and one file per protocol); nothing
 * outside csrc/server includes this. */
#ifndef OI_SERVER_SERVER_IMPL_H
#define OI_SERVER_SERVER_IMPL_H

#include <pthread.h>
#include <regex.h>
#include <stdatomic.h>

#include "server/observe/access_log.h"
#include "server/observe/trace.h"
#include "server/models/repository.h"
#include "server/sched/response_cache.h"
#include "server/server.h"
#include "server/shm/shm.h"

typedef struct oi_health_watch_s oi_health_watch_t;

/* Triton's stream option: metadata "triton_grpc_error: true" on ModelStreamInfer ends the
 * stream with an error's status (grpc/infer_handler.h); the transport keeps its value in this
 * slot of a call's headers. */
#define OI_GRPC_ERROR_HEADER "triton_grpc_error"
#define OI_GRPC_ERROR_SLOT 0

struct oi_server_s {
    oi_server_config_t cfg;
    atomic_int stopping; /* set before the loops' barrier in oi_server_stop */
    atomic_int draining; /* set by oi_server_drain: not ready, still serving */
    oi_registry_t registry;
    oi_http_server_t *http;
    oi_h2_server_t *grpc;     /* NULL without gRPC */
    atomic_int grpc_inflight; /* gRPC inferences submitted and not yet answered */
    atomic_int grpc_orphans;  /* of those, the ones whose call ended first (cancelled) */
    atomic_uint_fast64_t grpc_sessions; /* the last session id given to a stream's sequences */
    oi_buf_t *metadata;
    oi_shm_t shm; /* registered shared-memory regions */
    oi_budget_t *body_budget; /* request bodies and messages in flight (cfg.max_inflight_body_bytes);
                               * released when the server goes, freed with the last body */
    struct oi_rcache_s *cache; /* the response cache; NULL: none */
    /* Model repository control: the application's handler, and the calls it is running
     * (each also counts as a request in flight of its transport until answered). */
    oi_repo_handler_fn repo_fn; /* NULL: the extension is not served */
    void *repo_ctx;
    void (*repo_release)(void *ctx);
    atomic_int repo_calls;
    oi_chat_render_fn chat_fn; /* /v1/chat/completions' template renderer; NULL: none */
    void *chat_ctx;
    void (*chat_release)(void *ctx);
    pthread_mutex_t health_mu;   /* guards `watchers` (grpc_health.c) */
    oi_health_watch_t *watchers; /* open grpc.health.v1 Watch calls */
    oi_http_server_t *metrics_http; /* the /metrics listener, one loop thread; NULL without */
    oi_metrics_t *metrics;          /* touched on that loop thread only, after start */
    oi_access_log_t *access_log;    /* set by start before any loop runs; NULL without */
    oi_tracer_t *tracer;            /* the trace file's: set by start before any loop runs; NULL without */
    uint64_t start_ns;              /* oi_now_ns() when made: the legacy API's uptime */
    atomic_uint_fast64_t legacy_ids; /* the last RequestStatus id the legacy API gave */
    oi_restricted_t http_restricted; /* copies of the config's; the transports keep their headers */
    oi_restricted_t grpc_restricted;
    /* The gRPC metadata the transport keeps for the handlers: OI_GRPC_ERROR_HEADER first
     * (OI_GRPC_ERROR_SLOT), then grpc_restricted.names. */
    const char *grpc_captured[OI_API_COUNT + 1];
    regex_t http_forward, grpc_forward; /* compiled cfg.*_forward_pattern, where set */
};

/* Server readiness as health endpoints report it: every model's default version ready, and
 * the server neither draining nor stopping. */
int oi__server_ready(oi_server_t *s);
/* Whether, beyond oi__server_ready, the server's readiness must ask the application: strict
 * readiness and a ready version that answers its own (oi_model_t.ready_probe), as Triton's
 * strict readiness asks each model's instances. Then a ready check runs OI_REPO_READY with no
 * model on a control thread. */
int oi__server_ready_asks(oi_server_t *s);

/* The HTTP/1.1 handler: routes the V2 REST API (http_api.c). */
void oi__http_api_handle(void *server, oi_http_request_t *req);

/* The legacy v1 API's routes (/api/..., legacy_http.c): answers and returns 1 for a path
 * under /api, else returns 0 and leaves the request alone. */
int oi__legacy_http_handle(oi_server_t *s, oi_http_request_t *req);

/* The restricted-API groups (OI_API_BIT mask) of a legacy path (what follows "/api/") and of a
 * legacy RPC (call->kind), for the routes' one check: status shows metadata, configuration
 * and statistics, so it needs all three; ModelControl and Repository count as model-repository. */
unsigned oi__legacy_http_groups(const char *path);

/* A legacy request refused by a restriction: 403, with `message` in NV-Status (UNAVAILABLE,
 * what a 1.x client reads) and in the JSON body. */
void oi__legacy_http_refuse(oi_server_t *s, oi_http_request_t *r, const char *message);
unsigned oi__legacy_grpc_groups(int kind);

/* The legacy GRPCService (legacy_grpc.c), on the V2 gRPC port. oi__legacy_grpc_call returns 1
 * when the call is one of its methods (setting call->kind to OI__LEGACY_RPC_BASE or more), and
 * grpc_api.c then hands that call's events to the other three (message: takes msg). */
#define OI__LEGACY_RPC_BASE 1000
int oi__legacy_grpc_call(oi_server_t *s, oi_grpc_call_t *call);
void oi__legacy_grpc_message(oi_server_t *s, oi_grpc_call_t *call, oi_buf_t *msg);
void oi__legacy_grpc_half_close(oi_server_t *s, oi_grpc_call_t *call);
void oi__legacy_grpc_gone(oi_server_t *s, oi_grpc_call_t *call);

/* The metrics listener's handler: GET /metrics (metrics_api.c). */
void oi__metrics_api_handle(void *server, oi_http_request_t *req);

/* The 503 that statistics requests get from a server that counts none, or NULL. */
oi_status_t *oi__statistics_off(const oi_server_t *s);

/* The gRPC service handler (grpc_api.c); its context is the server. */
extern const oi_grpc_handler_t oi__grpc_api_handler;

/* Runs a repository call on a control thread; `done` comes back on `loop`. Returns NULL when
 * started, or a status (501 without a handler, 503 when too many are running) and then never
 * calls `done`. */
oi_status_t *oi__repo_submit(oi_server_t *s, oi_repo_call_t *call, oi_loop_t *loop, oi_repo_done_cb done, void *ctx);

/* grpc.health.v1.Health Check or Watch (oi_grpc_call_t.kind) with its request message, on the
 * call's loop thread (grpc_health.c). */
void oi__health_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg);

/* For oi_server_stop, once `stopping` is set and the listeners are closed: sends NOT_SERVING
 * to every Watch and ends it with UNAVAILABLE, one loop at a time (from outside the loops). */
void oi__health_stop(oi_server_t *s);

/* POST /v2/models/{m}[/versions/{v}]/generate (`stream` 0) or /generate_stream (1), Triton's
 * generate extension, on the request's loop thread (generate_api.c). Takes the reference to
 * `m`. */
void oi__http_generate(oi_server_t *s, oi_http_request_t *r, oi_model_t *m, int stream);

/* Copies the URL path segment [p, end) percent-decoded into out (NUL-terminated): 0, or -1
 * when it is empty, too long or badly encoded (http_api.c). */
int oi__http_decode_segment(const char *p, const char *end, char *out, size_t cap);

/* OpenAI's API under /v1 (openai_api.c), on the request's loop thread. */
void oi__http_openai(oi_server_t *s, oi_http_request_t *r);

#endif
