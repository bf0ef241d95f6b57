#include "backends/process_bls.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/process_wire.h"
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

/* The request in the mapping `map` (owned by `owner`) into `req`; 0, or -1 when malformed. */
static int parse(oi_buf_t *owner, oi_request_t *req, head_t *h)
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
        uint32_t ndim = rd_u32(&r);
        if (r.bad || ndim > OI_MAX_DIMS)
            return -1;
        t->dtype = oi_dtype_from_name(dtype, strlen(dtype));
        t->ndim = (int)ndim;
        for (uint32_t d = 0; d < ndim; d++)
            t->shape[d] = (int64_t)rd_u64(&r);
        uint64_t offset = rd_u64(&r), size = rd_u64(&r);
        if (r.bad || t->dtype == OI_TYPE_INVALID || offset > owner->len || size > owner->len - offset)
            return -1;
        t->data = owner->data + offset;
        t->byte_size = size;
        t->owner = oi_buf_ref(owner);
        req->n_inputs++;
    }
    for (uint32_t i = 0; i < n_out; i++) {
        req->outputs[i].name = rd_str(&r, req->aux);
        req->outputs[i].binary_data = -1;
        req->n_outputs++;
    }
    return r.bad ? -1 : 0;
}

typedef struct {
    int sock;
    int gone; /* a send failed: the worker has gone */
} conn_t;

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

/* One response into a memfd of its own, sent as BLS_PART. */
static int send_part(void *arg, const oi_response_t *resp)
{
    conn_t *c = arg;
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
    oi_pw_reply_t r = {.type = OI_PW_BLS_PART};
    oi_pw_fds_t fds = {.fd = {fd}, .n = 1};
    int rc = oi_pw_send(c->sock, &r, sizeof(r), &fds);
    close(fd);
    if (rc != 0)
        c->gone = 1;
    return rc;
}

static int send_end(int sock, const oi_status_t *st)
{
    char buf[OI_PW_MAX_MESSAGE];
    oi_pw_reply_t *r = (oi_pw_reply_t *)buf;
    memset(r, 0, sizeof(*r));
    r->type = OI_PW_BLS_END;
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

/* What cancels a worker's BLS request: its job's clients all went, or the worker itself did
 * (its end of the socket hung up), so that a killed worker's call ends at once. */
typedef struct {
    const oi_request_t *caller;
    int sock;
} probe_t;

static int probe_cancelled(const void *arg)
{
    const probe_t *p = arg;
    if (p->caller->cancelled != NULL && p->caller->cancelled(p->caller->cancelled_arg))
        return 1;
    struct pollfd pfd = {.fd = p->sock, .events = POLLRDHUP};
    return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

int oi__pw_serve_bls(const oi_pw_bls_hook_t *hook, int sock, int fd, const oi_request_t *caller,
                     const char *caller_model)
{
    char *chain = NULL;
    struct stat sb;
    oi_buf_t *owner = NULL;
    oi_request_t req = {.binary_data_output = -1};
    head_t h = {0};
    oi_status_t *st = NULL;
    void *base = MAP_FAILED;
    if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_size < 32 ||
        (base = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED ||
        (owner = oi_buf_wrap(base, (size_t)sb.st_size, unmap_release, NULL)) == NULL) {
        if (base != MAP_FAILED)
            munmap(base, (size_t)sb.st_size);
        st = oi_status_new(OI_BAD_REQUEST, "a BLS request from a worker came without its memory");
    } else if (parse(owner, &req, &h) != 0) {
        st = oi_status_new(OI_BAD_REQUEST, "a BLS request from a worker was malformed");
    }
    if (fd >= 0)
        close(fd);
    oi_buf_unref(owner); /* the inputs hold their references */
    conn_t c = {.sock = sock};
    if (st == NULL && hook == NULL)
        st = oi_status_new(OI_UNIMPLEMENTED, "BLS is not available in this worker process");
    if (st == NULL && (st = oi_bls_chain_extend(caller->bls_chain, caller_model, h.model, &chain)) == NULL)
        req.bls_chain = chain;
    probe_t probe = {caller, sock};
    oi_request_t watch = {.cancelled = probe_cancelled, .cancelled_arg = &probe};
    if (st == NULL)
        st = hook->run(hook->ctx, h.model, h.version, &req, h.flags, send_part, &c, &watch);
    oi_request_clear(&req);
    free(chain);
    int rc = c.gone ? -1 : send_end(sock, st); /* to a worker that died: fails, as it should */
    oi_status_free(st);
    return rc;
}
