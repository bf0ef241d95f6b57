/* The server's state, shared by its own files (server.c and one file per protocol); nothing
 * outside csrc/server includes this. */
#ifndef OI_SERVER_SERVER_IMPL_H
#define OI_SERVER_SERVER_IMPL_H

#include <stdatomic.h>

#include "server/server.h"
#include "server/shm.h"

struct oi_server_s {
    oi_server_config_t cfg;
    atomic_int stopping; /* set before the loops' barrier in oi_server_stop */
    oi_registry_t registry;
    oi_http_server_t *http;
    oi_h2_server_t *grpc;     /* NULL without gRPC */
    atomic_int grpc_inflight; /* gRPC inferences submitted and not yet answered */
    atomic_int grpc_orphans;  /* of those, the ones whose call ended first (cancelled) */
    oi_buf_t *metadata;
    oi_shm_t shm; /* registered shared-memory regions */
};

/* The HTTP/1.1 handler: routes the V2 REST API (http_api.c). */
void oi__http_api_handle(void *server, oi_http_request_t *req);

/* The gRPC service handler (grpc_api.c); its context is the server. */
extern const oi_grpc_handler_t oi__grpc_api_handler;

#endif
