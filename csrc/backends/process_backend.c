#include "backends/process_backend.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/instances.h"
#include "backends/process_wire.h"
#include "core/cpus.h"
#include "core/thread.h"

/* How often a waiting executor looks whether its request's clients have gone. */
#define CANCEL_POLL_MS 20
/* Inputs this large, when already in shared memory, are mapped by the worker, not copied. */
#define SHARE_MIN_BYTES ((size_t)64 << 10)
/* How long release() gives workers to exit after their socket closed, before SIGKILL. */
#define EXIT_GRACE_MS 3000
/* The watcher replaces a worker that died BACKOFF_RESET_MS or more after its start at once;
 * one that died sooner (at its import, say) waits, from BACKOFF_MIN_MS doubling up to
 * BACKOFF_MAX_MS, so a model whose workers die as they start is not started in a tight loop. */
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 10000
#define BACKOFF_RESET_MS 10000

/* A mapping of a worker's result ring (or of one result's own memfd) that the responses
 * holding outputs in it share: unmapped when the last of them and the pool let go. */
typedef struct mapping_s {
    atomic_int refs;
    char *base;
    size_t len;
} mapping_t;

typedef struct worker_s {
    pid_t pid;   /* 0: not running */
    int sock;    /* our end of its socketpair; -1 when not running (atomic: the watcher reads it) */
    int ready;   /* READY received: it has imported the model */
    int jobs_fd; /* the job area, kept across restarts */
    char *jobs;
    size_t jobs_len;
    mapping_t *results; /* the running worker's ring; a restarted worker gets a new one */
    uint64_t started_ms;    /* when it was last started (monotonic) */
    int backoff_ms;         /* the watcher's wait before its next start: 0 after a long life */
    uint64_t next_start_ms; /* the watcher starts it again no sooner (only the watcher) */
    oi_pw_bls_calls_t bls;  /* its model's BLS calls in flight (only during a job) */
} worker_t;

typedef struct pool_s {
    char *model_name;
    char **argv, **envp;
    char *recipe;
    size_t recipe_len, ring_bytes;
    oi__instances_t idle;
    oi_pw_bls_hook_t bls;
    int has_bls;
    int n_bls_ready; /* workers whose bls is initialized (for release) */
    /* The watcher: a thread that replaces a worker as its socket hangs up (it died while
     * idle), so the model is whole again without waiting for a request to find it dead. */
    pthread_t watcher;
    int has_watcher;
    int wake[2];              /* written to stop the watcher */
    unsigned char stopping;   /* set (atomic) on release: the watcher ends, its start is given up */
    struct pollfd *watch_fds; /* the watcher's: wake[0] and each worker's socket */
    int n;
    worker_t workers[];
} pool_t;

/* ---- memory ------------------------------------------------------------------------------ */

static mapping_t *mapping_new(int fd, size_t len)
{
    mapping_t *m = malloc(sizeof(*m));
    if (m == NULL)
        return NULL;
    m->base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m->base == MAP_FAILED) {
        free(m);
        return NULL;
    }
    atomic_init(&m->refs, 1);
    m->len = len;
    return m;
}

static void mapping_unref(mapping_t *m)
{
    if (m != NULL && atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1) {
        munmap(m->base, m->len);
        free(m);
    }
}

/* Moves `fd` above the three numbers the worker expects, so that dup2 onto them always
 * makes a new descriptor (dup2 of a number onto itself would keep FD_CLOEXEC). */
static int high_fd(int fd)
{
    if (fd < 0)
        return -1;
    int hi = fcntl(fd, F_DUPFD_CLOEXEC, 10);
    close(fd);
    return hi;
}

/* Makes the job area at least `len` bytes (the worker maps it again when told its size). */
static int grow_jobs(worker_t *w, size_t len)
{
    if (len <= w->jobs_len)
        return 0;
    size_t want = w->jobs_len * 2 > len ? w->jobs_len * 2 : len;
    if (ftruncate(w->jobs_fd, (off_t)want) != 0)
        return -1;
    char *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, w->jobs_fd, 0);
    if (p == MAP_FAILED)
        return -1;
    if (w->jobs != NULL)
        munmap(w->jobs, w->jobs_len);
    w->jobs = p;
    w->jobs_len = want;
    return 0;
}

/* The block the server holds for the outputs of one response: freed in the ring by flag
 * once every output's owner reference has gone (the worker reuses it after that). */
static void lease_release(oi_buf_t *b)
{
    oi_pw_block_t *block = (oi_pw_block_t *)b->data;
    atomic_store_explicit(&block->state, OI_PW_BLOCK_FREE, memory_order_release);
    mapping_unref(b->ctx);
    free(b);
}

/* ---- worker life ------------------------------------------------------------------------- */

