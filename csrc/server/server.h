/* The V2 server: routes HTTP requests to health, metadata and inference, runs inference
 * through the registry's schedulers and answers on the connection's loop thread. */
#ifndef OI_SERVER_SERVER_H
#define OI_SERVER_SERVER_H

#include "server/registry.h"
#include "transport/http1.h"
#include "transport/http2.h"

typedef struct oi_server_config_s {
    oi_http_config_t http;
    uint32_t max_json_depth;
    int grpc_port;                 /* gRPC on its own port, on the HTTP loops; -1: none over TCP */
    const char *grpc_unix_path;    /* gRPC on this Unix-domain socket too (mode http.unix_mode); NULL: none.
                                    * With neither a port nor a path, no gRPC at all */
    size_t grpc_max_message_bytes; /* largest gRPC request message; 0: 2 GiB */
    size_t grpc_max_queued_bytes;  /* see oi_h2_config_t.max_queued_bytes; 0: 64 MiB */
    /* --grpc-infer-response-compression-level: 0 none, 1 low, 2 medium, 3 high. Inference
     * responses are compressed for clients that accept it (see oi_grpc_call_compress). */
    int grpc_infer_compression_level;
    /* Whether clients may register shared-memory regions: 1 yes, 0 no, -1 (the default a
     * zeroed config does not give: set it) only when http.host is a loopback address, since a
     * region is memory of the server's own host. */
    int allow_shared_memory;
} oi_server_config_t;

typedef struct oi_server_s oi_server_t;

/* Returns a new, stopped server, or NULL when out of memory. */
oi_server_t *oi_server_new(const oi_server_config_t *cfg);

/* Sets the body of GET /v2 (copied). 0 or -1 (out of memory). */
int oi_server_set_metadata(oi_server_t *s, const char *json, size_t len);

/* Gives the server the caller's reference to `m`: 0, or -1 when that name and version are
 * already registered (the reference then stays the caller's). */
int oi_server_add_model(oi_server_t *s, oi_model_t *m);

/* Listens and starts the loops. 0, or an error with a message in `err`. */
int oi_server_start(oi_server_t *s, char *err, size_t errlen);

/* Whether this server accepts shared-memory registrations (the config, resolved). */
int oi_server_shm_allowed(const oi_server_t *s);

/* The bound HTTP port, 0 before start. */
int oi_server_port(const oi_server_t *s);

/* The bound gRPC port; 0 before start or without gRPC. */
int oi_server_grpc_port(const oi_server_t *s);

/* Stops accepting, waits up to `timeout_ms` for requests in flight, then stops every
 * executor, closes every connection and frees the server. When the time is up and requests
 * are still in flight, they are answered with 503 / UNAVAILABLE at once and this returns;
 * models still running finish on their own, and a detached thread frees the server after
 * them. Must be called without the GIL. */
void oi_server_stop(oi_server_t *s, uint64_t timeout_ms);

#endif
