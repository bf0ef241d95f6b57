/* The legacy TensorRT Inference Server 1.x API (package nvidia.inferenceserver), the parts
 * both transports share: request status, server status, and an inference's way from an
 * InferRequestHeader plus raw input bytes to an oi_request, and from the response to an
 * InferResponseHeader. The routes are legacy_http.c (/api/...) and legacy_grpc.c
 * (GRPCService); everything underneath (registry, scheduler, backends, statistics,
 * classification) is V2's. */
#ifndef OI_SERVER_API_LEGACY_H
#define OI_SERVER_API_LEGACY_H

#include "legacy/grpc_service.pb-c.h"
#include "server/classify.h"
#include "server/infer.h"
#include "server/server_impl.h"

/* TensorRT Inference Server's default --id, which its clients see in every RequestStatus. */
#define OI_LEGACY_SERVER_ID "inference:0"

typedef Nvidia__Inferenceserver__RequestStatus oi_legacy_status_t;
typedef Nvidia__Inferenceserver__InferRequestHeader oi_legacy_req_header_t;
typedef Nvidia__Inferenceserver__InferResponseHeader oi_legacy_resp_header_t;

/* A new id for a RequestStatus: unique per server, as 1.x numbered its requests. */
uint64_t oi_legacy_next_id(oi_server_t *s);

/* Fills a RequestStatus for `st` (NULL: SUCCESS); `st` is borrowed, and so is its message. */
void oi_legacy_status_fill(oi_legacy_status_t *rs, const oi_status_t *st, uint64_t request_id);

/* Server liveness or readiness (`ready`: every model's default version is ready, as V2's
 * ready), as GRPCService Health and /api/health answer it. */
int oi_legacy_health(oi_server_t *s, int ready);

typedef enum { OI_LEGACY_TEXT, OI_LEGACY_BINARY, OI_LEGACY_JSON } oi_legacy_format_t;

/* Appends a ServerStatus for every model (`model` NULL or "") or one model, in `fmt`: text
 * (DebugString's layout), binary (serialized), or JSON (protobuf's JSON mapping). Models by
 * name, versions by number; counters are V2's statistics. Returns NULL, or a status (404 for
 * an unknown model, 500 out of memory). */
oi_status_t *oi_legacy_server_status(oi_server_t *s, const char *model, oi_legacy_format_t fmt, oi_sbuf_t *out);

/* One legacy inference. Owns `hdr`; lives with its oi_infer_t (`inf->ctx` points here). */
typedef struct oi_legacy_infer_s {
    oi_infer_t *inf;             /* owned; freed by oi_legacy_infer_free */
    oi_legacy_req_header_t *hdr; /* owned; tensor and output names point into it */
    uint64_t request_id;         /* the RequestStatus id */
    uint32_t *cls;               /* per requested output: its class count, 0 for raw */
    oi_topk_t *topk;             /* per requested output: its classes, ranked on the executor */
    void *transport;             /* the HTTP request or gRPC call that waits for it */
} oi_legacy_infer_t;

/* Returns a new legacy inference holding `hdr` (taken, also on failure), or NULL. */
oi_legacy_infer_t *oi_legacy_infer_new(oi_legacy_req_header_t *hdr, uint64_t request_id);

/* Builds li->inf's request for model `m` from the header and the inputs' bytes: HTTP gives
 * them back to back in `data` (`len` bytes, every input's size deduced from the header and
 * the model, BYTES elements walked), gRPC one span per input in `raw` (n_raw). Tensors point
 * into the bytes, which `owner` keeps (a reference is taken per tensor). Returns NULL or a
 * 400 status naming the problem (batch_size, an input, a size, an output). */
oi_status_t *oi_legacy_decode(oi_legacy_infer_t *li, const oi_model_t *m, oi_buf_t *owner, const char *data, size_t len,
                              const ProtobufCBinaryData *raw, size_t n_raw);

/* After a successful inference: the InferResponseHeader of li's response appended to `out` in
 * `fmt`, and, when `line` is not NULL, to `line` as one text line too (the HTTP header). Raw
 * outputs' bytes are the response tensors', in requested order (those with li->cls[i] == 0).
 * 0 or -1 (out of memory). */
int oi_legacy_response_header(const oi_legacy_infer_t *li, oi_legacy_format_t fmt, oi_sbuf_t *out, oi_sbuf_t *line);

/* An InferResponseHeader holding only the request's id (what 1.x sends with an error), as
 * one text line. 0 or -1. */
int oi_legacy_error_header(const oi_legacy_infer_t *li, oi_sbuf_t *out);

/* The peer's registered system shared-memory regions as a SharedMemoryStatus in `fmt` (with
 * `wrap`, as SharedMemoryControlResponse.Status, the gRPC form). NULL or a status. */
oi_status_t *oi_legacy_shm_status(oi_server_t *s, const oi_peer_t *peer, oi_legacy_format_t fmt, oi_sbuf_t *out,
                                  int wrap);

/* Frees the inference, its header and rankings. */
void oi_legacy_infer_free(oi_legacy_infer_t *li);

/* Appends a message serialized (fmt binary) or as text. 0 or -1. */
int oi_legacy_write(oi_sbuf_t *out, const ProtobufCMessage *m, oi_legacy_format_t fmt, int one_line);

#endif