static uint64_t mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static void stop_worker(worker_t *w)
{
    int sock = w->sock;
    __atomic_store_n(&w->sock, -1, __ATOMIC_RELEASE); /* before the number can be reused */
    if (sock >= 0)
        close(sock);
    mapping_unref(w->results);
    w->results = NULL;
    w->ready = 0;
}

/* How a reaped worker ended, for messages: "exited with status 3", "was killed by signal 9". */
static void describe_exit(int status, char *out, size_t cap)
{
    if (WIFSIGNALED(status))
        snprintf(out, cap, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else if (WIFEXITED(status))
        snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
    else
        snprintf(out, cap, "ended");
}

/* Starts a worker: a fresh result ring and socketpair, the job area holding the recipe. */
static int spawn_worker(pool_t *p, worker_t *w, char *err, size_t errlen)
{
    int sv[2] = {-1, -1}, ring_fd = -1;
    if (w->jobs_fd < 0) {
        w->jobs_fd = high_fd(memfd_create("openinfer-jobs", MFD_CLOEXEC));
        if (w->jobs_fd < 0)
            goto sys_fail;
    }
    if (grow_jobs(w, OI_PW_DESC_OFFSET + p->recipe_len) != 0)
        goto sys_fail;
    memset(w->jobs, 0, OI_PW_DESC_OFFSET);
    ((oi_pw_shared_t *)w->jobs)->index = (uint32_t)(w - p->workers); /* a Triton instance's name */
    memcpy(w->jobs + OI_PW_DESC_OFFSET, p->recipe, p->recipe_len);
    ring_fd = high_fd(memfd_create("openinfer-results", MFD_CLOEXEC));
    if (ring_fd < 0 || ftruncate(ring_fd, (off_t)p->ring_bytes) != 0 ||
        (w->results = mapping_new(ring_fd, p->ring_bytes)) == NULL)
        goto sys_fail;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        goto sys_fail;
    sv[0] = high_fd(sv[0]);
    sv[1] = high_fd(sv[1]);
    if (sv[0] < 0 || sv[1] < 0)
        goto sys_fail;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, sv[1], OI_PW_FD_SOCKET);
    posix_spawn_file_actions_adddup2(&fa, w->jobs_fd, OI_PW_FD_JOBS);
    posix_spawn_file_actions_adddup2(&fa, ring_fd, OI_PW_FD_RESULTS);
    pid_t pid;
    int rc = posix_spawn(&pid, p->argv[0], &fa, NULL, p->argv, p->envp);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        errno = rc;
        goto sys_fail;
    }
    close(sv[1]);
    close(ring_fd);
    w->pid = pid;
    w->ready = 0;
    w->started_ms = mono_ms();
    __atomic_store_n(&w->sock, sv[0], __ATOMIC_RELEASE);
    return 0;
sys_fail:
    snprintf(err, errlen, "cannot start a worker process for model '%s': %s", p->model_name, strerror(errno));
    if (sv[0] >= 0)
        close(sv[0]);
    if (sv[1] >= 0)
        close(sv[1]);
    if (ring_fd >= 0)
        close(ring_fd);
    mapping_unref(w->results);
    w->results = NULL;
    return -1;
}

/* Reaps a worker whose socket failed (it died, or broke the wire: then it is killed) and
 * says how it ended. */
static void reap_worker(worker_t *w, char *how, size_t cap)
{
    int status = 0;
    stop_worker(w);
    if (w->pid > 0 && waitpid(w->pid, &status, WNOHANG) == 0) {
        /* The socket closes as a process exits: give it a moment, then make sure. */
        for (int i = 0; i < 100 && waitpid(w->pid, &status, WNOHANG) == 0; i++)
            usleep(1000);
        if (kill(w->pid, 0) == 0) {
            kill(w->pid, SIGKILL);
            waitpid(w->pid, &status, 0);
        }
    }
    describe_exit(status, how, cap);
    w->pid = 0;
}

/* Receives one message (and the fd that may come with it). Returns its length, 0 when the
 * worker has gone, or -1 (errno). */
static ssize_t recv_message(int sock, char *buf, size_t cap, int *fd)
{
    oi_pw_fds_t fds;
    ssize_t n = oi_pw_recv(sock, buf, cap, &fds, 1);
    *fd = fds.n > 0 ? fds.fd[0] : -1;
    if (n > 0 && (size_t)n < sizeof(oi_pw_reply_t)) {
        oi_pw_close_fds(&fds);
        errno = EPROTO;
        return -1;
    }
    return n;
}

/* The status a worker's ERROR message carries. */
static oi_status_t *error_reply(const char *buf, size_t len)
{
    const oi_pw_reply_t *r = (const void *)buf;
    int code = oi_status_code_valid(r->code) ? (int)r->code : OI_INTERNAL;
    return oi_status_new(code, "%.*s", (int)(len - sizeof(*r)), buf + sizeof(*r));
}

