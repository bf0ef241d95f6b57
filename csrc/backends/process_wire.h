/* The wire between the server and the worker processes that run a Python model's instances
 * (process_backend.c on the server's side, python/worker.c in the worker). Both ends are one
 * build on one machine, so structs travel as they are in memory.
 *
 * Tensor bytes never cross the socket. Each worker has two memfds the server made:
 * - the job area (server writes, worker reads): a header holding the cancel flag, then the
 *   job's descriptor and the bytes of inputs that are not already in shared memory; the
 *   server grows it (ftruncate) between jobs. Large inputs stay where the transport received
 *   them (a memfd-backed body, core/buf.h), whose memfds come with the JOB message;
 * - the result ring (worker writes, server reads): blocks of outputs that the worker carves
 *   out and the server frees, by flag, once the response holding them is sent. A result that
 *   does not fit the ring travels in a memfd of its own, passed with SCM_RIGHTS.
 * Messages on the SOCK_SEQPACKET socketpair only say "this job", "these outputs", "done".
 *
 * During a job the worker may also make BLS calls (process_bls.h): several at once, each named
 * by an id the worker chose, which every message about that call carries in `block`. The
 * worker reads its socket on one thread of its own (python/worker_mux.c), which hands each
 * message to whoever waits for it: the job loop, a decoupled response's sender, a BLS call. */
#ifndef OI_BACKENDS_PROCESS_WIRE_H
#define OI_BACKENDS_PROCESS_WIRE_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/tensor.h"

/* The job area's header: the descriptor starts after it. */
typedef struct oi_pw_shared_s {
    atomic_uint cancelled; /* set by the server when every client of the job has gone */
    uint32_t index;        /* which of its model's workers this is (0..n-1; a replacement keeps it) */
    uint32_t pad[14];
} oi_pw_shared_t;

#define OI_PW_DESC_OFFSET ((uint64_t)sizeof(oi_pw_shared_t))
#define OI_PW_ALIGN 64

/* The fds a worker finds open, and the largest message either side sends. */
enum { OI_PW_FD_SOCKET = 3, OI_PW_FD_JOBS = 4, OI_PW_FD_RESULTS = 5 };
#define OI_PW_MAX_MESSAGE 8192
#define OI_PW_MAX_FDS 16 /* memfds one message carries (a JOB's inputs; more are copied) */
/* BLS calls one worker may have in flight at once; the server refuses more (BLS_END 503), so a
 * model cannot hold unbounded server memory through its worker. */
#define OI_PW_MAX_BLS_CALLS 64

enum {
    /* server -> worker */
    OI_PW_JOB = 1, /* oi_pw_job_t */
    OI_PW_ACK,     /* a decoupled response was sent: go on */
    OI_PW_STOP,    /* a decoupled response could not be sent (client gone): stop */
    OI_PW_BLS_PART, /* one response of BLS call `block`: oi_pw_reply_t and a memfd laid out as
                     * process_bls.h says */
    OI_PW_BLS_END,  /* BLS call `block` ended: oi_pw_reply_t with code 0 (done) or the error's
                     * status, and its message */
    /* worker -> server: oi_pw_reply_t */
    OI_PW_READY = 16, /* the model is imported; the text says nothing */
    OI_PW_RESULT,     /* a unary job's outputs */
    OI_PW_PARTIAL,    /* one response of a decoupled job; the server answers ACK or STOP */
    OI_PW_DONE,       /* a decoupled job ended without error */
    OI_PW_ERROR,      /* the job (or the import) failed: code and text */
    OI_PW_FAIL_ONE,   /* before a RESULT: request `block` of the batch failed alone, code and text */
    OI_PW_BLS,        /* during a job: BLS call `block` of the model, in the memfd sent with it
                       * (process_bls.h); the server answers BLS_PART..., BLS_END for that id */
    OI_PW_PARAMS_ONE, /* before a RESULT: the next piece of request `block`'s own response
                       * parameters (JSON text), in as many messages as it takes */
    OI_PW_ABSENT_ONE, /* before a RESULT: request `block`'s response lacks output `code` */
    OI_PW_BLS_CANCEL, /* the model no longer waits for BLS call `block`: the server cancels it (its
                       * BLS_END still comes) */
};

