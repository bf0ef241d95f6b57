#include "server/restrict.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *const oi_api_group_names[OI_API_COUNT] = {
    "health",           "metadata",   "inference", "shared-memory", "model-config",
    "model-repository", "statistics", "trace",     "logging",       "openai",
};

int oi_restricted_set(oi_restricted_t *t, oi_api_group_t g, const char *header, const char *value)
{
    if (t->header[g] != NULL)
        return -2;
    int slot = -1;
    for (int i = 0; i < t->n_names && slot < 0; i++)
        if (strcasecmp(t->names[i], header) == 0)
            slot = i;
    char *h = strdup(header), *v = strdup(value), *name = slot < 0 ? strdup(header) : NULL;
    if (h == NULL || v == NULL || (slot < 0 && name == NULL)) {
        free(h);
        free(v);
        free(name);
        return -1;
    }
    if (slot < 0) { /* a group per header at most: never past OI_API_COUNT */
        for (char *p = name; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        slot = t->n_names++;
        t->names[slot] = name;
    }
    t->header[g] = h;
    t->value[g] = v;
    t->value_len[g] = strlen(v);
    t->slot[g] = slot;
    return 0;
}

int oi_restricted_copy(oi_restricted_t *dst, const oi_restricted_t *src)
{
    memset(dst, 0, sizeof(*dst));
    for (int g = 0; g < OI_API_COUNT; g++)
        if (src->header[g] != NULL && oi_restricted_set(dst, (oi_api_group_t)g, src->header[g], src->value[g]) != 0) {
            oi_restricted_free(dst);
            return -1;
        }
    return 0;
}

void oi_restricted_free(oi_restricted_t *t)
{
    for (int g = 0; g < OI_API_COUNT; g++) {
        free(t->header[g]);
        if (t->value[g] != NULL) /* a key: not left in freed memory */
            memset(t->value[g], 0, t->value_len[g]);
        free(t->value[g]);
        free(t->names[g]);
    }
    memset(t, 0, sizeof(*t));
}

int oi_restricted_any(const oi_restricted_t *t) { return t->n_names > 0; }

/* Whether `got` equals the key `want`, touching every byte of `want` whatever `got` is: the
 * time tells an attacker the key's length at most, never how much of a guess was right. */
static int same_key(const char *want, size_t want_len, const char *got, size_t got_len)
{
    volatile unsigned char diff = (unsigned char)(want_len != got_len);
    for (size_t i = 0; i < want_len; i++)
        diff |= (unsigned char)want[i] ^ (unsigned char)(i < got_len ? got[i] : 0);
    return diff == 0;
}

int oi_restricted_refuses(const oi_restricted_t *t, unsigned groups, oi_restricted_lookup_fn lookup, const void *req)
{
    for (int g = 0; g < OI_API_COUNT; g++) {
        if (!(groups & OI_API_BIT(g)) || t->header[g] == NULL)
            continue;
        size_t len = 0;
        const char *got = lookup(req, t->slot[g], &len);
        if (got == NULL || !same_key(t->value[g], t->value_len[g], got, len))
            return g;
    }
    return -1;
}