/* Appends a PARAMS_ONE piece to request k's response parameters; -1 when out of memory. */
static int add_parameters(const oi_request_t *req, uint64_t k, const char *piece, size_t len)
{
    oi_buf_t *b = req->batch_resp_params[k];
    size_t have = b != NULL ? b->len : 0;
    oi_buf_t *grown = b == NULL ? oi_buf_new(len) : oi_buf_grow(b, have + len);
    if (grown == NULL)
        return -1;
    memcpy(grown->data + have, piece, len);
    grown->len = have + len;
    req->batch_resp_params[k] = grown;
    return 0;
}

static int stopped(const unsigned char *stop) { return stop != NULL && __atomic_load_n(stop, __ATOMIC_RELAXED); }

/* Waits until a started worker has imported the model, or `stop` (may be NULL) is set: then
 * the worker is left to the caller. NULL, or why it is not ready. */
static oi_status_t *await_ready(pool_t *p, worker_t *w, const unsigned char *stop)
{
    char buf[OI_PW_MAX_MESSAGE], how[96];
    int fd;
    for (struct pollfd pfd = {w->sock, POLLIN, 0}; stop != NULL;) {
        if (stopped(stop))
            return oi_status_new(OI_UNAVAILABLE, "model '%s': the load was stopped", p->model_name);
        int r = poll(&pfd, 1, CANCEL_POLL_MS);
        if (r > 0 || (r < 0 && errno != EINTR))
            break; /* a message, or an error that recv reports */
    }
    ssize_t n = recv_message(w->sock, buf, sizeof(buf), &fd);
    if (fd >= 0)
        close(fd);
    const oi_pw_reply_t *r = (const void *)buf;
    if (n > 0 && r->type == OI_PW_READY) {
        w->ready = 1;
        return NULL;
    }
    oi_status_t *st = n > 0 && r->type == OI_PW_ERROR ? error_reply(buf, (size_t)n) : NULL;
    pid_t pid = w->pid;
    reap_worker(w, how, sizeof(how));
    if (st != NULL) {
        oi_status_t *wrapped = oi_status_new(OI_UNAVAILABLE, "%s", st->message);
        oi_status_free(st);
        return wrapped;
    }
    return oi_status_new(OI_UNAVAILABLE, "model '%s': its worker process (pid %d) %s while importing the model",
                         p->model_name, (int)pid, how);
}

/* ---- one job ----------------------------------------------------------------------------- */

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Where an input travels: its area (0 the job area, else the 1-based slot of the memfd of the
 * buffer holding it) and *offset in that memfd. Small inputs are copied: mapping costs more. */
static uint32_t input_area(const oi_tensor_t *t, oi_pw_fds_t *fds, uint64_t *offset)
{
    if (t->byte_size < SHARE_MIN_BYTES)
        return 0;
    int fd = oi_buf_fd(t->owner, t->data, t->byte_size, offset);
    if (fd < 0)
        return 0;
    for (uint32_t k = 0; k < fds->n; k++)
        if (fds->fd[k] == fd)
            return k + 1;
    if (fds->n == OI_PW_MAX_FDS)
        return 0;
    fds->fd[fds->n++] = fd;
    return fds->n;
}

/* The bytes an id takes in the job area (see oi_pw_request_t). */
static size_t id_size(const char *id) { return pad8(4 + (id != NULL ? strlen(id) + 1 : 0)); }

static char *write_id(char *at, const char *id)
{
    uint32_t len = id != NULL ? (uint32_t)strlen(id) + 1 : 0;
    memcpy(at, &len, 4);
    if (id != NULL)
        memcpy(at + 4, id, len);
    return at + id_size(id);
}

/* A batched request's parameters, laid out as an id is (none: NULL `batch_params` or ptr). */
static const oi_slice_t *batch_params(const oi_request_t *req, uint32_t k)
{
    return req->batch_params != NULL && req->batch_params[k].ptr != NULL ? &req->batch_params[k] : NULL;
}

static size_t params_size(const oi_slice_t *p) { return pad8(4 + (p != NULL ? p->len + 1 : 0)); }

static char *write_params(char *at, const oi_slice_t *p)
{
    uint32_t len = p != NULL ? (uint32_t)p->len + 1 : 0;
    memcpy(at, &len, 4);
    if (p != NULL) {
        memcpy(at + 4, p->ptr, p->len);
        at[4 + p->len] = '\0';
    }
    return at + params_size(p);
}

/* Lays the request out in the job area: the descriptor, then the bytes of each input not
 * already in shared memory (the one copy such an input makes on its way to a worker). */
