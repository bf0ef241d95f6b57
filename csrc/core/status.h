/* Error values that travel from codecs, the scheduler and backends to a transport. */
#ifndef OI_CORE_STATUS_H
#define OI_CORE_STATUS_H

#include <stddef.h>

/* Codes are HTTP status numbers; the gRPC layer maps them to same-named gRPC codes. */
enum {
    OI_OK = 0,
    OI_BAD_REQUEST = 400,
    OI_NOT_FOUND = 404,
    OI_METHOD_NOT_ALLOWED = 405,
    OI_TIMEOUT = 408,
    OI_TOO_LARGE = 413,
    OI_UNSUPPORTED_MEDIA = 415,
    OI_HEADERS_TOO_LARGE = 431,
    OI_CLIENT_CLOSED = 499, /* the client went away or cancelled (gRPC CANCELLED); nothing is sent */
    OI_INTERNAL = 500,
    OI_UNIMPLEMENTED = 501,
    OI_UNAVAILABLE = 503,
    /* Triton's UNKNOWN, ALREADY_EXISTS and CANCELLED errors (a Triton Python model's response
     * error): its HTTP front answers each 400 (http_server.cc), its gRPC front the code of the
     * same name (grpc_utils.cc); OI_HTTP_STATUS gives the HTTP status of any code. */
    OI_TRITON_UNKNOWN = 1400,
    OI_TRITON_ALREADY_EXISTS = 2400,
    OI_TRITON_CANCELLED = 3400,
};

/* The HTTP status a code is answered with. */
#define OI_HTTP_STATUS(code) ((code) % 1000)

/* Whether `code` is an error code a model may give its failure (an HTTP error status or one of
 * Triton's codes above). */
static inline int oi_status_code_valid(long code)
{
    return (code >= 400 && code <= 599) || code == OI_TRITON_UNKNOWN || code == OI_TRITON_ALREADY_EXISTS ||
           code == OI_TRITON_CANCELLED;
}

/* A failure with a human-readable message. Functions return NULL for success or a new
 * status that the caller owns and frees with oi_status_free. */
typedef struct oi_status_s {
    int code;
    char *message; /* NUL-terminated, owned */
} oi_status_t;

/* Returns a new status with a printf-formatted message; never NULL (falls back to a static
 * out-of-memory status that oi_status_free ignores). */
oi_status_t *oi_status_new(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Frees a status returned by oi_status_new; NULL is ignored. */
void oi_status_free(oi_status_t *st);

#endif
