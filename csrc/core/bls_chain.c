#include "core/bls_chain.h"

#include <stdlib.h>
#include <string.h>

/* Whether `name` is one of the '/'-separated names of `chain`. */
static int in_chain(const char *chain, const char *name)
{
    size_t n = strlen(name);
    for (const char *at = chain; *at != '\0';) {
        const char *end = strchr(at, '/');
        size_t len = end != NULL ? (size_t)(end - at) : strlen(at);
        if (len == n && memcmp(at, name, n) == 0)
            return 1;
        at += len + (end != NULL);
    }
    return 0;
}

/* `chain` then `target`, shown with " -> " between the names (malloc'd; NULL: out of memory). */
static char *shown(const char *chain, const char *target)
{
    size_t arrows = 0;
    for (const char *c = chain; *c; c++)
        arrows += *c == '/';
    char *out = malloc(strlen(chain) + 3 * arrows + 4 + strlen(target) + 1);
    if (out == NULL)
        return NULL;
    char *w = out;
    for (const char *c = chain; *c; c++) {
        if (*c == '/') {
            memcpy(w, " -> ", 4);
            w += 4;
        } else {
            *w++ = *c;
        }
    }
    memcpy(w, " -> ", 4);
    strcpy(w + 4, target);
    return out;
}

oi_status_t *oi_bls_chain_extend(const char *chain, const char *caller, const char *target, char **out)
{
    *out = NULL;
    chain = chain != NULL ? chain : "";
    size_t len = strlen(chain), depth = *chain != '\0';
    for (const char *c = chain; *c; c++)
        depth += *c == '/';
    char *extended = malloc(len + 1 + strlen(caller) + 1);
    if (extended == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    strcpy(extended, chain);
    if (len > 0)
        extended[len++] = '/';
    strcpy(extended + len, caller);
    oi_status_t *st = NULL;
    int cycle = in_chain(extended, target);
    if (cycle || depth + 1 > OI_BLS_MAX_DEPTH) {
        char *calls = shown(extended, target);
        if (calls == NULL)
            st = oi_status_new(OI_INTERNAL, "out of memory");
        else if (cycle)
            st = oi_status_new(OI_BAD_REQUEST,
                               "BLS call cycle: %s (model '%s' is waiting up the call chain for this request)",
                               calls, target);
        else
            st = oi_status_new(OI_BAD_REQUEST, "BLS call chain %s is deeper than openinfer allows (%d nested calls)",
                               calls, OI_BLS_MAX_DEPTH);
        free(calls);
        free(extended);
        return st;
    }
    *out = extended;
    return NULL;
}