static int write_job(worker_t *w, const oi_request_t *req, const char *const *names, uint32_t n, oi_pw_fds_t *fds)
{
    size_t desc = OI_PW_DESC_OFFSET + sizeof(oi_pw_request_t);
    for (uint32_t i = 0; i < req->n_inputs; i++)
        desc += sizeof(oi_pw_tensor_t) + pad8(strlen(req->inputs[i].name) + 1);
    for (uint32_t i = 0; i < n; i++)
        desc += 4 + pad8(strlen(names[i]) + 1);
    desc += pad8(req->parameters.len) + id_size(req->id) + req->n_batch * sizeof(int64_t);
    for (uint32_t k = 0; k < req->n_batch; k++)
        desc += id_size(req->batch_ids[k]) + params_size(batch_params(req, k));
    desc = oi_pw_align(desc);
    size_t total = desc;
    uint32_t area[req->n_inputs + 1];
    uint64_t shared_at[req->n_inputs + 1];
    for (uint32_t i = 0; i < req->n_inputs; i++)
        if ((area[i] = input_area(&req->inputs[i], fds, &shared_at[i])) == 0)
            total += oi_pw_align(req->inputs[i].byte_size);
    if (grow_jobs(w, total) != 0)
        return -1;
    char *at = w->jobs + OI_PW_DESC_OFFSET;
    oi_pw_request_t head = {req->n_inputs, n, req->parameters.ptr != NULL, (uint32_t)req->parameters.len,
                            req->n_batch, 0};
    memcpy(at, &head, sizeof(head));
    at += sizeof(head);
    size_t data = desc;
    for (uint32_t i = 0; i < req->n_inputs; i++) {
        const oi_tensor_t *t = &req->inputs[i];
        size_t len = strlen(t->name);
        oi_pw_tensor_t d = {.dtype = t->dtype, .ndim = t->ndim, .name_len = (uint32_t)len, .area = area[i],
                            .offset = area[i] ? shared_at[i] : data, .byte_size = t->byte_size};
        memcpy(d.shape, t->shape, sizeof(d.shape));
        memcpy(at, &d, sizeof(d));
        at += sizeof(d);
        memcpy(at, t->name, len + 1);
        at += pad8(len + 1);
        if (area[i] == 0) {
            if (t->byte_size > 0)
                memcpy(w->jobs + data, t->data, t->byte_size);
            data += oi_pw_align(t->byte_size);
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len = (uint32_t)strlen(names[i]);
        memcpy(at, &len, 4);
        memcpy(at + 4, names[i], len + 1);
        at += 4 + pad8(len + 1);
    }
    if (req->parameters.len > 0)
        memcpy(at, req->parameters.ptr, req->parameters.len);
    at += pad8(req->parameters.len);
    at = write_id(at, req->id);
    if (req->n_batch) {
        memcpy(at, req->batch_rows, req->n_batch * sizeof(int64_t));
        at += req->n_batch * sizeof(int64_t);
    }
    for (uint32_t k = 0; k < req->n_batch; k++)
        at = write_id(at, req->batch_ids[k]);
    for (uint32_t k = 0; k < req->n_batch; k++)
        at = write_params(at, batch_params(req, k));
    return 0;
}

/* Makes `resp` hold the outputs of the block a RESULT or PARTIAL names, in place: each output
 * keeps a reference to a lease on the block. NULL, or a status when the block is not sound. */
static oi_status_t *take_outputs(pool_t *p, worker_t *w, const oi_pw_reply_t *r, int fd, const char *const *names,
                                 uint32_t n, oi_response_t *resp)
{
    mapping_t *m = NULL;
    uint64_t at = 0;
    struct stat sb;
    if (r->flags & OI_PW_IN_MEMFD) {
        if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_size < (off_t)sizeof(oi_pw_block_t) ||
            (m = mapping_new(fd, (size_t)sb.st_size)) == NULL)
            return oi_status_new(OI_INTERNAL, "model '%s': cannot map a worker's result: %s", p->model_name,
                                 fd < 0 ? "no memfd came with it" : strerror(errno));
    } else {
        m = w->results;
        atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
        at = r->block;
    }
    oi_pw_block_t *block = (oi_pw_block_t *)(m->base + at);
    if (at > m->len - sizeof(*block) || block->size > m->len - at ||
        block->size < sizeof(*block) + (uint64_t)block->n_outputs * sizeof(oi_pw_tensor_t) || block->n_outputs != n ||
        block->params_offset > block->size || block->params_len > block->size - block->params_offset) {
        mapping_unref(m);
        return oi_status_new(OI_INTERNAL, "model '%s': a worker sent a malformed result", p->model_name);
    }
    oi_buf_t *lease = oi_buf_wrap(block, block->size, lease_release, m);
    if (lease == NULL) {
        mapping_unref(m);
        return oi_status_new(OI_INTERNAL, "out of memory");
    }
    oi_status_t *st = NULL;
    resp->final = block->final != 0;
    resp->outputs = calloc(n ? n : 1, sizeof(oi_tensor_t));
    if (block->params_len > 0 && resp->outputs != NULL) /* copied: a few bytes, kept past the lease */
        resp->parameters = oi_buf_new(block->params_len);
    if (resp->outputs == NULL || (block->params_len > 0 && resp->parameters == NULL))
        st = oi_status_new(OI_INTERNAL, "out of memory");
    else if (block->params_len > 0) {
        memcpy(resp->parameters->data, (char *)block + block->params_offset, block->params_len);
        resp->parameters->len = block->params_len;
    }
    const oi_pw_tensor_t *d = (const oi_pw_tensor_t *)(block + 1);
    for (uint32_t i = 0; st == NULL && i < n; i++) {
        if (d[i].ndim == OI_PW_ABSENT) {
            resp->outputs[i] = (oi_tensor_t){.name = names[i], .absent = 1};
            resp->n_outputs = i + 1;
            continue;
        }
        if (d[i].dtype <= OI_TYPE_INVALID || d[i].dtype >= OI_TYPE_COUNT || d[i].ndim < 0 || d[i].ndim > OI_MAX_DIMS ||
            d[i].offset > block->size || d[i].byte_size > block->size - d[i].offset) {
            st = oi_status_new(OI_INTERNAL, "model '%s': a worker sent a malformed output '%s'", p->model_name,
                               names[i]);
            break;
        }
        oi_tensor_t *t = &resp->outputs[i];
        t->name = names[i];
        t->dtype = (oi_dtype_t)d[i].dtype;
        t->ndim = d[i].ndim;
        memcpy(t->shape, d[i].shape, sizeof(t->shape));
        t->data = (char *)block + d[i].offset;
        t->byte_size = d[i].byte_size;
        t->owner = oi_buf_ref(lease);
        resp->n_outputs = i + 1;
    }
    oi_buf_unref(lease);
    return st;
}

