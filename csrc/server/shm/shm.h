/* The shared-memory extensions (Triton's system and CUDA shared memory): a registry of named
 * regions that clients create and register, and the resolution of inference inputs and
 * outputs that name them in their parameters.
 *
 * The server acts with the requesting client's rights, never its own (it often runs as root
 * beside other users): a system region is registered only when the client's user could open
 * the object for reading and writing, and region names are scoped per user — a client sees,
 * uses and unregisters only regions its own user registered. Clients whose user the server
 * cannot tell (a peer on another host) get 403. A client that shrinks an object under a
 * request fails that request (see shm_guard.h), never the server.
 *
 * A region is reference-counted through the oi_buf_t it embeds: the registry holds one
 * reference while the region is registered, and every tensor that points into it holds one
 * (as its owner). As in tritonserver, unregistering a region that requests use only marks it:
 * it stays registered (listed, usable, its name taken) until the last of them ends, and is
 * dropped from the registry at the next access after that; the last reference unmaps it. */
#ifndef OI_SERVER_SHM_SHM_H
#define OI_SERVER_SHM_SHM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/status.h"
#include "core/tensor.h"
#include "transport/peer.h"

/* Bytes of a cudaIpcMemHandle_t. */
#define OI_CUDA_IPC_HANDLE_BYTES 64

/* Longest region name and key accepted (NAME_MAX of a POSIX shm name). */
#define OI_SHM_MAX_NAME 255

typedef enum { OI_SHM_SYSTEM = 0, OI_SHM_CUDA = 1 } oi_shm_kind_t;

typedef struct oi_shm_region_s oi_shm_region_t;
typedef struct oi_shm_object_s oi_shm_object_t; /* an open shm object and its mapping (shm.c) */

/* One registered region. Immutable once registered, so readable without the lock. */
struct oi_shm_region_s {
    oi_buf_t buf;          /* the reference count; data/len: the region's host bytes (system only) */
    oi_shm_region_t *next; /* the registry's list, under its lock */
    oi_shm_kind_t kind;
    uid_t owner; /* the user that registered it: its names are that user's alone */
    char *name;
    char *key;       /* system: the POSIX shm name, exactly as registered */
    uint64_t offset; /* system: where the region starts in the shm object */
    uint64_t byte_size;
    int64_t device_id;    /* CUDA */
    oi_shm_object_t *obj; /* system: one reference; regions on one object share it */
    void *dev_ptr;        /* CUDA: the device pointer cudaIpcOpenMemHandle gave */
    int unregistering;    /* under the registry's lock: unregistered while requests used it */
    atomic_int users;     /* requests that named it and are not done (see oi_shm_uses_t) */
};

/* The regions one request named, each counted in its `users` until the request is done: the
 * in-flight requests tritonserver waits for before a region is unregistered. (Mappings live
 * by reference count, which arrays a model keeps may hold longer.) */
typedef struct oi_shm_uses_s {
    oi_shm_region_t **regions; /* one reference each */
    uint32_t n, cap;
} oi_shm_uses_t;

/* Ends the request's use of its regions (once; later calls do nothing). */
void oi_shm_uses_release(oi_shm_uses_t *uses);

/* The most regions registered at once, and by one user (so one user cannot lock others out).
 * Open objects (one descriptor each, shared by the regions on one object) are bounded too, by
 * the descriptors RLIMIT_NOFILE leaves after a reserve for connections. */
#define OI_SHM_MAX_REGIONS 4096
#define OI_SHM_MAX_REGIONS_PER_USER 1024

/* Who asks, for requests: the client's credentials, looked up only when a request names
 * shared memory (most never do). */
typedef struct oi_shm_caller_s {
    const oi_peer_t *(*peer)(void *arg);
    void *arg;
} oi_shm_caller_t;

typedef struct oi_shm_s {
    pthread_mutex_t mu;
    oi_shm_region_t *head;
    int count;
    int allowed; /* registration is open; otherwise every register call is refused */
} oi_shm_t;

/* Initializes an empty registry; `allowed` says whether clients may register regions. */
void oi_shm_init(oi_shm_t *s, int allowed);

/* Unregisters every region (each is unmapped once no request uses it) and frees the lock. */
void oi_shm_destroy(oi_shm_t *s);

/* Registers, for `peer`, `byte_size` bytes at `offset` of the POSIX shm object `key`, which
 * is opened read-write exactly as given. The key must be a shm name ("/name" or "name": no
 * other '/', no "..", at most OI_SHM_MAX_NAME bytes), the peer's user must be allowed to read
 * and write the object (its mode bits against the peer's uid and groups), and offset +
 * byte_size must lie within the object's size. Returns NULL, or a status: 400 for a bad name,
 * key, size or offset, a key of only slashes or with tritonserver's reserved prefix, or a key
 * that cannot be opened or mapped (with the system's reason), 501 when registration is not
 * allowed (tritonserver's words), 403 when the peer is unknown or its user may not use the
 * object, 409 (tritonserver's ALREADY_EXISTS, "already in manager") when `name` is taken by
 * that user (by a system or a CUDA region: they share one namespace), 429 when the region or
 * object limits are reached. */
