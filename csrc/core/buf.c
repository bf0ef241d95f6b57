#include "buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void free_inline(oi_buf_t *b) { free(b); }

oi_buf_t *oi_buf_new(size_t cap)
{
    if (cap > SIZE_MAX - sizeof(oi_buf_t))
        return NULL;
    oi_buf_t *b = malloc(sizeof(*b) + cap);
    if (b == NULL)
        return NULL;
    atomic_init(&b->refs, 1);
    b->data = (char *)(b + 1);
    b->len = 0;
    b->cap = cap;
    b->release = free_inline;
    b->ctx = NULL;
    return b;
}

oi_buf_t *oi_buf_grow(oi_buf_t *b, size_t cap)
{
    if (cap <= b->cap)
        return b;
    if (cap > SIZE_MAX - sizeof(oi_buf_t))
        return NULL;
    oi_buf_t *nb = realloc(b, sizeof(*nb) + cap);
    if (nb == NULL)
        return NULL;
    nb->data = (char *)(nb + 1);
    nb->cap = cap;
    return nb;
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