/* Tells the worker whether a decoupled response went out. */
static int answer_partial(worker_t *w, int sent)
{
    uint32_t type = sent ? OI_PW_ACK : OI_PW_STOP;
    return oi_pw_send(w->sock, &type, sizeof(type), NULL);
}

/* Receives the next reply of a job, telling the worker (by the shared flag) once the
 * request's clients have all gone, and carrying its BLS calls' responses back meanwhile. */
static ssize_t next_reply(worker_t *w, const oi_request_t *req, char *buf, size_t cap, int *fd)
{
    struct pollfd pfd[2] = {{.fd = w->sock, .events = POLLIN}, {.fd = w->bls.wake, .events = POLLIN}};
    oi_pw_shared_t *shared = (oi_pw_shared_t *)w->jobs;
    for (;;) {
        int rc = poll(pfd, 2, req->cancelled != NULL ? CANCEL_POLL_MS : -1);
        if (rc < 0 && errno != EINTR)
            return -1;
        if (rc > 0 && (pfd[1].revents & POLLIN) && oi__pw_bls_forward(&w->bls, w->sock) != 0)
            return -1;
        if (rc > 0 && pfd[0].revents != 0)
            return recv_message(w->sock, buf, cap, fd);
        if (req->cancelled != NULL && req->cancelled(req->cancelled_arg)) {
            atomic_store_explicit(&shared->cancelled, 1, memory_order_relaxed);
            oi__pw_bls_cancel_all(&w->bls); /* the model's calls go with its clients */
        }
    }
}

