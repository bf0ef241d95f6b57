#include "backends/process_bls.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/bls_chain.h"
#include "core/dtype.h"

/* A reader over one record: every read is bounds-checked; `bad` once one fell short. */
typedef struct {
    const char *p;
    size_t len, at;
    int bad;
} rd_t;

static const char *rd_take(rd_t *r, size_t n)
{
    if (r->bad || n > r->len - r->at) {
        r->bad = 1;
        return NULL;
    }
    const char *at = r->p + r->at;
    r->at += n;
    return at;
}

static uint32_t rd_u32(rd_t *r)
{
    uint32_t v = 0;
    const char *at = rd_take(r, 4);
    if (at != NULL)
        memcpy(&v, at, 4);
    return v;
}

static uint64_t rd_u64(rd_t *r)
{
    uint64_t v = 0;
    const char *at = rd_take(r, 8);
    if (at != NULL)
        memcpy(&v, at, 8);
    return v;
}

/* A string, copied NUL-terminated into the request's aux buffer (`aux`, sized for all). */
static const char *rd_str(rd_t *r, oi_buf_t *aux)
{
    uint32_t n = rd_u32(r);
    const char *at = rd_take(r, n);
    if (at == NULL || memchr(at, '\0', n) != NULL || n + 1 > aux->cap - aux->len) {
        r->bad = 1;
        return NULL;
    }
    char *out = aux->data + aux->len;
    memcpy(out, at, n);
    out[n] = '\0';
    aux->len += n + 1;
    return out;
}

static void unmap_release(oi_buf_t *b)
{
    munmap(b->data, b->len);
    free(b);
}

typedef struct {
    const char *model, *version;
    uint32_t flags;
} head_t;

/* Points `t` at `size` bytes at `offset` of the memfd's mapping (`owner`) or, source k > 0, of
 * the caller's input k-1 (the array the model passed on is a view of it): a reference to the
 * memory that holds them, no copy. 0, or -1 out of bounds. */
static int place(oi_tensor_t *t, uint32_t source, uint64_t offset, uint64_t size, oi_buf_t *owner,
                 const oi_request_t *caller)
{
    const char *base = owner->data;
    uint64_t len = owner->len;
    oi_buf_t *holder = owner;
    if (source > 0) {
        if (source > caller->n_inputs)
            return -1;
        const oi_tensor_t *in = &caller->inputs[source - 1];
        base = in->data;
        len = in->byte_size;
        holder = in->owner;
    }
    if (offset > len || size > len - offset || (size > 0 && holder == NULL))
        return -1;
    t->data = (char *)base + offset;
    t->byte_size = size;
    t->owner = holder != NULL ? oi_buf_ref(holder) : NULL;
    return 0;
}

/* The request in the mapping `owner` into `req`; 0, or -1 when malformed. */
static int parse(oi_buf_t *owner, const oi_request_t *caller, oi_request_t *req, head_t *h)
{
    rd_t r = {.p = owner->data, .len = owner->len};
    uint32_t n_in = rd_u32(&r), n_out = rd_u32(&r);
    h->flags = rd_u32(&r);
    (void)rd_u32(&r);
    req->timeout_us = rd_u64(&r);
    req->seq.id = rd_u64(&r);
    if (r.bad || n_in > 4096 || n_out > 4096)
        return -1;
    /* Every string is shorter than the record: the record's size bounds them all. */
    if ((req->aux = oi_buf_new(owner->len + 64)) == NULL ||
        (req->inputs = calloc(n_in ? n_in : 1, sizeof(*req->inputs))) == NULL ||
        (req->outputs = calloc(n_out ? n_out : 1, sizeof(*req->outputs))) == NULL)
        return -1;
    h->model = rd_str(&r, req->aux);
    h->version = rd_str(&r, req->aux);
    const char *id = rd_str(&r, req->aux), *params = rd_str(&r, req->aux), *seq_str = rd_str(&r, req->aux);
    if (r.bad)
        return -1;
    if (id[0] != '\0') {
        req->id = id;
        req->id_len = strlen(id);
    }
    if (params[0] != '\0')
        req->parameters = (oi_slice_t){.ptr = params, .len = strlen(params)};
    if (seq_str[0] != '\0') {
        req->seq.id_str = seq_str;
        req->seq.id_str_len = strlen(seq_str);
    }
    req->seq.start = (h->flags & OI_PW_BLS_SEQ_START) != 0;
    req->seq.end = (h->flags & OI_PW_BLS_SEQ_END) != 0;
    for (uint32_t i = 0; i < n_in; i++) {
        oi_tensor_t *t = &req->inputs[i];
        t->name = rd_str(&r, req->aux);
        const char *dtype = rd_str(&r, req->aux);
        uint32_t ndim = rd_u32(&r), source = rd_u32(&r);
        if (r.bad || ndim > OI_MAX_DIMS)
            return -1;
        t->dtype = oi_dtype_from_name(dtype, strlen(dtype));
        t->ndim = (int)ndim;
        for (uint32_t d = 0; d < ndim; d++)
            t->shape[d] = (int64_t)rd_u64(&r);
        uint64_t offset = rd_u64(&r), size = rd_u64(&r);
        if (r.bad || t->dtype == OI_TYPE_INVALID || place(t, source, offset, size, owner, caller) != 0)
            return -1;
        req->n_inputs++;
    }
    for (uint32_t i = 0; i < n_out; i++) {
        req->outputs[i].name = rd_str(&r, req->aux);
        req->outputs[i].binary_data = -1;
        req->n_outputs++;
    }
    return r.bad ? -1 : 0;
}

