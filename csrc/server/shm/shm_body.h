/* The JSON body of an HTTP shared-memory register request, decoded (Triton's
 * {"key", "offset", "byte_size"} for system memory, {"raw_handle": {"b64"}, "device_id",
 * "byte_size"} for CUDA). A pure function over the body: no I/O, no registry, so that it is
 * fuzzed on its own (tests/fuzz/fuzz_shm_register.c). */
#ifndef OI_SERVER_SHM_SHM_BODY_H
#define OI_SERVER_SHM_SHM_BODY_H

#include "server/shm/shm.h"

typedef struct oi_shm_register_body_s {
    uint64_t byte_size;
    /* System memory. */
    uint64_t offset;               /* 0 when absent */
    char key[2 * OI_SHM_MAX_NAME]; /* NUL-terminated; room to say why a long key is wrong */
    /* CUDA. */
    uint64_t device_id;
    unsigned char handle[OI_CUDA_IPC_HANDLE_BYTES + 3]; /* base64-decoded raw_handle */
    size_t handle_len;
} oi_shm_register_body_t;

/* Decodes `body` (NULL ptr: no body) of a register request for a region of `kind` into *out.
 * Returns NULL, or a 400 status naming the member that is missing or malformed and what it
 * must be. The key and the handle are checked further by oi_shm_register_system / _cuda. */
oi_status_t *oi_shm_decode_register(oi_slice_t body, oi_shm_kind_t kind, oi_shm_register_body_t *out);

#endif
