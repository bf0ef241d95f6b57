/* gRPC-over-HTTP/2 wire facts that need no connection: status codes, the grpc-timeout header,
 * grpc-message percent-encoding and the 5-byte message prefix. Pure functions. */
#ifndef OI_TRANSPORT_GRPC_H
#define OI_TRANSPORT_GRPC_H

#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"

/* gRPC status codes (the subset this server sends). */
enum {
    OI_GRPC_OK = 0,
    OI_GRPC_CANCELLED = 1,
    OI_GRPC_UNKNOWN = 2,
    OI_GRPC_INVALID_ARGUMENT = 3,
    OI_GRPC_DEADLINE_EXCEEDED = 4,
    OI_GRPC_NOT_FOUND = 5,
    OI_GRPC_ALREADY_EXISTS = 6,
    OI_GRPC_PERMISSION_DENIED = 7,
    OI_GRPC_RESOURCE_EXHAUSTED = 8,
    OI_GRPC_FAILED_PRECONDITION = 9,
    OI_GRPC_UNIMPLEMENTED = 12,
    OI_GRPC_INTERNAL = 13,
    OI_GRPC_UNAVAILABLE = 14,
    OI_GRPC_UNAUTHENTICATED = 16,
};

/* The gRPC status for one of the server's HTTP-numbered status codes (core/status.h): the
 * same-named code where there is one (400 INVALID_ARGUMENT, 404 NOT_FOUND, 503 UNAVAILABLE,
 * 500 INTERNAL, 501 UNIMPLEMENTED), else the nearest in meaning. */
int oi_grpc_status_from_http(int code);

/* Parses a grpc-timeout value (1 to 8 digits and a unit: H, M, S, m, u or n) into whole
 * milliseconds, rounded up. 0, or -1 when malformed. */
int oi_grpc_parse_timeout(const char *v, size_t n, uint64_t *ms);

/* Appends `msg` percent-encoded as grpc-message wants it: bytes outside printable ASCII and
 * '%' become %XX. Returns 0 or -1 (out of memory). */
int oi_grpc_percent_encode(oi_sbuf_t *out, const char *msg);

/* Decodes a percent-encoded grpc-message of `n` bytes into `out` (room for n + 1 bytes),
 * NUL-terminated: %XX becomes its byte, a '%' not followed by two hex digits stays as it is
 * (gRPC asks receivers to be lenient). Returns the decoded length. */
size_t oi_grpc_percent_decode(const char *in, size_t n, char *out);

/* Writes the 5-byte message prefix: compressed flag 0, big-endian length. */
void oi_grpc_put_prefix(uint8_t out[5], uint32_t len);

#endif
