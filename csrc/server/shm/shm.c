#include "server/shm/shm.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codec/json.h"
#include "server/shm/shm_guard.h"

/* ---- the CUDA runtime, loaded at run time --------------------------------------------------- */

/* cudaIpcMemHandle_t is a struct of 64 bytes passed by value; this one has its layout. */
typedef struct {
    char reserved[OI_CUDA_IPC_HANDLE_BYTES];
} cuda_ipc_handle_t;

enum { CUDA_MEMCPY_H2D = 1, CUDA_MEMCPY_D2H = 2, CUDA_IPC_LAZY_PEER_ACCESS = 1 };

static struct {
    pthread_once_t once;
    int ok;
    char why[256];
    int (*get_device_count)(int *);
    int (*set_device)(int);
    int (*ipc_open)(void **, cuda_ipc_handle_t, unsigned);
    int (*ipc_close)(void *);
    int (*memcpy_)(void *, const void *, size_t, int);
    const char *(*error_string)(int);
} cuda = {.once = PTHREAD_ONCE_INIT};

static void cuda_load(void)
{
    /* The versioned names come from CUDA's own packages (and torch's wheels, which load them
     * first when torch is imported); OI_CUDART names another. */
    const char *env = getenv("OI_CUDART");
    const char *names[] = {env, "libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"};
    void *h = NULL;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && h == NULL; i++)
        if (names[i] != NULL && names[i][0] != '\0')
            h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(cuda.why, sizeof(cuda.why), "the CUDA runtime (libcudart) could not be loaded on the server");
        return;
    }
    *(void **)&cuda.get_device_count = dlsym(h, "cudaGetDeviceCount");
    *(void **)&cuda.set_device = dlsym(h, "cudaSetDevice");
    *(void **)&cuda.ipc_open = dlsym(h, "cudaIpcOpenMemHandle");
    *(void **)&cuda.ipc_close = dlsym(h, "cudaIpcCloseMemHandle");
    *(void **)&cuda.memcpy_ = dlsym(h, "cudaMemcpy");
    *(void **)&cuda.error_string = dlsym(h, "cudaGetErrorString");
    if (!cuda.get_device_count || !cuda.set_device || !cuda.ipc_open || !cuda.ipc_close || !cuda.memcpy_ ||
        !cuda.error_string) {
        snprintf(cuda.why, sizeof(cuda.why), "the CUDA runtime on the server lacks the IPC functions");
        return; /* the handle stays open: dlclose of a CUDA runtime is not worth the risk */
    }
    int n = 0, rc = cuda.get_device_count(&n);
    if (rc != 0 || n <= 0) {
        snprintf(cuda.why, sizeof(cuda.why), "the server has no usable GPU (cudaGetDeviceCount: %s)",
                 rc != 0 ? cuda.error_string(rc) : "0 devices");
        return;
    }
    cuda.ok = 1;
}

int oi_shm_cuda_available(void)
{
    pthread_once(&cuda.once, cuda_load);
    return cuda.ok;
}

/* ---- objects: an open shm object and its mapping, shared by the regions on it ---------- */

struct oi_shm_object_s {
    oi_shm_object_t *next; /* objects, under objects_mu */
    int refs;              /* under objects_mu: only registrations and releases change it */
    dev_t dev;
    ino_t ino;
    int fd;    /* kept to notice an object that shrank (fstat) */
    uid_t opener; /* the user whose registration opened it: counts against that user's share */
    void *map; /* the object from its first byte, map_len bytes */
    size_t map_len;
    atomic_int faulted; /* a SIGBUS hit the mapping: the object shrank under a request */
};

/* Process-wide, like descriptors: regions outlive their registry (a request may still hold
 * one when its server is gone), and two servers in one process share objects. */
static pthread_mutex_t objects_mu = PTHREAD_MUTEX_INITIALIZER;
static oi_shm_object_t *objects;
static int n_objects;

/* Descriptors that objects may hold: RLIMIT_NOFILE less a reserve, so that accepting
 * connections (and everything else the process opens) never runs out because of regions. */
static int object_budget(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return OI_SHM_MAX_REGIONS;
    long cur = (long)rl.rlim_cur, reserve = cur / 4 > 256 ? cur / 4 : 256;
    long budget = cur - reserve;
    return budget <= 0 ? 0 : budget < OI_SHM_MAX_REGIONS ? (int)budget : OI_SHM_MAX_REGIONS;
}

/* The object open as `fd` (its stat in sb) mapped through at least `end` bytes: an existing
 * one (fd is then closed) or a new one that takes fd, opened for user `uid`, who may hold at
 * most half the budget (so one user never takes every descriptor from the others). *out gets
 * a reference. Returns NULL or a status naming region `name`. */