static oi_status_t *run_job(pool_t *p, worker_t *w, const oi_request_t *req, const char *const *names, uint32_t n,
                            oi_response_t *resp)
{
    oi_pw_fds_t fds = {.n = 0};
    if (write_job(w, req, names, n, &fds) != 0)
        return oi_status_new(OI_INTERNAL, "model '%s': cannot lay out the request for a worker: %s", p->model_name,
                             strerror(errno));
    atomic_store_explicit(&((oi_pw_shared_t *)w->jobs)->cancelled, 0, memory_order_relaxed);
    oi_pw_job_t job = {OI_PW_JOB, req->send != NULL ? OI_PW_JOB_DECOUPLED : 0, w->jobs_len};
    char buf[OI_PW_MAX_MESSAGE];
    oi_status_t *st = NULL, *unsent = NULL; /* unsent: why a decoupled response could not go */
    if (oi_pw_send(w->sock, &job, sizeof(job), &fds) != 0)
        goto died;
    for (;;) {
        int fd;
        ssize_t len = next_reply(w, req, buf, sizeof(buf), &fd);
        if (len <= 0)
            goto died;
        const oi_pw_reply_t *r = (const void *)buf;
        if (r->type == OI_PW_FAIL_ONE && req->batch_errors != NULL && r->block < req->n_batch && fd < 0) {
            oi_status_free(req->batch_errors[r->block]);
            req->batch_errors[r->block] = error_reply(buf, (size_t)len);
            continue;
        } else if (r->type == OI_PW_PARAMS_ONE && req->batch_resp_params != NULL && r->block < req->n_batch &&
                   fd < 0) {
            if (add_parameters(req, r->block, buf + sizeof(*r), (size_t)len - sizeof(*r)) != 0 &&
                req->batch_errors != NULL && req->batch_errors[r->block] == NULL)
                req->batch_errors[r->block] = oi_status_new(OI_INTERNAL, "out of memory");
            continue;
        } else if (r->type == OI_PW_ABSENT_ONE && req->batch_absent != NULL && r->block < req->n_batch &&
                   r->code < n && fd < 0) {
            req->batch_absent[r->block * n + r->code] = 1;
            continue;
        } else if (r->type == OI_PW_RESULT && req->send == NULL) {
            st = take_outputs(p, w, r, fd, names, n, resp);
        } else if (r->type == OI_PW_PARTIAL && req->send != NULL) {
            oi_response_t one = {0};
            oi_status_t *bad = take_outputs(p, w, r, fd, names, n, &one);
            if (bad == NULL && unsent == NULL)
                unsent = req->send(req->send_arg, &one);
            oi_response_clear(&one);
            if (bad != NULL && unsent == NULL)
                unsent = bad;
            else
                oi_status_free(bad);
            if (fd >= 0)
                close(fd);
            if (answer_partial(w, unsent == NULL) != 0)
                goto died;
            continue;
        } else if (r->type == OI_PW_BLS) { /* the model calls the server meanwhile */
            if (oi__pw_bls_start(&w->bls, w->sock, r->block, fd, req, p->model_name) != 0)
                goto died;
            continue;
        } else if (r->type == OI_PW_BLS_CANCEL) {
            if (fd >= 0)
                close(fd);
            oi__pw_bls_cancel(&w->bls, r->block);
            continue;
        } else if (r->type == OI_PW_DONE && req->send != NULL) {
        } else if (r->type == OI_PW_ERROR) {
            st = error_reply(buf, (size_t)len);
        } else {
            if (fd >= 0)
                close(fd);
            errno = EPROTO;
            goto died;
        }
        if (fd >= 0)
            close(fd);
        break;
    }
    /* Calls the model left running (a thread of its own, an un-awaited async_exec) end with the
     * job: the request they may name is done, and nobody would carry their answers back. */
    oi__pw_bls_end_all(&w->bls, w->sock, "the request that made this BLS call has ended");
    if (unsent != NULL) { /* the stream ended on our side: the worker's account of it is moot */
        oi_status_free(st);
        return unsent;
    }
    return st;
died:;
    char how[96];
    pid_t pid = w->pid;
    oi__pw_bls_end_all(&w->bls, -1, NULL);
    reap_worker(w, how, sizeof(how));
    oi_status_free(unsent);
    oi_response_clear(resp);
    char err[256];
    if (spawn_worker(p, w, err, sizeof(err)) != 0) /* its successor imports the model meanwhile */
        w->pid = 0;
    return oi_status_new(OI_INTERNAL, "model '%s': its worker process (pid %d) %s while serving the request",
                         p->model_name, (int)pid, how);
}

static oi_status_t *proc_execute(void *state, const oi_request_t *req, const char *const *names, uint32_t n,
                                 oi_response_t *resp)
{
    pool_t *p = state;
    int i = oi__instances_acquire(&p->idle);
    worker_t *w = &p->workers[i];
    oi_status_t *st = NULL;
    char err[256];
    if (w->pid == 0 && spawn_worker(p, w, err, sizeof(err)) != 0)
        st = oi_status_new(OI_UNAVAILABLE, "%s", err);
    if (st == NULL && !w->ready)
        st = await_ready(p, w, NULL);
    if (st == NULL)
        st = run_job(p, w, req, names, n, resp);
    oi__instances_release(&p->idle, i);
    return st;
}

/* ---- the watcher ------------------------------------------------------------------------- */

/* With worker `w`'s instance held: whether its process has gone (its socket hung up). */
static int hung_up(const worker_t *w)
{
    struct pollfd pfd = {w->sock, 0, 0}; /* no events asked: only a hang-up or an error shows */
    return w->sock < 0 || (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0);
}

/* The wait before a worker that has just ended, or failed to start, is started again. */
static void back_off(worker_t *w, uint64_t now)
{
    if (now - w->started_ms >= BACKOFF_RESET_MS)
        w->backoff_ms = 0;
    else
        w->backoff_ms = w->backoff_ms == 0 ? BACKOFF_MIN_MS
                                           : (w->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : w->backoff_ms * 2);
    w->next_start_ms = now + (uint64_t)w->backoff_ms;
}

