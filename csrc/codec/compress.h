/* gzip and deflate bodies (Content-Encoding / Accept-Encoding) with zlib. Pure functions
 * over buffers. */
#ifndef OI_CODEC_COMPRESS_H
#define OI_CODEC_COMPRESS_H

#include <stdint.h>

#include "core/buf.h"
#include "core/status.h"

typedef enum { OI_ENCODING_IDENTITY, OI_ENCODING_GZIP, OI_ENCODING_DEFLATE, OI_ENCODING_UNKNOWN } oi_encoding_t;

/* Parses a Content-Encoding value (lower-case): identity/"" , gzip, x-gzip, deflate. */
oi_encoding_t oi_content_encoding(const char *value);

/* Picks the response encoding for an Accept-Encoding value (lower-case): gzip over deflate,
 * honouring q=0; identity when neither is acceptable. */
oi_encoding_t oi_accept_encoding(const char *value);

/* What the inflated bytes must start with, checked on the first OI_INFLATE_PREFIX_BYTES of
 * them (or all, when fewer) before the rest is inflated: a bomb whose first bytes cannot begin
 * the body is refused having cost one step. */
typedef enum {
    OI_INFLATE_ANY,      /* no check (raw tensor bytes) */
    OI_INFLATE_JSON,     /* a JSON object: '{' after optional whitespace, in its first json_len bytes */
    OI_INFLATE_PROTOBUF, /* a protobuf message: empty, or a tag of field number >= 1 and wire type <= 5 */
} oi_inflate_expect_t;

#define OI_INFLATE_PREFIX_BYTES 65536

/* Inflated bytes allowed past max_ratio times the compressed length: small compressed bodies
 * (up to this size inflated) pass whatever their ratio. */
#define OI_INFLATE_RATIO_FLOOR ((size_t)64 << 20)

/* What an inflated body may grow to, and how errors name it. */
typedef struct oi_inflate_limit_s {
    size_t max_out;         /* 0: no limit */
    const char *what;       /* "request body", "request message" */
    const char *limit_name; /* the setting that sets max_out: "max_body_bytes" */
    /* The command-line flag of max_out when it is tritonserver's ("--http-max-input-size"):
     * then an inflated body past it is refused as tritonserver refuses it (400, its words);
     * NULL: a 413 naming limit_name. */
    const char *triton_flag;
    /* Inflated bytes per compressed byte, beyond OI_INFLATE_RATIO_FLOOR ("max_inflate_ratio");
     * 0: no limit. */
    unsigned max_ratio;
    oi_budget_t *budget; /* the inflated buffer is charged here (see oi_buf_charge); NULL: none */
    oi_inflate_expect_t expect;
    size_t json_len; /* OI_INFLATE_JSON: the JSON's length when it is a prefix of the body
                      * (the binary tensor extension); SIZE_MAX: the whole body */
} oi_inflate_limit_t;

/* Inflates `len` bytes of a gzip or deflate (zlib format, or raw deflate as some clients
 * send) body into a new buffer of exactly the inflated size (one reference in *out), in two
 * passes: the first measures in a small scratch buffer, the second writes. More than
 * lim->max_out bytes, or more than lim->max_ratio times `len` (past the floor), is a 413 found
 * while measuring; first bytes that cannot start what lim->expect names, or corrupt or
 * truncated data, a 400; no room in lim->budget for the inflated size, a 503 (before it is
 * allocated). Returns NULL or a status. */
oi_status_t *oi_inflate(const char *data, size_t len, oi_encoding_t enc, const oi_inflate_limit_t *lim, oi_buf_t **out);

/* Compresses the concatenation of n parts into a new buffer (one reference in *out).
 * Returns 0 or -1 (out of memory). */
int oi_deflate(const char *const *parts, const size_t *lens, size_t n, oi_encoding_t enc, oi_buf_t **out);

#endif
