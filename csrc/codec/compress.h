/* gzip and deflate bodies (Content-Encoding / Accept-Encoding) with zlib. Pure functions
 * over buffers. */
#ifndef OI_CODEC_COMPRESS_H
#define OI_CODEC_COMPRESS_H

#include "core/buf.h"
#include "core/status.h"

typedef enum { OI_ENCODING_IDENTITY, OI_ENCODING_GZIP, OI_ENCODING_DEFLATE, OI_ENCODING_UNKNOWN } oi_encoding_t;

/* Parses a Content-Encoding value (lower-case): identity/"" , gzip, x-gzip, deflate. */
oi_encoding_t oi_content_encoding(const char *value);

/* Picks the response encoding for an Accept-Encoding value (lower-case): gzip over deflate,
 * honouring q=0; identity when neither is acceptable. */
oi_encoding_t oi_accept_encoding(const char *value);

/* What an inflated body may grow to, and how errors name it. */
typedef struct oi_inflate_limit_s {
    size_t max_out;         /* 0: no limit */
    const char *what;       /* "request body", "request message" */
    const char *limit_name; /* the setting that sets max_out: "max_body_bytes" */
} oi_inflate_limit_t;

/* Inflates `len` bytes of a gzip or deflate (zlib format, or raw deflate as some clients
 * send) body into a new buffer of exactly the inflated size (one reference in *out). More
 * than lim->max_out bytes is a 413, found before anything of that size is allocated;
 * corrupt or truncated data is a 400. Returns NULL or a status. */
oi_status_t *oi_inflate(const char *data, size_t len, oi_encoding_t enc, const oi_inflate_limit_t *lim, oi_buf_t **out);

/* Compresses the concatenation of n parts into a new buffer (one reference in *out).
 * Returns 0 or -1 (out of memory). */
int oi_deflate(const char *const *parts, const size_t *lens, size_t n, oi_encoding_t enc, oi_buf_t **out);

#endif
