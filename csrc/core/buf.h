/* Reference-counted byte owners (request bodies, tensor storage, model outputs) and a
 * growable output buffer for encoders. */
#ifndef OI_CORE_BUF_H
#define OI_CORE_BUF_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/budget.h"

typedef struct oi_buf_s oi_buf_t;

/* Called once when the last reference goes; must free `b` itself (or hand it on). */
typedef void (*oi_buf_release_cb)(oi_buf_t *b);

/* An owner of `len` bytes at `data`. Shared across threads: every holder keeps one
 * reference and drops it with oi_buf_unref. */
struct oi_buf_s {
    atomic_int refs;
    char *data;
    size_t len;
    size_t cap;
    oi_buf_release_cb release;
    void *ctx; /* release callback's own pointer, e.g. a PyObject; for oi_buf_new's
                * buffers the oi_budget_t charged with cap (oi_buf_charge), or NULL */
};

/* Returns a new heap buffer of capacity `cap` (len 0, one reference), or NULL. The bytes
 * follow the header in one allocation. */
oi_buf_t *oi_buf_new(size_t cap);

/* Returns a new owner of foreign memory (one reference) whose release callback frees it,
 * or NULL. */
oi_buf_t *oi_buf_wrap(void *data, size_t len, oi_buf_release_cb release, void *ctx);

/* Grows an exclusively held buffer made by oi_buf_new (one reference, never shared yet) to
 * at least `cap` bytes, keeping its contents; returns the (possibly moved) buffer, or NULL
 * with `b` untouched. A charged buffer stays charged: the caller takes the growth from the
 * budget first (and gives it back when this fails). */
oi_buf_t *oi_buf_grow(oi_buf_t *b, size_t cap);

/* Hands a buffer made by oi_buf_new the charge of its capacity (b->cap bytes), which the
 * caller took from `budget` (oi_budget_take): given back when the last reference goes. */
void oi_buf_charge(oi_buf_t *b, oi_budget_t *budget);

/* A new buffer as oi_buf_new, its capacity taken from `budget` first (NULL: none). NULL
 * with *over_budget set when the budget has no room, NULL with it clear when out of memory. */
oi_buf_t *oi_buf_new_charged(size_t cap, oi_budget_t *budget, int *over_budget);

/* From now on, large buffers are made in shared memory (memfds) that another process can
 * map: for models whose instances are worker processes. */
void oi_buf_share_large(void);

/* When [p, p + len) lies in a large buffer `b` made in shared memory: returns its memfd (owned
 * by `b`, valid while `b` lives) and sets *offset to p's offset in it. Else -1. */
int oi_buf_fd(oi_buf_t *b, const void *p, size_t len, uint64_t *offset);

/* Adds a reference and returns `b`. */
static inline oi_buf_t *oi_buf_ref(oi_buf_t *b)
{
    atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    return b;
}

/* Drops a reference; the last one releases. NULL is ignored. */
void oi_buf_unref(oi_buf_t *b);

/* A growable byte string for encoders: single owner, not thread-safe. */
typedef struct oi_sbuf_s {
    char *data;
    size_t len;
    size_t cap;
} oi_sbuf_t;

/* Makes room for `extra` more bytes; returns 0 or -1 (out of memory). */
int oi_sbuf_reserve(oi_sbuf_t *s, size_t extra);

/* Appends bytes; returns 0 or -1. */
int oi_sbuf_append(oi_sbuf_t *s, const void *p, size_t n);

/* Appends a printf-formatted string; returns 0 or -1. */
int oi_sbuf_printf(oi_sbuf_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Frees the storage and resets to empty. */
void oi_sbuf_free(oi_sbuf_t *s);

/* Hands the storage to a new oi_buf_t (one reference) and resets `s`; NULL if out of
 * memory, in which case `s` is unchanged. */
oi_buf_t *oi_sbuf_detach(oi_sbuf_t *s);

#endif
