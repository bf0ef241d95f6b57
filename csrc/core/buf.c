#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create, when built alone (tests/c, fuzz targets) */
#endif
#include "buf.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Large buffers (request and response bodies of big tensors) come from a small cache of
 * power-of-two blocks: glibc maps every block above its mmap threshold afresh and unmaps it
 * on free, so each 64 MiB body would otherwise cost 16k page faults to fill. A few freed
 * blocks are kept, already faulted in, for the next body of that size class.
 *
 * Once oi_buf_share_large() is on (a model runs in worker processes), new blocks are memfds
 * mapped shared, so that a worker can map a request's tensors where the transport wrote them
 * instead of receiving a copy (oi_buf_fd). Each block starts with a head naming its memfd. */
#define LARGE_MIN_SHIFT 20 /* 1 MiB */
#define LARGE_MAX_SHIFT 40
#define CACHED_PER_CLASS 2
#define CACHE_BYTES_MAX ((size_t)512 << 20)

typedef struct large_head_s {
    int fd; /* the block's memfd, or -1 for a private (malloc) block */
    char pad[60];
} large_head_t;

#define LARGE_OVERHEAD (sizeof(large_head_t) + sizeof(oi_buf_t))

static struct {
    pthread_mutex_t mu;
    large_head_t *blocks[LARGE_MAX_SHIFT + 1][CACHED_PER_CLASS];
    int count[LARGE_MAX_SHIFT + 1];
    size_t bytes;
} cache = {.mu = PTHREAD_MUTEX_INITIALIZER};

static atomic_bool share_large;

void oi_buf_share_large(void) { atomic_store_explicit(&share_large, true, memory_order_relaxed); }

/* The size class (log2 of the block size) for `total` bytes, or 0 when too small to cache. */
static unsigned size_class(size_t total)
{
    if (total < ((size_t)1 << LARGE_MIN_SHIFT))
        return 0;
    unsigned shift = LARGE_MIN_SHIFT;
    while (shift < LARGE_MAX_SHIFT && ((size_t)1 << shift) < total)
        shift++;
    return ((size_t)1 << shift) >= total ? shift : 0;
}

/* A new shared block, or NULL (then a private one serves: sharing only saves a copy). */
static large_head_t *shared_block(size_t size)
{
    int fd = memfd_create("openinfer-body", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)size) == 0)
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    large_head_t *h = p;
    h->fd = fd;
    return h;
}

static void block_free(large_head_t *h, unsigned cls)
{
    if (h->fd < 0) {
        free(h);
        return;
    }
    close(h->fd);
    munmap(h, (size_t)1 << cls);
}

static large_head_t *block_get(unsigned cls)
{
    large_head_t *h = NULL;
    pthread_mutex_lock(&cache.mu);
    if (cache.count[cls] > 0) {
        h = cache.blocks[cls][--cache.count[cls]];
        cache.bytes -= (size_t)1 << cls;
    }
    pthread_mutex_unlock(&cache.mu);
    if (h == NULL && atomic_load_explicit(&share_large, memory_order_relaxed))
        h = shared_block((size_t)1 << cls);
    if (h == NULL && (h = malloc((size_t)1 << cls)) != NULL)
        h->fd = -1;
    return h;
}

static void block_put(large_head_t *h, unsigned cls)
{
    pthread_mutex_lock(&cache.mu);
    if (cache.count[cls] < CACHED_PER_CLASS && cache.bytes + ((size_t)1 << cls) <= CACHE_BYTES_MAX) {
        cache.blocks[cls][cache.count[cls]++] = h;
        cache.bytes += (size_t)1 << cls;
        h = NULL;
    }
    pthread_mutex_unlock(&cache.mu);
    if (h != NULL)
        block_free(h, cls);
}

static large_head_t *head_of(oi_buf_t *b) { return (large_head_t *)b - 1; }

static void free_inline(oi_buf_t *b)
{
    oi_budget_give(b->ctx, b->cap);
    free(b);
}

static void free_large(oi_buf_t *b)
{
    oi_budget_give(b->ctx, b->cap);
    block_put(head_of(b), size_class(LARGE_OVERHEAD + b->cap));
}

oi_buf_t *oi_buf_new(size_t cap)
{
    if (cap > SIZE_MAX - LARGE_OVERHEAD)
        return NULL;
    unsigned cls = size_class(LARGE_OVERHEAD + cap);
    oi_buf_t *b;
    if (cls) {
        large_head_t *h = block_get(cls);
        b = h ? (oi_buf_t *)(h + 1) : NULL;
    } else {
        b = malloc(sizeof(*b) + cap);
    }
    if (b == NULL)
        return NULL;
    atomic_init(&b->refs, 1);
    b->data = (char *)(b + 1);
    b->len = 0;
    b->cap = cap; /* exactly what was asked: callers read cap as the body's size */
    b->release = cls ? free_large : free_inline;
    b->ctx = NULL;
    return b;
}