static oi_status_t *object_get(int fd, const struct stat *sb, uint64_t end, uid_t uid, const char *name,
                               const char *key, oi_shm_object_t **out)
{
    pthread_mutex_lock(&objects_mu);
    for (oi_shm_object_t *o = objects; o != NULL; o = o->next) {
        if (o->dev == sb->st_dev && o->ino == sb->st_ino && o->map_len >= end && !atomic_load(&o->faulted)) {
            o->refs++;
            pthread_mutex_unlock(&objects_mu);
            close(fd);
            *out = o;
            return NULL;
        }
    }
    oi_status_t *st = NULL;
    int budget = object_budget(), share = budget / 2 > 0 ? budget / 2 : 1, mine = 0;
    for (oi_shm_object_t *q = objects; q != NULL; q = q->next)
        mine += q->opener == uid;
    oi_shm_object_t *o = n_objects < budget && mine < share ? calloc(1, sizeof(*o)) : NULL;
    if (n_objects >= budget) {
        st = oi_status_new(429,
                           "shared-memory region '%s' cannot be registered: %d shared-memory objects are open, "
                           "the most this server's descriptor limit allows; unregister some",
                           name, n_objects);
    } else if (mine >= share) {
        st = oi_status_new(429,
                           "shared-memory region '%s' cannot be registered: this user has %d shared-memory objects "
                           "open, the most one user may hold under this server's descriptor limit; unregister some",
                           name, mine);
    } else if (o == NULL) {
        st = oi_status_new(OI_INTERNAL, "out of memory");
    } else {
        /* The whole object as it is now: later regions on it share this mapping. */
        o->map_len = (size_t)sb->st_size;
        o->map = mmap(NULL, o->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (o->map == MAP_FAILED) {
            st = oi_status_new(OI_BAD_REQUEST, "shared-memory region '%s': cannot map key '%s': %s", name, key,
                               strerror(errno));
        } else if (oi_shm_guard_add(o->map, o->map_len, &o->faulted) != 0) {
            munmap(o->map, o->map_len);
            st = oi_status_new(429,
                               "shared-memory region '%s' cannot be registered: too many shared-memory "
                               "mappings in this process",
                               name);
        }
    }
    if (st != NULL) {
        pthread_mutex_unlock(&objects_mu);
        free(o);
        close(fd);
        return st;
    }
    o->refs = 1;
    o->dev = sb->st_dev;
    o->ino = sb->st_ino;
    o->fd = fd;
    o->opener = uid;
    o->next = objects;
    objects = o;
    n_objects++;
    pthread_mutex_unlock(&objects_mu);
    *out = o;
    return NULL;
}

static void object_unref(oi_shm_object_t *o)
{
    pthread_mutex_lock(&objects_mu);
    int last = --o->refs == 0;
    if (last) {
        for (oi_shm_object_t **pp = &objects; *pp != NULL; pp = &(*pp)->next)
            if (*pp == o) {
                *pp = o->next;
                break;
            }
        n_objects--;
    }
    pthread_mutex_unlock(&objects_mu);
    if (!last)
        return;
    oi_shm_guard_remove(o->map);
    munmap(o->map, o->map_len);
    close(o->fd);
    free(o);
}

/* NULL while the object still holds [0, end) and no access faulted, else why not (a 400). */
static oi_status_t *object_check(oi_shm_object_t *o, uint64_t end, const char *label, const char *key,
                                 const char *region, const char *when)
{
    struct stat sb = {0};
    int stat_ok = fstat(o->fd, &sb) == 0;
    int faulted = atomic_load(&o->faulted);
    if (!faulted && stat_ok && (uint64_t)sb.st_size >= end)
        return NULL;
    return oi_status_new(OI_BAD_REQUEST,
                         "%s: the shared-memory object '%s' behind region '%s' shrank to %lld bytes %s%s; "
                         "register the region again",
                         label, key, region, (long long)sb.st_size, when,
                         faulted ? " (an access past its end was refused)" : "");
}

/* ---- regions ------------------------------------------------------------------------------- */

static oi_shm_region_t *region_of(oi_buf_t *b)
{
    return (oi_shm_region_t *)((char *)b - offsetof(oi_shm_region_t, buf));
}

/* The last reference: drop the object (or close the IPC handle) and free. */
static void region_release(oi_buf_t *b)
{
    oi_shm_region_t *r = region_of(b);
    if (r->obj != NULL)
        object_unref(r->obj);
    if (r->dev_ptr != NULL && cuda.ok) {
        cuda.set_device((int)r->device_id);
        cuda.ipc_close(r->dev_ptr);
    }
    free(r->name);
    free(r->key);
    free(r);
}

/* The region a tensor's owner is, or NULL when the owner is some other buffer. */
static oi_shm_region_t *region_owning(oi_buf_t *owner)
{
    return owner != NULL && owner->release == region_release ? region_of(owner) : NULL;
}

static oi_shm_region_t *region_new(oi_shm_kind_t kind, uid_t owner, const char *name)
{
    oi_shm_region_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    atomic_init(&r->buf.refs, 1);
    r->buf.release = region_release;
    r->kind = kind;
    r->owner = owner;
    if ((r->name = strdup(name)) == NULL) {
        free(r);
        return NULL;
    }
    return r;
}

static oi_shm_region_t *region_ref(oi_shm_region_t *r)
{
    oi_buf_ref(&r->buf);
    return r;
}

static void region_unref(oi_shm_region_t *r)
{
    if (r != NULL)
        oi_buf_unref(&r->buf);
}

static const char *kind_name(oi_shm_kind_t kind)
{
    return kind == OI_SHM_CUDA ? "CUDA" : "system";
}

/* ---- the registry -------------------------------------------------------------------------- */

void oi_shm_init(oi_shm_t *s, int allowed)
{
    pthread_mutex_init(&s->mu, NULL);
    s->head = NULL;
    s->count = 0;
    s->allowed = allowed;
}

void oi_shm_destroy(oi_shm_t *s)
{
    pthread_mutex_lock(&s->mu);
    oi_shm_region_t *r = s->head;
    s->head = NULL;
    s->count = 0;
    pthread_mutex_unlock(&s->mu);
    while (r != NULL) {
        oi_shm_region_t *next = r->next;
        region_unref(r);
        r = next;
    }
    pthread_mutex_destroy(&s->mu);
}

static oi_shm_region_t *find_locked(oi_shm_t *s, uid_t owner, const char *name)
{
    for (oi_shm_region_t *r = s->head; r != NULL; r = r->next)
        if (r->owner == owner && strcmp(r->name, name) == 0)
            return r;
    return NULL;
}

/* NULL when registration is open and the peer's user is known, else tritonserver's 501
 * (its words, which clients compare) or a 403. */
static oi_status_t *check_peer(const oi_shm_t *s, const oi_peer_t *peer)
{
    if (!s->allowed)
        return oi_status_new(OI_UNIMPLEMENTED, "Client shared memory is disabled. Start the server with "
                                               "'--allow-client-shm=true' to enable.");
    if (peer->error != 0)
        return oi_status_new(403,
                             "shared memory serves only clients on the server's host whose user it can tell; "
                             "this client's is unknown (%s)",
                             strerror(peer->error));
    return NULL;
}

/* Whether the peer's user may read and write an object of this owner and mode, by the
 * kernel's rule: the owner's bits for its owner, else the group's for a member, else the
 * others'. Root may (as the kernel lets it); ACLs are not consulted. */
static int peer_may_read_write(const oi_peer_t *p, const struct stat *sb)
{
    if (p->uid == 0)
        return 1;
    mode_t need = sb->st_uid == p->uid              ? (S_IRUSR | S_IWUSR)
                  : oi_peer_in_group(p, sb->st_gid) ? (S_IRGRP | S_IWGRP)
                                                    : (S_IROTH | S_IWOTH);
    return (sb->st_mode & need) == need;
}

/* Drops, under the lock, the regions whose unregistering waited for requests and whose last
 * request is done: onto *gone, to be released outside the lock. Every registry access sweeps
 * first, so a waiting unregister shows as done from the first look after the requests end, as
 * in tritonserver. Users are only added under the lock, so a 0 seen here cannot grow. */
static void sweep_locked(oi_shm_t *s, oi_shm_region_t **gone)
{
    for (oi_shm_region_t **pp = &s->head; *pp != NULL;) {
        oi_shm_region_t *r = *pp;
        if (r->unregistering && atomic_load(&r->users) == 0) {
            *pp = r->next;
            r->next = *gone;
            *gone = r;
            s->count--;
        } else {
            pp = &r->next;
        }
    }
}

static void release_list(oi_shm_region_t *gone)
{
    while (gone != NULL) {
        oi_shm_region_t *next = gone->next;
        region_unref(gone);
        gone = next;
    }
}

/* Takes the registry lock after a sweep; unlock_swept releases what the sweep dropped. */
static oi_shm_region_t *lock_swept(oi_shm_t *s)
{
    oi_shm_region_t *gone = NULL;
    pthread_mutex_lock(&s->mu);
    sweep_locked(s, &gone);
    return gone;
}

static void unlock_swept(oi_shm_t *s, oi_shm_region_t *gone)
{
    pthread_mutex_unlock(&s->mu);
    release_list(gone);
}

static oi_status_t *check_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > OI_SHM_MAX_NAME)
        return oi_status_new(OI_BAD_REQUEST, "shared-memory region name must be 1 to %d bytes, got %zu",
                             OI_SHM_MAX_NAME, n);
    return NULL;
}

