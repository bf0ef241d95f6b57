#include "core/budget.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The bit of `used` that says the owner let go. */
#define RELEASED ((size_t)1 << (sizeof(size_t) * 8 - 1))

oi_budget_t *oi_budget_new(size_t limit, const char *name)
{
    oi_budget_t *b = malloc(sizeof(*b));
    if (b == NULL)
        return NULL;
    atomic_init(&b->used, 0);
    b->limit = limit;
    b->name = name;
    return b;
}

void oi_budget_release(oi_budget_t *b)
{
    if (b != NULL && atomic_fetch_add_explicit(&b->used, RELEASED, memory_order_acq_rel) == 0)
        free(b);
}

int oi_budget_take(oi_budget_t *b, size_t n)
{
    if (b == NULL)
        return 0;
    size_t used = atomic_load_explicit(&b->used, memory_order_relaxed);
    do {
        if (n >= RELEASED || used >= RELEASED - n || (b->limit > 0 && (n > b->limit || used > b->limit - n)))
            return -1;
    } while (!atomic_compare_exchange_weak_explicit(&b->used, &used, used + n, memory_order_relaxed,
                                                    memory_order_relaxed));
    return 0;
}

void oi_budget_give(oi_budget_t *b, size_t n)
{
    if (b != NULL && n > 0 && atomic_fetch_sub_explicit(&b->used, n, memory_order_acq_rel) == RELEASED + n)
        free(b); /* the last charge of a budget whose owner is gone */
}

oi_status_t *oi_budget_refusal(const oi_budget_t *b, const char *what, size_t n)
{
    return oi_status_new(OI_UNAVAILABLE,
                         "the server is out of memory for request bodies: this %s needs %zu bytes and the "
                         "server's %s of %zu bytes has %zu in use; retry later",
                         what, n, b->name ? b->name : "request body budget", b->limit,
                         atomic_load_explicit(&((oi_budget_t *)b)->used, memory_order_relaxed) & ~RELEASED);
}

/* A byte count in a cgroup file ("max" or a huge value: no limit); 0 when none. */
static size_t cgroup_bytes(const char *path)
{
    char text[64];
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || v >= (unsigned long long)SIZE_MAX / 2)
        return 0;
    return (size_t)v;
}

/* The memory limit of the process's own cgroup (v2 memory.max, v1 memory.limit_in_bytes), or
 * of the mount's root cgroup, which is the container's inside one; 0 when none. */
static size_t cgroup_memory_limit(void)
{
    char text[4096], path[sizeof(text) + 64]; /* a cgroup path is at most a line of text */
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (f == NULL)
        return 0;
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    size_t best = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (c2 == NULL)
            continue;
        const char *fmt = NULL;
        if (c2 == c1 + 1 && strncmp(line, "0:", 2) == 0)
            fmt = "/sys/fs/cgroup%s/memory.max";
        else if ((size_t)(c2 - c1 - 1) == 6 && memcmp(c1 + 1, "memory", 6) == 0)
            fmt = "/sys/fs/cgroup/memory%s/memory.limit_in_bytes";
        if (fmt == NULL)
            continue;
        const char *own = strcmp(c2 + 1, "/") == 0 ? "" : c2 + 1;
        for (int root = 0; root < 2; root++) {
            snprintf(path, sizeof(path), fmt, root ? "" : own);
            size_t v = cgroup_bytes(path);
            if (v > 0 && (best == 0 || v < best))
                best = v;
        }
    }
    return best;
}

size_t oi_budget_default_limit(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t mem = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
    size_t cg = cgroup_memory_limit();
    if (cg > 0 && (mem == 0 || cg < mem))
        mem = cg;
    return mem > 0 ? mem / 2 : (size_t)4 << 30;
}
