/* A blocking gRPC client connection for the Python client and the benchmarks: HTTP/2 over
 * cleartext TCP with prior knowledge (h2c) on nghttp2 (which frames; the socket I/O is ours).
 * A wait with a deadline is a poll() bounded by it; without one it is the recv itself (the
 * socket blocks; every read or write that must not wait passes MSG_DONTWAIT), so a call costs
 * one sendmsg and one recv.
 *
 * A call is one HTTP/2 stream. Request messages leave from the caller's memory (DATA frames
 * written with sendmsg straight from the iovecs given, no copy); each response message is
 * reassembled into one buffer sized from its 5-byte prefix, and DATA payload that continues a
 * message is received from the socket straight into that buffer. Windows are opened wide (the
 * server may send messages up to 4 GiB) and frames may be 16 MiB. Status comes from the
 * trailers (or a Trailers-Only answer) with grpc-message percent-decoded; a call with a
 * timeout sends grpc-timeout and stops waiting at its deadline, cancelling the stream (the
 * connection stays usable).
 *
 * Not thread-safe: one thread uses a connection and its calls at a time (the Python Client
 * pools connections). Several calls may be open at once on one connection: whichever of them
 * waits moves them all forward. A connection that failed is reopened by the next call. */
#ifndef OI_CLIENT_GRPC_CLIENT_H
#define OI_CLIENT_GRPC_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "client/tls_client.h"
#include "core/buf.h"

typedef struct oi_grpc_client_s oi_grpc_client_t;
typedef struct oi_grpc_client_call_s oi_grpc_client_call_t;

/* What the waiting functions return besides 0: the call has ended (its status says how), the
 * connection failed (message in `err`; open calls on it are cut), the call's deadline passed
 * (the stream is cancelled), or nothing arrived yet when asked not to wait. */
enum {
    OI_GRPC_CLIENT_ENDED = 1,
    OI_GRPC_CLIENT_ERROR = -1,
    OI_GRPC_CLIENT_TIMEOUT = -2,
    OI_GRPC_CLIENT_AGAIN = -3,
};

/* Returns a new connection to host:port (connected on first use), or NULL (out of memory).
 * `host` is a numeric address or a name. */
oi_grpc_client_t *oi_grpc_client_new(const char *host, int port);

/* Speaks TLS (grpcs) with `cfg` (copied; ALPN h2) from the next connection on; call before the
 * first call. 0 or -1 (out of memory). */
int oi_grpc_client_set_tls(oi_grpc_client_t *c, const oi_ctls_config_t *cfg);

/* Closes the connection and frees it. Calls still open must be freed first. */
void oi_grpc_client_free(oi_grpc_client_t *c);

/* Starts a call of `method` (a path such as "/inference.GRPCInferenceService/ModelInfer"),
 * connecting first when needed: its request headers go out with its first message.
 * timeout_ms > 0 gives the call a deadline, sent as grpc-timeout, at which every wait on the
 * call ends. Returns a new call (free it with oi_grpc_client_call_free), or NULL with *rc set to
 * OI_GRPC_CLIENT_ERROR or OI_GRPC_CLIENT_TIMEOUT and a message in `err`. */
oi_grpc_client_call_t *oi_grpc_client_call_start(oi_grpc_client_t *c, const char *method, int64_t timeout_ms, int *rc,
                                                 char *err, size_t errlen);

/* Sends one request message, the concatenation of parts[0 .. nparts), with the client's last
 * message when `last` is set (END_STREAM). Borrows the parts: returns only once every byte has
 * been written to the socket or will never be, reading what arrives meanwhile (responses are
 * queued for oi_grpc_client_call_recv). Returns 0; OI_GRPC_CLIENT_ENDED when the call ended
 * before the message could go (the server answered early); OI_GRPC_CLIENT_ERROR;
 * OI_GRPC_CLIENT_TIMEOUT. */
int oi_grpc_client_call_send(oi_grpc_client_call_t *call, const struct iovec *parts, int nparts, int last, char *err,
                             size_t errlen);

/* Ends the client's side of the call without a message (END_STREAM); returns like
 * oi_grpc_client_call_send. */
int oi_grpc_client_call_close_send(oi_grpc_client_call_t *call, char *err, size_t errlen);

/* Waits for the next response message, until the call's deadline, or not at all with
 * `nowait`. Returns 0 with *msg set (a new reference to the whole message, without its
 * prefix); OI_GRPC_CLIENT_ENDED when the call has ended and every message was taken (see
 * oi_grpc_client_call_status); OI_GRPC_CLIENT_ERROR; OI_GRPC_CLIENT_TIMEOUT;
 * OI_GRPC_CLIENT_AGAIN (nowait, nothing yet). */
int oi_grpc_client_call_recv(oi_grpc_client_call_t *call, int nowait, oi_buf_t **msg, char *err, size_t errlen);

/* The gRPC status of an ended call, with its grpc-message in *message (percent-decoded,
 * NUL-terminated, "" when none; borrowed from the call). Before the end: -1. A stream that
 * ended without grpc-status gets the status gRPC prescribes for how it ended (RST_STREAM
 * codes, HTTP statuses, a message cut short). */
int oi_grpc_client_call_status(const oi_grpc_client_call_t *call, const char **message);

/* Cancels the call when it is still open (RST_STREAM CANCEL) and frees it. NULL is ignored. */
void oi_grpc_client_call_free(oi_grpc_client_call_t *call);

/* A whole unary call: start, send the one request message, receive the one response and the
 * status. A call that a connection closing under it refused before any answer (GOAWAY, or an
 * idle connection the server had closed) is made once more on a new connection. Returns 0 with
 * *grpc_status, *response (a new reference when the status is OK, else NULL) and *message (a
 * new malloc'd string, or NULL when the status has none); OI_GRPC_CLIENT_ERROR or
 * OI_GRPC_CLIENT_TIMEOUT with a message in `err`. */
int oi_grpc_client_unary(oi_grpc_client_t *c, const char *method, const struct iovec *parts, int nparts,
                         int64_t timeout_ms, oi_buf_t **response, int *grpc_status, char **message, char *err,
                         size_t errlen);

#endif