static void put(char **at, const void *v, size_t n)
{
    memcpy(*at, v, n);
    *at += n;
}

static void put_str(char **at, const char *s)
{
    uint32_t n = (uint32_t)strlen(s);
    put(at, &n, 4);
    put(at, s, n);
}

/* One response of call `id` into a memfd of its own, sent as BLS_PART. */
static int send_part(int sock, uint64_t id, const oi_response_t *resp)
{
    uint32_t params_len = resp->parameters != NULL ? (uint32_t)resp->parameters->len : 0;
    size_t head = 16 + params_len, data = 0;
    for (uint32_t i = 0; i < resp->n_outputs; i++) {
        const oi_tensor_t *t = &resp->outputs[i];
        head += 4 + strlen(t->name) + 4 + strlen(oi_dtype_name(t->dtype)) + 4 + 8 * (size_t)t->ndim + 16;
        data += (t->byte_size + 63) & ~(size_t)63;
    }
    head = (head + 63) & ~(size_t)63;
    int fd = memfd_create("openinfer-bls", MFD_CLOEXEC);
    char *base = MAP_FAILED;
    if (fd < 0 || ftruncate(fd, (off_t)(head + data)) != 0 ||
        (base = mmap(NULL, head + data, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    char *at = base;
    uint32_t n = resp->n_outputs, final = resp->final, zero = 0;
    put(&at, &n, 4);
    put(&at, &final, 4);
    put(&at, &params_len, 4);
    put(&at, &zero, 4);
    uint64_t offset = head;
    for (uint32_t i = 0; i < n; i++) {
        const oi_tensor_t *t = &resp->outputs[i];
        put_str(&at, t->name);
        put_str(&at, oi_dtype_name(t->dtype));
        uint32_t ndim = (uint32_t)t->ndim;
        put(&at, &ndim, 4);
        put(&at, t->shape, 8 * (size_t)t->ndim);
        uint64_t size = t->byte_size;
        put(&at, &offset, 8);
        put(&at, &size, 8);
        if (size > 0)
            memcpy(base + offset, t->data, size);
        offset += (size + 63) & ~(uint64_t)63;
    }
    if (params_len > 0)
        put(&at, resp->parameters->data, params_len);
    munmap(base, head + data);
    oi_pw_reply_t r = {.type = OI_PW_BLS_PART, .block = id};
    oi_pw_fds_t fds = {.fd = {fd}, .n = 1};
    int rc = oi_pw_send(sock, &r, sizeof(r), &fds);
    close(fd);
    return rc;
}

static int send_end(int sock, uint64_t id, const oi_status_t *st)
{
    char buf[OI_PW_MAX_MESSAGE];
    oi_pw_reply_t *r = (oi_pw_reply_t *)buf;
    memset(r, 0, sizeof(*r));
    r->type = OI_PW_BLS_END;
    r->block = id;
    size_t len = sizeof(*r);
    if (st != NULL) {
        r->code = (uint32_t)st->code;
        size_t n = strlen(st->message);
        if (n > sizeof(buf) - len)
            n = sizeof(buf) - len;
        memcpy(buf + len, st->message, n);
        len += n;
    }
    return oi_pw_send(sock, buf, len, NULL);
}

int oi__pw_bls_init(oi_pw_bls_calls_t *c, const oi_pw_bls_hook_t *hook)
{
    c->hook = hook;
    c->n = 0;
    c->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return c->wake < 0 ? -1 : 0;
}

void oi__pw_bls_destroy(oi_pw_bls_calls_t *c)
{
    oi__pw_bls_end_all(c, -1, NULL);
    if (c->wake >= 0)
        close(c->wake);
    c->wake = -1;
}

/* The request in memfd `fd` (taken) into `req`, or why it cannot be had. */
static oi_status_t *read_request(int fd, const oi_request_t *caller, oi_request_t *req, head_t *h)
{
    struct stat sb;
    oi_buf_t *owner = NULL;
    oi_status_t *st = NULL;
    void *base = MAP_FAILED;
    if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_size < 32 ||
        (base = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED ||
        (owner = oi_buf_wrap(base, (size_t)sb.st_size, unmap_release, NULL)) == NULL) {
        if (base != MAP_FAILED)
            munmap(base, (size_t)sb.st_size);
        st = oi_status_new(OI_BAD_REQUEST, "a BLS request from a worker came without its memory");
    } else if (parse(owner, caller, req, h) != 0) {
        st = oi_status_new(OI_BAD_REQUEST, "a BLS request from a worker was malformed");
    }
    if (fd >= 0)
        close(fd);
    oi_buf_unref(owner); /* the inputs hold their references */
    return st;
}

int oi__pw_bls_start(oi_pw_bls_calls_t *c, int sock, uint64_t id, int fd, const oi_request_t *caller,
                     const char *caller_model)
{
    char *chain = NULL;
    oi_request_t req = {.binary_data_output = -1};
    head_t h = {0};
    oi_status_t *st = read_request(fd, caller, &req, &h);
    if (st == NULL && c->hook == NULL)
        st = oi_status_new(OI_UNIMPLEMENTED, "BLS is not available in this worker process");
    if (st == NULL && c->n == OI_PW_MAX_BLS_CALLS)
        st = oi_status_new(OI_UNAVAILABLE,
                           "model '%s': a worker process may have %d BLS calls in flight at once; this one "
                           "would be one more",
                           caller_model, OI_PW_MAX_BLS_CALLS);
    if (st == NULL && (st = oi_bls_chain_extend(caller->bls_chain, caller_model, h.model, &chain)) == NULL)
        req.bls_chain = chain;
    void *call = NULL;
    if (st == NULL)
        call = c->hook->start(c->hook->ctx, h.model, h.version, &req, h.flags, c->wake, &st);
    oi_request_clear(&req);
    free(chain);
    if (call != NULL) {
        c->at[c->n].id = id;
        c->at[c->n++].call = call;
        return 0;
    }
    int rc = send_end(sock, id, st);
    oi_status_free(st);
    return rc;
}

/* Releases call i, the last taking its place. */
static void drop(oi_pw_bls_calls_t *c, uint32_t i)
{
    c->hook->release(c->at[i].call);
    c->at[i] = c->at[--c->n];
}

int oi__pw_bls_forward(oi_pw_bls_calls_t *c, int sock)
{
    uint64_t count;
    ssize_t got = read(c->wake, &count, sizeof(count)); /* reset first: a later write wakes again */
    (void)got;
    for (uint32_t i = 0; i < c->n;) {
        oi_response_t resp = {0};
        oi_status_t *st = NULL;
        int more = c->hook->next(c->at[i].call, &resp, &st);
        if (more < 0) {
            i++;
            continue;
        }
        int rc = more > 0 ? send_part(sock, c->at[i].id, &resp) : send_end(sock, c->at[i].id, st);
        oi_response_clear(&resp);
        oi_status_free(st);
        if (more == 0)
            drop(c, i);
        if (rc != 0)
            return -1;
    }
    return 0;
}

void oi__pw_bls_cancel(oi_pw_bls_calls_t *c, uint64_t id)
{
    for (uint32_t i = 0; i < c->n; i++)
        if (c->at[i].id == id)
            c->hook->cancel(c->at[i].call);
}

void oi__pw_bls_cancel_all(oi_pw_bls_calls_t *c)
{
    for (uint32_t i = 0; i < c->n; i++)
        c->hook->cancel(c->at[i].call);
}

void oi__pw_bls_end_all(oi_pw_bls_calls_t *c, int sock, const char *why)
{
    oi_status_t *st = sock >= 0 ? oi_status_new(OI_CLIENT_CLOSED, "%s", why) : NULL;
    while (c->n > 0) {
        if (sock >= 0 && send_end(sock, c->at[c->n - 1].id, st) != 0)
            sock = -1; /* the worker has gone: the others are only released */
        drop(c, c->n - 1);
    }
    oi_status_free(st);
}