#define OI_PW_JOB_DECOUPLED 1u

typedef struct oi_pw_job_s {
    uint32_t type;
    uint32_t flags;    /* OI_PW_JOB_* */
    uint64_t area_len; /* the job area's size now: the worker maps again when it grew */
} oi_pw_job_t;

/* At OI_PW_DESC_OFFSET of the job area: this, then n_inputs oi_pw_tensor_t (each followed by
 * its NUL-terminated name, padded to 8), then n_outputs names (u32 length, the bytes, NUL,
 * padded to 8), then params_len bytes of the request's parameters (JSON) padded to 8, then the
 * request's id and, for a dynamic batch, n_batch int64 row counts, n_batch ids and n_batch
 * requests' parameters. Each id or parameters is a u32 (0: none, else its length + 1), the
 * bytes, NUL, padded to 8. */
typedef struct oi_pw_request_s {
    uint32_t n_inputs;
    uint32_t n_outputs;
    uint32_t has_params;
    uint32_t params_len;
    uint32_t n_batch;
    uint32_t pad;
} oi_pw_request_t;

#define OI_PW_ABSENT (-1)

/* One tensor: where its bytes are (offset from the start of the area or block holding it). */
typedef struct oi_pw_tensor_s {
    uint32_t dtype; /* oi_dtype_t */
    int32_t ndim;      /* OI_PW_ABSENT: an output the model left out (oi_tensor_t.absent) */
    uint32_t name_len; /* inputs: the name's length; outputs: 0 (the server knows the names) */
    uint32_t area;     /* inputs: 0 the job area, k > 0 the k-th memfd of the JOB message */
    int64_t shape[OI_MAX_DIMS];
    uint64_t offset;
    uint64_t byte_size;
} oi_pw_tensor_t;

/* A block of the result ring: this header, n oi_pw_tensor_t, then their bytes, then the
 * response's parameters (JSON text) when it has any. */
typedef struct oi_pw_block_s {
    atomic_uint state; /* OI_PW_BLOCK_* */
    uint32_t n_outputs;
    uint64_t size;          /* of the whole block, header included; a multiple of OI_PW_ALIGN */
    uint64_t params_offset; /* from the block's start */
    uint64_t params_len;    /* 0: none */
    uint32_t final;         /* oi_response_t.final */
    uint32_t pad;
} oi_pw_block_t;

enum { OI_PW_BLOCK_LIVE = 1, OI_PW_BLOCK_FREE = 2 };

#define OI_PW_IN_MEMFD 1u /* the block is at offset 0 of the memfd sent with the message */

typedef struct oi_pw_reply_s {
    uint32_t type;
    uint32_t flags; /* OI_PW_IN_MEMFD */
    uint32_t code;  /* OI_PW_ERROR: the status code; the message text follows the struct */
    uint32_t pad;
    uint64_t block; /* RESULT, PARTIAL: the block's offset in the ring (0 with OI_PW_IN_MEMFD);
                     * *_ONE: the request of the batch; BLS*: the call's id */
} oi_pw_reply_t;

/* The descriptors that travel with one message (SCM_RIGHTS). */
typedef struct oi_pw_fds_s {
    int fd[OI_PW_MAX_FDS];
    uint32_t n;
} oi_pw_fds_t;

/* Sends one message of `len` bytes with `fds` (NULL: none); 0, or -1 with errno. */
int oi_pw_send(int sock, const void *msg, size_t len, const oi_pw_fds_t *fds);

/* Receives one message into buf and the descriptors that came with it, at most `max` (the
 * rest are closed; the caller owns those kept). Its length, 0 when the peer has gone, or -1. */
ssize_t oi_pw_recv(int sock, void *buf, size_t cap, oi_pw_fds_t *fds, uint32_t max);

/* Closes the descriptors kept by oi_pw_recv. */
void oi_pw_close_fds(oi_pw_fds_t *fds);

/* Rounds up to the wire's alignment. */
static inline uint64_t oi_pw_align(uint64_t n) { return (n + OI_PW_ALIGN - 1) & ~(uint64_t)(OI_PW_ALIGN - 1); }

#endif
