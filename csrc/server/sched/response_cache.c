#include "server/sched/response_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "codec/json.h"

typedef struct entry_s {
    struct entry_s *chain;      /* the next entry of its hash bucket */
    struct entry_s *newer;      /* LRU order: `older` is evicted first */
    struct entry_s *older;
    uint32_t hash;
    size_t key_len;
    char *key;                  /* the serialized request (see put_key) */
    oi_buf_t *data;             /* the outputs' names, parameters and bytes */
    oi_tensor_t *outputs;       /* point into `data`; owner NULL here, set on each hand-out */
    uint32_t n_outputs;
    oi_buf_t *parameters;       /* the response's (one reference; never written again), or NULL */
    size_t bytes;               /* what the entry counts against the capacity */
} entry_t;

struct oi_rcache_s {
    pthread_mutex_t mu;
    size_t capacity, used, n_entries;
    entry_t **buckets;
    size_t n_buckets; /* a power of two */
    entry_t *newest, *oldest;
};

/* ---- the key ----------------------------------------------------------------------------- */

/* Where the key's bytes go: hashed, compared with a kept key, or copied. */
typedef struct sink_s {
    void (*put)(struct sink_s *k, const void *p, size_t n);
    uint32_t crc;
    size_t len;
    const char *cmp; /* compare: the kept key; `differs` once a byte did not match */
    size_t cmp_len;
    int differs;
    char *out; /* copy: where the next bytes go */
} sink_t;

static void hash_put(sink_t *k, const void *p, size_t n)
{
    k->len += n;
    /* zlib's crc32 takes uInt lengths: tensor bytes may exceed them. */
    for (const unsigned char *b = p; n > 0;) {
        uInt part = n > (1u << 30) ? (1u << 30) : (uInt)n;
        k->crc = (uint32_t)crc32(k->crc, b, part);
        b += part;
        n -= part;
    }
}

static void cmp_put(sink_t *k, const void *p, size_t n)
{
    if (k->differs || n > k->cmp_len - k->len || memcmp(k->cmp + k->len, p, n) != 0)
        k->differs = 1;
    else
        k->len += n;
}

static void copy_put(sink_t *k, const void *p, size_t n)
{
    memcpy(k->out + k->len, p, n);
    k->len += n;
}

static void put(sink_t *k, const void *p, size_t n) { k->put(k, p, n); }

/* A length before each variable field keeps the serialization unambiguous. */
static void put_bytes(sink_t *k, const void *p, size_t n)
{
    uint64_t len = n;
    put(k, &len, sizeof(len));
    put(k, p, n);
}

static void put_str(sink_t *k, const char *s) { put_bytes(k, s, s ? strlen(s) : 0); }

static void put_param(void *ctx, const char *key, size_t key_len, oi_slice_t value)
{
    put_bytes(ctx, key, key_len);
    put_bytes(ctx, value.ptr, value.len);
}

/* Request parameters that do not change what the model answers. */
static const char *const not_in_key[] = {"priority", "timeout", "binary_data_output", NULL};

static void put_key(sink_t *k, const oi_rcache_request_t *r)
{
    put_str(k, r->model);
    put(k, &r->version, sizeof(r->version));
    const oi_request_t *req = r->req;
    put(k, &req->n_inputs, sizeof(req->n_inputs));
    for (uint32_t i = 0; i < req->n_inputs; i++) {
        const oi_tensor_t *t = &req->inputs[i];
        uint32_t dtype = t->dtype;
        put_str(k, t->name);
        put(k, &dtype, sizeof(dtype));
        put(k, &t->ndim, sizeof(t->ndim));
        put(k, t->shape, (size_t)t->ndim * sizeof(t->shape[0]));
        put_bytes(k, t->data, t->byte_size);
    }
    put(k, &r->n_outputs, sizeof(r->n_outputs));
    for (uint32_t i = 0; i < r->n_outputs; i++) {
        uint32_t count = r->class_counts ? r->class_counts[i] : 0;
        put_str(k, r->outputs[i]);
        put(k, &count, sizeof(count));
    }
    (void)oi_json_params_each(req->parameters, not_in_key, put_param, k); /* checked by the decoder */
}