/* Adds a new region (taking its reference) unless its user has the name already or the
 * registry, or that user's share of it, is full. */
static oi_status_t *add(oi_shm_t *s, oi_shm_region_t *r)
{
    oi_shm_region_t *gone = lock_swept(s);
    oi_shm_region_t *old = find_locked(s, r->owner, r->name);
    int mine = 0;
    for (oi_shm_region_t *q = s->head; q != NULL; q = q->next)
        mine += q->owner == r->owner;
    int limit = s->count >= OI_SHM_MAX_REGIONS        ? OI_SHM_MAX_REGIONS
                : mine >= OI_SHM_MAX_REGIONS_PER_USER ? OI_SHM_MAX_REGIONS_PER_USER
                                                      : 0;
    if (old == NULL && limit == 0) {
        r->next = s->head;
        s->head = r;
        s->count++;
    }
    unlock_swept(s, gone);
    if (old == NULL && limit != 0) {
        oi_status_t *st = oi_status_new(429,
                                        "shared-memory region '%s' cannot be registered: %d regions are "
                                        "registered already, the most this server keeps %s; unregister some",
                                        r->name, limit, limit == OI_SHM_MAX_REGIONS ? "in all" : "for one user");
        region_unref(r);
        return st;
    }
    if (old == NULL)
        return NULL;
    /* tritonserver's ALREADY_EXISTS and words, also while an unregister waits for requests. */
    oi_status_t *st = oi_status_new(409, "shared memory region '%s' already in manager", r->name);
    region_unref(r);
    return st;
}