/* With worker `w`'s instance held and its process gone (or not running): reaps it, and starts
 * its successor once its back-off has passed, waiting (the instance held, as a request that
 * finds a worker importing does) until it has imported the model. Only this one start runs
 * here at a time, within the CPUs' window the load used. Returns whether it did anything. */
static int replace(pool_t *p, worker_t *w)
{
    char how[96], err[256];
    uint64_t now = mono_ms();
    if (w->pid > 0) {
        reap_worker(w, how, sizeof(how));
        back_off(w, now);
        return 1;
    }
    if (now < w->next_start_ms)
        return 0;
    if (spawn_worker(p, w, err, sizeof(err)) != 0) {
        w->pid = 0;
        back_off(w, now);
        return 1;
    }
    oi_status_t *st = await_ready(p, w, &p->stopping); /* reaps a worker that failed */
    if (st != NULL && w->pid == 0)
        back_off(w, mono_ms());
    oi_status_free(st); /* a worker left importing by the stop is the release's to end */
    return 1;
}

static void *watch_main(void *arg)
{
    pool_t *p = arg;
    struct pollfd *fds = p->watch_fds;
    while (!stopped(&p->stopping)) {
        uint64_t now = mono_ms();
        int nfds = 1, timeout = -1;
        fds[0] = (struct pollfd){p->wake[0], POLLIN, 0};
        for (int i = 0; i < p->n; i++) {
            worker_t *w = &p->workers[i];
            int sock = __atomic_load_n(&w->sock, __ATOMIC_ACQUIRE);
            if (sock >= 0) {
                fds[nfds++] = (struct pollfd){sock, 0, 0};
            } else { /* none running: start one when its back-off has passed */
                int wait = w->next_start_ms > now ? (int)(w->next_start_ms - now) : 0;
                timeout = timeout < 0 || wait < timeout ? wait : timeout;
            }
        }
        if (poll(fds, (nfds_t)nfds, timeout) < 0 && errno != EINTR)
            break;
        int acted = 0;
        for (int i = 0; i < p->n && !stopped(&p->stopping); i++) {
            worker_t *w = &p->workers[i];
            if (!oi__instances_try(&p->idle, i))
                continue; /* busy: its request's executor sees to a death */
            if (w->pid == 0 || hung_up(w))
                acted |= replace(p, w);
            oi__instances_release(&p->idle, i);
        }
        if (!acted) { /* a hang-up its executor has yet to see: look again shortly */
            struct pollfd wake = {p->wake[0], POLLIN, 0};
            poll(&wake, 1, CANCEL_POLL_MS);
        }
    }
    return NULL;
}

/* Starts the watcher; 0, or -1 (errno). */
static int start_watcher(pool_t *p)
{
    if ((p->watch_fds = calloc((size_t)p->n + 1, sizeof(*p->watch_fds))) == NULL || pipe2(p->wake, O_CLOEXEC) != 0)
        return -1;
    int rc = oi_thread_create(&p->watcher, "oi-proc-watch", watch_main, p, 0);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    p->has_watcher = 1;
    return 0;
}

/* Ends the watcher (it gives up a start it waits on: the release ends that worker). A second
 * call (abort, then release) does nothing. */
static void stop_watcher(pool_t *p)
{
    __atomic_store_n(&p->stopping, 1, __ATOMIC_RELAXED);
    if (p->has_watcher) {
        char c = 1;
        while (write(p->wake[1], &c, 1) < 0 && errno == EINTR)
            ;
        pthread_join(p->watcher, NULL);
        p->has_watcher = 0;
    }
    for (int i = 0; i < 2; i++)
        if (p->wake[i] >= 0) {
            close(p->wake[i]);
            p->wake[i] = -1;
        }
    free(p->watch_fds);
    p->watch_fds = NULL;
}

/* ---- the pool ---------------------------------------------------------------------------- */

static char **copy_strings(char *const *v)
{
    size_t n = 0;
    while (v[n] != NULL)
        n++;
    char **out = calloc(n + 1, sizeof(char *));
    for (size_t i = 0; out != NULL && i < n; i++)
        if ((out[i] = strdup(v[i])) == NULL) {
            while (i > 0)
                free(out[--i]);
            free(out);
            return NULL;
        }
    return out;
}

static void free_strings(char **v)
{
    for (size_t i = 0; v != NULL && v[i] != NULL; i++)
        free(v[i]);
    free(v);
}

/* Closes every worker's socket, gives them EXIT_GRACE_MS to exit, kills the rest. A worker
 * still importing the model has nothing to finish: it is killed at once. */