int oi_buf_fd(oi_buf_t *b, const void *p, size_t len, uint64_t *offset)
{
    if (b == NULL || b->release != free_large || head_of(b)->fd < 0)
        return -1;
    const char *c = p;
    if (c < b->data || len > b->cap || (size_t)(c - b->data) > b->cap - len)
        return -1;
    *offset = (uint64_t)(c - (const char *)head_of(b));
    return head_of(b)->fd;
}

oi_buf_t *oi_buf_grow(oi_buf_t *b, size_t cap)
{
    if (cap <= b->cap)
        return b;
    if (cap > SIZE_MAX - LARGE_OVERHEAD)
        return NULL;
    if (b->release == free_large && size_class(LARGE_OVERHEAD + cap) == size_class(LARGE_OVERHEAD + b->cap)) {
        b->cap = cap; /* still within its block */
        return b;
    }
    if (b->release == free_inline && size_class(LARGE_OVERHEAD + cap) == 0) {
        oi_buf_t *nb = realloc(b, sizeof(*nb) + cap);
        if (nb == NULL)
            return NULL;
        nb->data = (char *)(nb + 1);
        nb->cap = cap;
        return nb;
    }
    oi_buf_t *nb = oi_buf_new(cap);
    if (nb == NULL)
        return NULL;
    memcpy(nb->data, b->data, b->len);
    nb->len = b->len;
    nb->ctx = b->ctx; /* the charge moves: b's capacity plus the growth the caller took */
    b->ctx = NULL;
    b->release(b);
    return nb;
}

void oi_buf_charge(oi_buf_t *b, oi_budget_t *budget) { b->ctx = budget; }

oi_buf_t *oi_buf_new_charged(size_t cap, oi_budget_t *budget, int *over_budget)
{
    *over_budget = 0;
    if (oi_budget_take(budget, cap) != 0) {
        *over_budget = 1;
        return NULL;
    }
    oi_buf_t *b = oi_buf_new(cap);
    if (b == NULL)
        oi_budget_give(budget, cap);
    else
        oi_buf_charge(b, budget);
    return b;
}

oi_buf_t *oi_buf_wrap(void *data, size_t len, oi_buf_release_cb release, void *ctx)
{
    oi_buf_t *b = malloc(sizeof(*b));
    if (b == NULL)
        return NULL;
    atomic_init(&b->refs, 1);
    b->data = data;
    b->len = len;
    b->cap = len;
    b->release = release;
    b->ctx = ctx;
    return b;
}

void oi_buf_unref(oi_buf_t *b)
{
    if (b != NULL && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
        b->release(b);
}

int oi_sbuf_reserve(oi_sbuf_t *s, size_t extra)
{
    if (s->cap - s->len >= extra)
        return 0;
    if (extra > SIZE_MAX / 2 - s->len)
        return -1;
    size_t cap = s->cap ? s->cap : 256;
    while (cap - s->len < extra)
        cap *= 2;
    char *p = realloc(s->data, cap);
    if (p == NULL)
        return -1;
    s->data = p;
    s->cap = cap;
    return 0;
}

int oi_sbuf_append(oi_sbuf_t *s, const void *p, size_t n)
{
    if (n == 0) /* p may be NULL then, which memcpy does not allow */
        return 0;
    if (oi_sbuf_reserve(s, n) != 0)
        return -1;
    memcpy(s->data + s->len, p, n);
    s->len += n;
    return 0;
}

int oi_sbuf_printf(oi_sbuf_t *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || oi_sbuf_reserve(s, (size_t)n + 1) != 0)
        return -1;
    va_start(ap, fmt);
    vsnprintf(s->data + s->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    s->len += (size_t)n;
    return 0;
}

void oi_sbuf_free(oi_sbuf_t *s)
{
    free(s->data);
    s->data = NULL;
    s->len = s->cap = 0;
}

static void free_detached(oi_buf_t *b)
{
    free(b->data);
    free(b);
}

oi_buf_t *oi_sbuf_detach(oi_sbuf_t *s)
{
    oi_buf_t *b = oi_buf_wrap(s->data, s->len, free_detached, NULL);
    if (b == NULL)
        return NULL;
    b->cap = s->cap;
    s->data = NULL;
    s->len = s->cap = 0;
    return b;
}