static uint32_t key_hash(const oi_rcache_request_t *r, size_t *len)
{
    sink_t k = {.put = hash_put, .crc = (uint32_t)crc32(0, NULL, 0)};
    put_key(&k, r);
    *len = k.len;
    return k.crc;
}

static int key_equals(const entry_t *e, const oi_rcache_request_t *r)
{
    sink_t k = {.put = cmp_put, .cmp = e->key, .cmp_len = e->key_len};
    put_key(&k, r);
    return !k.differs && k.len == e->key_len;
}

/* ---- the table and the LRU --------------------------------------------------------------- */

oi_rcache_t *oi_rcache_new(size_t capacity)
{
    oi_rcache_t *c = calloc(1, sizeof(*c));
    if (c == NULL || (c->buckets = calloc(64, sizeof(*c->buckets))) == NULL) {
        free(c);
        return NULL;
    }
    c->n_buckets = 64;
    c->capacity = capacity;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

static void entry_free(entry_t *e)
{
    oi_buf_unref(e->data);
    if (e->parameters != NULL)
        oi_buf_unref(e->parameters);
    free(e->outputs);
    free(e->key);
    free(e);
}

void oi_rcache_free(oi_rcache_t *c)
{
    if (c == NULL)
        return;
    for (entry_t *e = c->newest, *next; e != NULL; e = next) {
        next = e->older;
        entry_free(e);
    }
    free(c->buckets);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void lru_unlink(oi_rcache_t *c, entry_t *e)
{
    *(e->newer ? &e->newer->older : &c->newest) = e->older;
    *(e->older ? &e->older->newer : &c->oldest) = e->newer;
    e->newer = e->older = NULL;
}

static void lru_push(oi_rcache_t *c, entry_t *e)
{
    e->older = c->newest;
    e->newer = NULL;
    *(c->newest ? &c->newest->newer : &c->oldest) = e;
    c->newest = e;
}

static entry_t **bucket(oi_rcache_t *c, uint32_t hash) { return &c->buckets[hash & (c->n_buckets - 1)]; }

static void remove_entry(oi_rcache_t *c, entry_t *e)
{
    entry_t **at = bucket(c, e->hash);
    while (*at != e)
        at = &(*at)->chain;
    *at = e->chain;
    lru_unlink(c, e);
    c->used -= e->bytes;
    c->n_entries--;
    entry_free(e);
}

/* Doubles the buckets once entries outnumber them; a failed allocation keeps the table. */
static void maybe_grow(oi_rcache_t *c)
{
    if (c->n_entries < c->n_buckets)
        return;
    entry_t **b = calloc(c->n_buckets * 2, sizeof(*b));
    if (b == NULL)
        return;
    size_t n = c->n_buckets * 2;
    for (size_t i = 0; i < c->n_buckets; i++)
        for (entry_t *e = c->buckets[i], *next; e != NULL; e = next) {
            next = e->chain;
            e->chain = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    free(c->buckets);
    c->buckets = b;
    c->n_buckets = n;
}

static entry_t *find_locked(oi_rcache_t *c, uint32_t hash, size_t key_len, const oi_rcache_request_t *r)
{
    for (entry_t *e = *bucket(c, hash); e != NULL; e = e->chain)
        if (e->hash == hash && e->key_len == key_len && key_equals(e, r))
            return e;
    return NULL;
}

int oi_rcache_lookup(oi_rcache_t *c, const oi_rcache_request_t *r, oi_response_t *resp)
{
    size_t key_len;
    uint32_t hash = key_hash(r, &key_len);
    pthread_mutex_lock(&c->mu);
    entry_t *e = find_locked(c, hash, key_len, r);
    int rc = 0;
    if (e != NULL) {
        lru_unlink(c, e);
        lru_push(c, e);
        if ((resp->outputs = calloc(e->n_outputs ? e->n_outputs : 1, sizeof(oi_tensor_t))) == NULL) {
            rc = -1;
        } else {
            resp->n_outputs = e->n_outputs;
            resp->parameters = e->parameters != NULL ? oi_buf_ref(e->parameters) : NULL;
            for (uint32_t i = 0; i < e->n_outputs; i++) {
                resp->outputs[i] = e->outputs[i];
                resp->outputs[i].owner = oi_buf_ref(e->data);
            }
            rc = 1;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* The entry for `resp`: names, parameters and bytes copied into one buffer. */
static entry_t *entry_new(const oi_response_t *resp, size_t key_len)
{
    size_t size = 0;
    for (uint32_t i = 0; i < resp->n_outputs; i++) {
        const oi_tensor_t *t = &resp->outputs[i];
        size += strlen(t->name) + 1 + t->parameters.len + t->byte_size;
    }
    entry_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    e->data = oi_buf_new(size ? size : 1);
    e->outputs = calloc(resp->n_outputs ? resp->n_outputs : 1, sizeof(oi_tensor_t));
    e->key = malloc(key_len ? key_len : 1);
    if (e->data == NULL || e->outputs == NULL || e->key == NULL) {
        entry_free(e);
        return NULL;
    }
    char *at = e->data->data;
    for (uint32_t i = 0; i < resp->n_outputs; i++) {
        const oi_tensor_t *t = &resp->outputs[i];
        oi_tensor_t *o = &e->outputs[i];
        o->dtype = t->dtype;
        o->ndim = t->ndim;
        memcpy(o->shape, t->shape, sizeof(o->shape));
        size_t n = strlen(t->name) + 1;
        o->name = memcpy(at, t->name, n);
        at += n;
        if (t->parameters.len > 0)
            o->parameters = (oi_slice_t){memcpy(at, t->parameters.ptr, t->parameters.len), t->parameters.len};
        at += t->parameters.len;
        o->data = at;
        o->byte_size = t->byte_size;
        if (t->byte_size > 0)
            memcpy(at, t->data, t->byte_size);
        at += t->byte_size;
    }
    e->data->len = size;
    e->n_outputs = resp->n_outputs;
    e->parameters = resp->parameters != NULL ? oi_buf_ref(resp->parameters) : NULL;
    e->key_len = key_len;
    e->bytes = sizeof(*e) + key_len + size + resp->n_outputs * sizeof(oi_tensor_t) +
               (resp->parameters != NULL ? resp->parameters->len : 0);
    return e;
}

int oi_rcache_insert(oi_rcache_t *c, const oi_rcache_request_t *r, const oi_response_t *resp)
{
    for (uint32_t i = 0; i < resp->n_outputs; i++)
        if (resp->outputs[i].shm) /* written into a client's region: no bytes to keep */
            return -1;
    size_t key_len;
    uint32_t hash = key_hash(r, &key_len);
    entry_t *e = entry_new(resp, key_len);
    if (e == NULL)
        return -1;
    if (e->bytes > c->capacity) {
        entry_free(e);
        return -1;
    }
    sink_t k = {.put = copy_put, .out = e->key};
    put_key(&k, r);
    e->hash = hash;
    pthread_mutex_lock(&c->mu);
    entry_t *old = find_locked(c, hash, key_len, r); /* another request with the same key won */
    if (old != NULL)
        remove_entry(c, old);
    while (c->used + e->bytes > c->capacity)
        remove_entry(c, c->oldest);
    maybe_grow(c);
    e->chain = *bucket(c, hash);
    *bucket(c, hash) = e;
    lru_push(c, e);
    c->used += e->bytes;
    c->n_entries++;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

void oi_rcache_usage(oi_rcache_t *c, size_t *entries, size_t *bytes)
{
    pthread_mutex_lock(&c->mu);
    *entries = c->n_entries;
    *bytes = c->used;
    pthread_mutex_unlock(&c->mu);
}