static void stop_all(pool_t *p)
{
    for (int i = 0; i < p->n; i++) {
        worker_t *w = &p->workers[i];
        int importing = w->pid > 0 && !w->ready;
        stop_worker(w);
        if (importing)
            kill(w->pid, SIGKILL);
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < p->n; i++) {
        worker_t *w = &p->workers[i];
        while (w->pid > 0 && waitpid(w->pid, NULL, WNOHANG) == 0) {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > EXIT_GRACE_MS) {
                kill(w->pid, SIGKILL);
                waitpid(w->pid, NULL, 0);
                break;
            }
            usleep(2000);
        }
        w->pid = 0;
    }
}

/* An unload's bound has passed with requests running: no worker is started again, and every
 * one is killed, so that each running request reads its worker's end and fails. Executors
 * reap their own workers and clear the pid right after: only in that instant could the number
 * killed be one the kernel has given again. */
static void proc_abort(void *state)
{
    pool_t *p = state;
    stop_watcher(p);
    for (int i = 0; i < p->n; i++) {
        pid_t pid = __atomic_load_n(&p->workers[i].pid, __ATOMIC_ACQUIRE);
        if (pid > 0)
            kill(pid, SIGKILL);
    }
}

static void proc_release(void *state)
{
    pool_t *p = state;
    stop_watcher(p);
    stop_all(p);
    for (int i = 0; i < p->n; i++) {
        worker_t *w = &p->workers[i];
        if (i < p->n_bls_ready)
            oi__pw_bls_destroy(&w->bls);
        if (w->jobs != NULL)
            munmap(w->jobs, w->jobs_len);
        if (w->jobs_fd >= 0)
            close(w->jobs_fd);
    }
    oi__instances_destroy(&p->idle);
    free_strings(p->argv);
    free_strings(p->envp);
    free(p->recipe);
    free(p->model_name);
    free(p);
}

void *oi_process_backend_start(const char *model_name, int n, const oi_process_spec_t *spec, char *err, size_t errlen)
{
    pool_t *p = calloc(1, sizeof(*p) + (size_t)n * sizeof(worker_t));
    if (p == NULL)
        goto oom;
    oi_buf_share_large(); /* large request tensors reach workers without a copy (input_area) */
    p->n = n;
    p->wake[0] = p->wake[1] = -1;
    for (int i = 0; i < n; i++) {
        p->workers[i].sock = -1;
        p->workers[i].jobs_fd = -1;
    }
    p->ring_bytes = oi_pw_align(spec->ring_bytes > 4096 ? spec->ring_bytes : 4096);
    p->recipe_len = spec->recipe_len;
    if (spec->bls != NULL) {
        p->bls = *spec->bls;
        p->has_bls = 1;
    }
    if (oi__instances_init(&p->idle, n) != 0 || (p->model_name = strdup(model_name)) == NULL ||
        (p->argv = copy_strings(spec->argv)) == NULL || (p->envp = copy_strings(spec->envp)) == NULL ||
        (p->recipe = malloc(spec->recipe_len ? spec->recipe_len : 1)) == NULL)
        goto oom;
    for (; p->n_bls_ready < n; p->n_bls_ready++)
        if (oi__pw_bls_init(&p->workers[p->n_bls_ready].bls, p->has_bls ? &p->bls : NULL) != 0) {
            snprintf(err, errlen, "model '%s': cannot make an eventfd: %s", p->model_name, strerror(errno));
            goto fail;
        }
    memcpy(p->recipe, spec->recipe, spec->recipe_len);
    /* One import per usable CPU at a time: imports are CPU-bound, more at once would only
     * fork sooner. Each worker is waited for in order; the next starts as one is ready. */
    int window = oi_usable_cpus(), started = 0;
    for (int i = 0; i < n; i++) {
        while (started < n && started - i < window && !stopped(spec->stop))
            if (spawn_worker(p, &p->workers[started++], err, errlen) != 0)
                goto fail;
        oi_status_t *st = await_ready(p, &p->workers[i], spec->stop); /* at once when stopped */
        if (st != NULL) {
            if (stopped(spec->stop))
                snprintf(err, errlen, "model '%s': the load was stopped (unloaded, or its client left) after %d of %d "
                         "worker processes had started", p->model_name, started, n);
            else
                snprintf(err, errlen, "%s", st->message);
            oi_status_free(st);
            goto fail;
        }
    }
    if (start_watcher(p) != 0) {
        snprintf(err, errlen, "model '%s': cannot start its worker watcher: %s", p->model_name, strerror(errno));
        goto fail;
    }
    return p;
oom:
    snprintf(err, errlen, "out of memory");
    if (p == NULL)
        return NULL;
fail:
    proc_release(p);
    return NULL;
}

const oi_backend_t oi_process_backend = {
    .name = "python-process",
    .execute = proc_execute,
    .release = proc_release,
    .abort = proc_abort,
};
