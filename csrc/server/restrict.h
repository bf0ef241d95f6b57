/* Triton's restricted APIs (--http-restricted-api, --grpc-restricted-protocol): groups of
 * endpoints that answer only requests carrying a given header with a given value. One table
 * per protocol; each front door (http_api.c with the legacy /api and generate routes,
 * grpc_api.c with the legacy GRPCService) names the groups a request belongs to when it routes
 * it, and asks the table once. The transports keep only the headers the table names. */
#ifndef OI_SERVER_RESTRICT_H
#define OI_SERVER_RESTRICT_H

#include <stddef.h>

/* Triton's categories, in its order (RestrictedCategory), then openinfer's own. */
typedef enum {
    OI_API_HEALTH,
    OI_API_METADATA,
    OI_API_INFERENCE,
    OI_API_SHARED_MEMORY,
    OI_API_MODEL_CONFIG,
    OI_API_MODEL_REPOSITORY,
    OI_API_STATISTICS,
    OI_API_TRACE,
    OI_API_LOGGING,
    OI_API_OPENAI, /* openinfer's: OpenAI's API under /v1 (HTTP only); --openai-api-key sets it */
    OI_API_COUNT
} oi_api_group_t;

#define OI_API_BIT(g) (1u << (g))

/* Triton's names of the groups ("health", "shared-memory", ...), by oi_api_group_t. */
extern const char *const oi_api_group_names[OI_API_COUNT];

/* Which header each restricted group wants, and its value. Zeroed: nothing restricted. */
typedef struct oi_restricted_s {
    char *header[OI_API_COUNT]; /* as configured, for the error; NULL: the group is open */
    char *value[OI_API_COUNT];
    size_t value_len[OI_API_COUNT];
    int slot[OI_API_COUNT];     /* header[g]'s index in `names` */
    char *names[OI_API_COUNT];  /* the distinct headers, lower-cased: what the transport keeps */
    int n_names;
} oi_restricted_t;

/* Restricts group `g` to requests whose header `header` (matched without regard to case)
 * is exactly `value`; both copied. 0, -1 out of memory, -2 when `g` is restricted already
 * (Triton's "can not be specified in multiple config groups"). */
int oi_restricted_set(oi_restricted_t *t, oi_api_group_t g, const char *header, const char *value);

/* A deep copy of `src` into `dst` (zeroed first). 0 or -1 (out of memory: dst freed). */
int oi_restricted_copy(oi_restricted_t *dst, const oi_restricted_t *src);

void oi_restricted_free(oi_restricted_t *t);

/* Whether any group is restricted. */
int oi_restricted_any(const oi_restricted_t *t);

/* The header value a request carried for names[i]: NULL when absent. */
typedef const char *(*oi_restricted_lookup_fn)(const void *req, int i, size_t *len);

/* The first of `groups` (OI_API_BIT mask) whose header the request lacks or carries with
 * another value, or -1 when it may pass. Values are compared in time that does not depend
 * on where they differ. */
int oi_restricted_refuses(const oi_restricted_t *t, unsigned groups, oi_restricted_lookup_fn lookup, const void *req);

#endif