/* The key prefix tritonserver keeps for its Python backend's own regions. */
#define RESERVED_KEY_PREFIX "triton_python_backend_shm_region_"

/* A POSIX shm name: an optional leading '/', then 1..NAME_MAX bytes with no '/', no "..",
 * no control bytes. Anything else could reach other files through shm_open's directory.
 * Keys of only slashes and keys with the reserved prefix get tritonserver's words. */
static oi_status_t *check_key(const char *name, const char *key)
{
    const char *p = key + strspn(key, "/");
    if (*p == '\0')
        return oi_status_new(OI_BAD_REQUEST, "cannot register shared memory region '%s' - invalid shm key '%.300s'",
                             name, key);
    if (strncmp(p, RESERVED_KEY_PREFIX, strlen(RESERVED_KEY_PREFIX)) == 0)
        return oi_status_new(OI_BAD_REQUEST,
                             "cannot register shared memory region '%s' with key '%.300s' as the key contains the "
                             "reserved prefix '" RESERVED_KEY_PREFIX "'",
                             name, key);
    p = key[0] == '/' ? key + 1 : key;
    size_t n = strlen(p);
    const char *why = NULL;
    if (n > OI_SHM_MAX_NAME)
        why = "it is too long";
    else if (n > OI_SHM_MAX_NAME)
        why = "it is too long";
    else if (strchr(p, '/') != NULL)
        why = "it has a '/' after the leading one (keys are shm names, not paths)";
    else if (strstr(p, "..") != NULL)
        why = "it contains \"..\"";
    for (const char *q = p; why == NULL && *q; q++)
        if ((unsigned char)*q < 0x20 || *q == 0x7f)
            why = "it contains a control character";
    if (why == NULL)
        return NULL;
    return oi_status_new(OI_BAD_REQUEST, "shared-memory key '%.300s' is not a POSIX shared-memory name (\"/name\"): %s",
                         key, why);
}

