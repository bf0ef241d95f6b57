/* Request headers forwarded to the model as request parameters: tritonserver's
 * --http-header-forward-pattern and --grpc-header-forward-pattern. A header (HTTP/1.1) or
 * metadata entry (gRPC) whose name the pattern matches anywhere (case-insensitively, unless the
 * pattern starts with "(?-i)") becomes a string parameter of the inference request, name and
 * value as the client sent them. */
#ifndef OI_TRANSPORT_HDR_FORWARD_H
#define OI_TRANSPORT_HDR_FORWARD_H

#include <regex.h>
#include <stddef.h>
#include "core/buf.h"

/* Results of oi_hdr_forward. */
#define OI_HDR_SKIPPED 0   /* the name does not match */
#define OI_HDR_ADDED 1     /* appended to the members */
#define OI_HDR_RESERVED -2 /* a name tritonserver keeps for itself: the request is refused */
#define OI_HDR_NOMEM -1

/* Compiles `pattern` (RE2 syntax, as tritonserver takes it: leading "(?i)" / "(?-i)" flags,
 * "(?:" groups and \d / \D besides POSIX extended syntax) as the transports match it,
 * case-insensitively unless it starts with "(?-i)". Returns 0, or regcomp's error (then *re
 * holds nothing to free). */
int oi_hdr_forward_compile(regex_t *re, const char *pattern);

/* When `re` matches header `name` (n bytes, not NUL-terminated), appends "name":"value" (JSON,
 * escaped; a comma first when `members` is not empty) to `members`. A reserved name gets
 * tritonserver's message in `err` (errlen bytes). */
int oi_hdr_forward(const regex_t *re, oi_sbuf_t *members, const char *name, size_t n, const char *value,
                   size_t vlen, char *err, size_t errlen);

#endif