oi_status_t *oi_shm_register_system(oi_shm_t *s, const oi_peer_t *peer, const char *name, const char *key,
                                    uint64_t offset, uint64_t byte_size);

/* Registers `byte_size` bytes of device memory that another process exported with
 * cudaIpcGetMemHandle (`handle`, OI_CUDA_IPC_HANDLE_BYTES bytes) on device `device_id`. The
 * CUDA runtime is loaded on first use with dlopen; without it, or without a GPU, the answer is
 * a 400 status saying so. Other failures as for oi_shm_register_system. */
oi_status_t *oi_shm_register_cuda(oi_shm_t *s, const oi_peer_t *peer, const char *name, const void *handle,
                                  size_t handle_len, int64_t device_id, uint64_t byte_size);

/* Unregisters the peer's region `name` of that kind, or every region of that kind the peer's
 * user registered when `name` is NULL or empty. A region that requests use stays registered
 * until they finish (see above). Unknown names are no error (Triton answers OK too). Returns
 * NULL, or 501 when registration is not allowed, 403 when the peer is unknown. */
oi_status_t *oi_shm_unregister(oi_shm_t *s, const oi_peer_t *peer, oi_shm_kind_t kind, const char *name);

/* A snapshot of the peer's regions of one kind (only `name` when not NULL or empty): *out
 * gets a new array of new references (release with oi_shm_release_all). Returns NULL, or 403
 * when the peer is unknown, 404 when `name` is given and not registered as that kind, 500
 * when out of memory. */
oi_status_t *oi_shm_list(oi_shm_t *s, const oi_peer_t *peer, oi_shm_kind_t kind, const char *name,
                         oi_shm_region_t ***out, size_t *n);

/* Drops the references of a snapshot and frees its array. */
void oi_shm_release_all(oi_shm_region_t **regions, size_t n);

/* Where a requested output goes: a region reference and the window in it. */
typedef struct oi_shm_target_s {
    oi_shm_region_t *region; /* one reference; NULL: the output travels in the response */
    uint64_t offset;
    uint64_t byte_size;
} oi_shm_target_t;

/* Resolves the request's shared-memory tensors among the caller's regions. Inputs with `shm`
 * point into their regions (owner: a region reference) after their parameters, region bounds
 * and sizes are checked;
 * BYTES inputs and inputs in CUDA memory are copied into a private buffer first, because a
 * client could change a region's bytes after the server checked the element lengths. Requested
 * outputs with a "shared_memory_region" get a target in *targets, a new array of
 * req->n_outputs entries (NULL when none asks for shared memory; release with
 * oi_shm_targets_free). Every region named is added to *uses (also on failure), which the
 * caller releases when the request is done. Returns NULL, or a 400 status naming the tensor and the parameter. */
oi_status_t *oi_shm_resolve(oi_shm_t *s, const oi_shm_caller_t *caller, oi_request_t *req, oi_shm_target_t **targets,
                            oi_shm_uses_t *uses);

/* After the model ran and outputs were placed: a 400 status when an object behind one of the
 * request's in-place inputs or placed outputs shrank meanwhile (what was read or written
 * there is lost), else NULL. */
oi_status_t *oi_shm_check_request(const oi_request_t *req, const oi_response_t *resp);

/* Writes a produced output into its target and turns it into a shared-memory output (see
 * oi_tensor_t.shm): its own owner is released and it then references the region. Returns
 * NULL, or 400 when the output is larger than the target's byte size, 500 when a CUDA copy
 * fails. */
oi_status_t *oi_shm_place_output(oi_tensor_t *t, const oi_shm_target_t *target);

/* Places every output that has a target (targets[i] for the output named names[i], the
 * n_names outputs asked, which a checked response holds in that order). A target window
 * may overlap the memory other outputs still read from (a client may reuse its inputs'
 * windows for outputs, since inputs are dead once the model has run): such outputs are copied
 * aside first, so each output arrives intact. An output already where its target is (a model
 * returning its input, asked back in place) is not copied. Returns NULL or the first error. */
oi_status_t *oi_shm_place_outputs(oi_response_t *resp, const oi_shm_target_t *targets, const char *const *names,
                                  uint32_t n_names);

/* Drops the targets' region references and frees the array; NULL is ignored. */
void oi_shm_targets_free(oi_shm_target_t *targets, uint32_t n);

/* Whether the CUDA runtime can be loaded and sees a GPU: 1 or 0 (loads it on first call). */
int oi_shm_cuda_available(void);

#endif