oi_status_t *oi_shm_register_system(oi_shm_t *s, const oi_peer_t *peer, const char *name, const char *key,
                                    uint64_t offset, uint64_t byte_size)
{
    oi_status_t *st = check_peer(s, peer);
    if (st == NULL)
        st = check_name(name);
    if (st == NULL)
        st = check_key(name, key);
    if (st != NULL)
        return st;
    if (byte_size == 0)
        return oi_status_new(OI_BAD_REQUEST, "shared-memory region '%s': byte_size must be at least 1, got 0", name);
    /* shm_open (glibc) opens below /dev/shm with O_NOFOLLOW; the key was checked to be one
     * name. Opened exactly as registered, as tritonclient created it, with the server's
     * rights; what was opened is then checked against the client's. */
    int fd = shm_open(key, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return oi_status_new(errno == EACCES ? 403 : OI_BAD_REQUEST,
                             "shared-memory region '%s': cannot open shared-memory key '%s': %s", name, key,
                             strerror(errno));
    struct stat sb;
    uint64_t end = 0;
    if (fstat(fd, &sb) != 0) {
        st = oi_status_new(OI_BAD_REQUEST, "shared-memory region '%s': cannot stat key '%s': %s", name, key,
                           strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        st = oi_status_new(OI_BAD_REQUEST, "shared-memory region '%s': key '%s' is not a shared-memory object", name,
                           key);
    } else if (!peer_may_read_write(peer, &sb)) {
        st = oi_status_new(403,
                           "shared-memory region '%s': key '%s' (owner uid %u, mode %04o) may not be read and written "
                           "by the requesting client's user (uid %u); register an object that user can open",
                           name, key, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777), (unsigned)peer->uid);
    } else if (__builtin_add_overflow(offset, byte_size, &end) || end > (uint64_t)sb.st_size) {
        /* tritonserver's words first (clients match them), then the numbers. */
        st = oi_status_new(OI_BAD_REQUEST,
                           "failed to register shared memory region '%s': invalid args: offset %" PRIu64
                           " + byte_size %" PRIu64 " exceeds the %lld bytes of key '%s'",
                           name, offset, byte_size, (long long)sb.st_size, key);
    }
    if (st != NULL) {
        close(fd);
        return st;
    }
    oi_shm_object_t *obj;
    if ((st = object_get(fd, &sb, end, peer->uid, name, key, &obj)) != NULL) /* takes fd */
        return st;
    oi_shm_region_t *r = region_new(OI_SHM_SYSTEM, peer->uid, name);
    if (r == NULL || (r->key = strdup(key)) == NULL) {
        object_unref(obj);
        if (r != NULL)
            region_unref(r);
        return oi_status_new(OI_INTERNAL, "out of memory");
    }
    r->obj = obj;
    r->offset = offset;
    r->byte_size = byte_size;
    r->buf.data = (char *)obj->map + offset;
    r->buf.len = r->buf.cap = (size_t)byte_size;
    return add(s, r);
}

oi_status_t *oi_shm_register_cuda(oi_shm_t *s, const oi_peer_t *peer, const char *name, const void *handle,
                                  size_t handle_len, int64_t device_id, uint64_t byte_size)
{
    oi_status_t *st = check_peer(s, peer);
    if (st == NULL)
        st = check_name(name);
    if (st != NULL)
        return st;
    if (handle_len != OI_CUDA_IPC_HANDLE_BYTES)
        return oi_status_new(OI_BAD_REQUEST,
                             "CUDA shared-memory region '%s': raw_handle must be a %d-byte cudaIpcMemHandle_t, got %zu "
                             "bytes",
                             name, OI_CUDA_IPC_HANDLE_BYTES, handle_len);
    if (byte_size == 0)
        return oi_status_new(OI_BAD_REQUEST, "CUDA shared-memory region '%s': byte_size must be at least 1, got 0",
                             name);
    if (device_id < 0 || device_id > INT32_MAX)
        return oi_status_new(OI_BAD_REQUEST,
                             "CUDA shared-memory region '%s': device_id must be a device number, got "
                             "%" PRId64,
                             name, device_id);
    if (!oi_shm_cuda_available())
        return oi_status_new(OI_BAD_REQUEST, "CUDA shared-memory region '%s' cannot be registered: %s", name, cuda.why);
    cuda_ipc_handle_t h;
    memcpy(h.reserved, handle, sizeof(h.reserved));
    void *dev = NULL;
    int rc = cuda.set_device((int)device_id);
    if (rc == 0)
        rc = cuda.ipc_open(&dev, h, CUDA_IPC_LAZY_PEER_ACCESS);
    /* cudaErrorInvalidContext (201) is what a handle exported by this very process gives:
     * CUDA IPC only crosses processes, so a client in the server's process must send the
     * tensor's bytes instead (openinfer.Client does when its registration is refused). */
    if (rc != 0)
        return oi_status_new(OI_BAD_REQUEST,
                             "CUDA shared-memory region '%s': cannot open the IPC handle on device "
                             "%" PRId64 ": %s%s",
                             name, device_id, cuda.error_string(rc),
                             rc == 201 ? " (a CUDA IPC handle cannot be opened by the process that "
                                         "exported it: is the client running inside the server's process?)"
                                       : "");
    oi_shm_region_t *r = region_new(OI_SHM_CUDA, peer->uid, name);
    if (r == NULL) {
        cuda.ipc_close(dev);
        return oi_status_new(OI_INTERNAL, "out of memory");
    }
    r->dev_ptr = dev;
    r->device_id = device_id;
    r->byte_size = byte_size;
    return add(s, r);
}

oi_status_t *oi_shm_unregister(oi_shm_t *s, const oi_peer_t *peer, oi_shm_kind_t kind, const char *name)
{
    oi_status_t *st = check_peer(s, peer);
    if (st != NULL)
        return st;
    /* As tritonserver: a region in use is marked and stays registered (listed, usable, its
     * name taken) until its last request ends; the next registry access then drops it. */
    pthread_mutex_lock(&s->mu);
    for (oi_shm_region_t *r = s->head; r != NULL; r = r->next)
        if (r->owner == peer->uid && r->kind == kind && (name == NULL || name[0] == '\0' || strcmp(r->name, name) == 0))
            r->unregistering = 1;
    oi_shm_region_t *gone = NULL;
    sweep_locked(s, &gone);
    /* Unknown names are not an error: Triton answers OK too, so "unregister, then register"
     * sequences work from any state. */
    unlock_swept(s, gone);
    return NULL;
}

oi_status_t *oi_shm_list(oi_shm_t *s, const oi_peer_t *peer, oi_shm_kind_t kind, const char *name,
                         oi_shm_region_t ***out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (peer->error != 0)
        return check_peer(s, peer);
    uid_t uid = peer->uid;
    int one = name != NULL && name[0] != '\0';
    oi_status_t *st = NULL;
    oi_shm_region_t *gone = lock_swept(s);
    size_t count = 0;
    for (oi_shm_region_t *r = s->head; r != NULL; r = r->next)
        count += r->owner == uid && r->kind == kind && (!one || strcmp(r->name, name) == 0);
    oi_shm_region_t **arr = calloc(count ? count : 1, sizeof(*arr));
    if (arr == NULL) {
        st = oi_status_new(OI_INTERNAL, "out of memory");
    } else {
        for (oi_shm_region_t *r = s->head; r != NULL; r = r->next)
            if (r->owner == uid && r->kind == kind && (!one || strcmp(r->name, name) == 0))
                arr[(*n)++] = region_ref(r);
    }
    oi_shm_region_t *other = one && count == 0 ? find_locked(s, uid, name) : NULL;
    oi_shm_kind_t other_kind = other ? other->kind : kind;
    unlock_swept(s, gone);
    if (st == NULL && one && count == 0) {
        oi_shm_release_all(arr, *n);
        arr = NULL;
        *n = 0;
        if (other != NULL)
            st = oi_status_new(OI_NOT_FOUND,
                               "the region named '%s' is registered as %s shared memory, not %s shared memory", name,
                               kind_name(other_kind), kind_name(kind));
        else
            st = oi_status_new(OI_NOT_FOUND, "unable to find %s shared-memory region '%s'", kind_name(kind), name);
    }
    *out = arr;
    return st;
}

void oi_shm_release_all(oi_shm_region_t **regions, size_t n)
{
    for (size_t i = 0; i < n; i++)
        region_unref(regions[i]);
    free(regions);
}

/* ---- inputs and outputs -------------------------------------------------------------------- */

/* The shared-memory parameters of one tensor. */
typedef struct shm_params_s {
    char region[OI_SHM_MAX_NAME + 1];
    uint64_t offset;
    uint64_t byte_size;
} shm_params_t;

/* Reads "shared_memory_region" (a string), "shared_memory_byte_size" (required) and
 * "shared_memory_offset" (default 0) from a tensor's parameters. `label` names the tensor for
 * messages ("input 'X'"). Returns NULL with *present set (0 when there is no region), or a
 * 400 status. */
static oi_status_t *read_params(oi_slice_t params, const char *label, shm_params_t *p, int *present)
{
    oi_json_param_t v;
    *present = 0;
    if (oi_json_param(params, "shared_memory_region", &v, p->region, sizeof(p->region)) != 0)
        return oi_status_new(OI_BAD_REQUEST, "%s: malformed parameters", label);
    if (v.kind == OI_JSON_PARAM_ABSENT)
        return NULL;
    if (v.kind != OI_JSON_PARAM_STRING)
        return oi_status_new(OI_BAD_REQUEST, "%s: parameters.shared_memory_region must be a string", label);
    if (v.too_long || v.len == 0 || strlen(p->region) != v.len)
        return oi_status_new(OI_BAD_REQUEST,
                             "%s: parameters.shared_memory_region must be a region name of 1 to %d "
                             "bytes",
                             label, OI_SHM_MAX_NAME);
    *present = 1;
    char none[1];
    oi_json_param(params, "shared_memory_byte_size", &v, none, sizeof(none));
    if (v.kind == OI_JSON_PARAM_ABSENT)
        return oi_status_new(OI_BAD_REQUEST,
                             "%s: parameters.shared_memory_byte_size is required with "
                             "shared_memory_region",
                             label);
    if (v.kind != OI_JSON_PARAM_COUNT)
        return oi_status_new(OI_BAD_REQUEST, "%s: parameters.shared_memory_byte_size must be a non-negative integer",
                             label);
    p->byte_size = (uint64_t)v.count;
    oi_json_param(params, "shared_memory_offset", &v, none, sizeof(none));
    if (v.kind != OI_JSON_PARAM_ABSENT && v.kind != OI_JSON_PARAM_COUNT)
        return oi_status_new(OI_BAD_REQUEST, "%s: parameters.shared_memory_offset must be a non-negative integer",
                             label);
    p->offset = v.kind == OI_JSON_PARAM_COUNT ? (uint64_t)v.count : 0;
    return NULL;
}

void oi_shm_uses_release(oi_shm_uses_t *uses)
{
    for (uint32_t i = 0; i < uses->n; i++) {
        atomic_fetch_sub(&uses->regions[i]->users, 1);
        region_unref(uses->regions[i]);
    }
    free(uses->regions);
    *uses = (oi_shm_uses_t){0};
}

/* Looks the user's region up, counts the request among its users (in *uses), and checks the
 * window [offset, offset + byte_size) against it; *out gets a new reference. */
static oi_status_t *lookup(oi_shm_t *s, uid_t uid, const shm_params_t *p, const char *label, oi_shm_uses_t *uses,
                           oi_shm_region_t **out)
{
    *out = NULL;
    if (uses->n == uses->cap) {
        uint32_t cap = uses->cap ? uses->cap * 2 : 4;
        oi_shm_region_t **grown = realloc(uses->regions, cap * sizeof(*grown));
        if (grown == NULL)
            return oi_status_new(OI_INTERNAL, "out of memory");
        uses->regions = grown;
        uses->cap = cap;
    }
    oi_shm_region_t *gone = lock_swept(s);
    oi_shm_region_t *r = find_locked(s, uid, p->region);
    if (r != NULL) {
        region_ref(r);
        atomic_fetch_add(&r->users, 1);
        uses->regions[uses->n++] = region_ref(r);
    }
    unlock_swept(s, gone);
    /* tritonserver's words (its clients and tests match them), after the tensor's name. */
    if (r == NULL)
        return oi_status_new(OI_BAD_REQUEST, "%s: Unable to find shared memory region: '%s'", label, p->region);
    uint64_t end;
    oi_status_t *st = NULL;
    if (p->offset >= r->byte_size)
        st = oi_status_new(OI_BAD_REQUEST,
                           "%s: Invalid offset for shared memory region: '%s' (shared_memory_offset %" PRIu64
                           ", the region has %" PRIu64 " bytes)",
                           label, p->region, p->offset, r->byte_size);
    else if (__builtin_add_overflow(p->offset, p->byte_size, &end))
        st = oi_status_new(OI_BAD_REQUEST,
                           "%s: Integer overflow detected: byte_size (%" PRIu64 ") + offset (%" PRIu64
                           ") exceeds maximum value (%" PRIu64 ") for region '%s'",
                           label, p->byte_size, p->offset, UINT64_MAX, p->region);
    else if (end > r->byte_size)
        st = oi_status_new(OI_BAD_REQUEST,
                           "%s: Invalid offset + byte size for shared memory region: '%s' "
                           "(shared_memory_offset %" PRIu64 " + shared_memory_byte_size %" PRIu64
                           " exceeds its %" PRIu64 " bytes)",
                           label, p->region, p->offset, p->byte_size, r->byte_size);
    else if (r->obj != NULL) /* an object truncated after registration is refused up front */
        st = object_check(r->obj, r->offset + r->byte_size, label, r->key, p->region, "after registration");
    if (st != NULL) {
        region_unref(r);
        return st;
    }
    *out = r;
    return NULL;
}

/* Points an input into its region, or copies it out when it must not be read in place. */
static oi_status_t *resolve_input(oi_shm_t *s, uid_t uid, oi_tensor_t *t, oi_shm_uses_t *uses)
{
    char label[300];
    snprintf(label, sizeof(label), "input '%.200s'", t->name);
    shm_params_t p;
    int present;
    oi_shm_region_t *r;
    oi_status_t *st = read_params(t->parameters, label, &p, &present);
    if (st == NULL && !present)
        st = oi_status_new(OI_BAD_REQUEST, "%s: parameters.shared_memory_region is missing", label);
    if (st == NULL)
        st = lookup(s, uid, &p, label, uses, &r);
    if (st != NULL)
        return st;
    if (r->kind == OI_SHM_SYSTEM && t->dtype != OI_TYPE_BYTES) {
        t->data = r->buf.data + p.offset;
        t->byte_size = (size_t)p.byte_size;
        t->owner = &r->buf; /* the reference lookup took */
    } else {
        /* BYTES are walked by the size check and by backends: a private copy cannot change
         * under them. CUDA memory is copied to the host, where backends read inputs. */
        oi_buf_t *b = oi_buf_new((size_t)p.byte_size);
        if (b == NULL) {
            region_unref(r);
            return oi_status_new(OI_INTERNAL, "out of memory");
        }
        b->len = (size_t)p.byte_size;
        int rc = 0;
        if (r->kind == OI_SHM_SYSTEM) {
            memcpy(b->data, r->buf.data + p.offset, b->len);
            st = object_check(r->obj, r->offset + r->byte_size, label, r->key, p.region, "while it was read");
        } else if (b->len > 0) {
            rc = cuda.set_device((int)r->device_id);
            if (rc == 0)
                rc = cuda.memcpy_(b->data, (char *)r->dev_ptr + p.offset, b->len, CUDA_MEMCPY_D2H);
        }
        region_unref(r);
        if (rc != 0)
            st = oi_status_new(OI_INTERNAL, "%s: copying from CUDA shared memory failed: %s", label,
                               cuda.error_string(rc));
        if (st != NULL) {
            oi_buf_unref(b);
            return st;
        }
        t->data = b->data;
        t->byte_size = b->len;
        t->owner = b;
    }
    return oi_tensor_check_input(t, "input", t->name);
}

/* The caller's user, looked up on the first tensor that names a region. */
static oi_status_t *caller_uid(const oi_shm_t *s, const oi_shm_caller_t *caller, const oi_peer_t **peer, uid_t *uid)
{
    if (*peer == NULL)
        *peer = caller->peer(caller->arg);
    *uid = (*peer)->uid;
    return (*peer)->error != 0 ? check_peer(s, *peer) : NULL;
}

oi_status_t *oi_shm_resolve(oi_shm_t *s, const oi_shm_caller_t *caller, oi_request_t *req, oi_shm_target_t **targets,
                            oi_shm_uses_t *uses)
{
    *targets = NULL;
    const oi_peer_t *peer = NULL;
    uid_t uid = (uid_t)-1;
    for (uint32_t i = 0; i < req->n_inputs; i++) {
        if (!req->inputs[i].shm)
            continue;
        oi_status_t *st = caller_uid(s, caller, &peer, &uid);
        if (st == NULL)
            st = resolve_input(s, uid, &req->inputs[i], uses);
        if (st != NULL)
            return st;
    }
    oi_shm_target_t *tg = NULL;
    for (uint32_t i = 0; i < req->n_outputs; i++) {
        const oi_output_request_t *o = &req->outputs[i];
        if (o->parameters.ptr == NULL)
            continue;
        char label[300];
        snprintf(label, sizeof(label), "output '%.200s'", o->name);
        shm_params_t p;
        int present;
        oi_status_t *st = read_params(o->parameters, label, &p, &present);
        if (st == NULL && present && o->binary_data == 1)
            st = oi_status_new(OI_BAD_REQUEST,
                               "%s: parameters.shared_memory_region and binary_data true exclude "
                               "each other",
                               label);
        if (st == NULL && present && tg == NULL && (tg = calloc(req->n_outputs, sizeof(*tg))) == NULL)
            st = oi_status_new(OI_INTERNAL, "out of memory");
        oi_shm_region_t *r = NULL;
        if (st == NULL && present)
            st = caller_uid(s, caller, &peer, &uid);
        if (st == NULL && present)
            st = lookup(s, uid, &p, label, uses, &r);
        if (st != NULL) {
            oi_shm_targets_free(tg, req->n_outputs);
            return st;
        }
        if (present)
            tg[i] = (oi_shm_target_t){r, p.offset, p.byte_size};
    }
    *targets = tg;
    return NULL;
}

oi_status_t *oi_shm_place_output(oi_tensor_t *t, const oi_shm_target_t *target)
{
    oi_shm_region_t *r = target->region;
    if (t->byte_size > target->byte_size)
        return oi_status_new(OI_BAD_REQUEST,
                             "output '%s': %zu bytes do not fit shared_memory_byte_size %" PRIu64
                             " (shared-memory region '%s'); give at least %zu bytes",
                             t->name, t->byte_size, target->byte_size, r->name, t->byte_size);
    if (r->kind == OI_SHM_SYSTEM) {
        char *dst = r->buf.data + target->offset;
        if (t->byte_size > 0 && dst != t->data)
            memmove(dst, t->data, t->byte_size); /* the output may be a view of an input there */
        t->data = dst;
    } else if (t->byte_size > 0) {
        int rc = cuda.set_device((int)r->device_id);
        if (rc == 0)
            rc = cuda.memcpy_((char *)r->dev_ptr + target->offset, t->data, t->byte_size, CUDA_MEMCPY_H2D);
        if (rc != 0)
            return oi_status_new(OI_INTERNAL, "output '%s': copying into CUDA shared memory failed: %s", t->name,
                                 cuda.error_string(rc));
        t->data = NULL; /* device memory: nothing on the host to point at */
    }
    oi_buf_unref(t->owner);
    t->owner = &region_ref(r)->buf;
    t->shm = 1;
    t->shm_region = r->name;
    t->shm_offset = target->offset;
    return NULL;
}

/* Whether [a, a + an) and [b, b + bn) share a byte. */
static int overlaps(const char *a, size_t an, const char *b, size_t bn)
{
    return an > 0 && bn > 0 && a < b + bn && b < a + an;
}

/* Gives an output its own copy of its bytes, so that writing into a region cannot change it. */
static oi_status_t *make_private(oi_tensor_t *t)
{
    oi_buf_t *b = oi_buf_new(t->byte_size);
    if (b == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    memcpy(b->data, t->data, t->byte_size);
    b->len = t->byte_size;
    oi_buf_unref(t->owner);
    t->owner = b;
    t->data = b->data;
    return NULL;
}

oi_status_t *oi_shm_place_outputs(oi_response_t *resp, const oi_shm_target_t *targets, const char *const *names,
                                  uint32_t n_names)
{
    for (uint32_t i = 0; i < resp->n_outputs; i++) {
        oi_tensor_t *t = &resp->outputs[i];
        uint32_t at = oi_name_index(names, n_names, t->name);
        const oi_shm_target_t *tg = at < n_names ? &targets[at] : NULL;
        if (tg == NULL || tg->region == NULL)
            continue;
        if (tg->region->kind == OI_SHM_SYSTEM) {
            /* Another output that still reads from this window (a view of an input there,
             * say) is copied aside first: outputs may be written over inputs' windows, which
             * is what lets an output that is its input stay where it is. */
            const char *dst = tg->region->buf.data + tg->offset;
            size_t n = t->byte_size < tg->byte_size ? t->byte_size : (size_t)tg->byte_size;
            for (uint32_t j = 0; j < resp->n_outputs; j++) {
                oi_tensor_t *o = &resp->outputs[j];
                if (j == i || o->shm || !overlaps(dst, n, o->data, o->byte_size))
                    continue;
                oi_status_t *st = make_private(o);
                if (st != NULL)
                    return st;
            }
        }
        oi_status_t *st = oi_shm_place_output(t, tg);
        if (st != NULL)
            return st;
    }
    return NULL;
}

/* The check of oi_shm_check_request for one tensor, when its owner is a system region. */
static oi_status_t *check_tensor(const oi_tensor_t *t, const char *what)
{
    const oi_shm_region_t *r = region_owning(t->owner);
    if (r == NULL || r->obj == NULL)
        return NULL;
    char label[300];
    snprintf(label, sizeof(label), "%s '%.200s'", what, t->name);
    return object_check(r->obj, r->offset + r->byte_size, label, r->key, r->name, "during the request");
}

oi_status_t *oi_shm_check_request(const oi_request_t *req, const oi_response_t *resp)
{
    oi_status_t *st = NULL;
    for (uint32_t i = 0; st == NULL && i < req->n_inputs; i++)
        st = check_tensor(&req->inputs[i], "input");
    for (uint32_t i = 0; st == NULL && i < resp->n_outputs; i++)
        st = resp->outputs[i].shm ? check_tensor(&resp->outputs[i], "output") : NULL;
    return st;
}

void oi_shm_targets_free(oi_shm_target_t *targets, uint32_t n)
{
    if (targets == NULL)
        return;
    for (uint32_t i = 0; i < n; i++)
        region_unref(targets[i].region);
    free(targets);
}
