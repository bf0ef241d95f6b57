/* The legacy v1 gRPC service (nvidia.inferenceserver.GRPCService) beside V2's on the same
 * port. As 1.x did, every RPC ends with gRPC status OK and carries its outcome in the
 * response's RequestStatus. Inference goes through oi_infer_submit like V2's; the raw outputs
 * are sent from the model's memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api/legacy.h"
#include "transport/grpc.h"

#define LEGACY_SERVICE "/nvidia.inferenceserver.GRPCService/"
#define PB(x) Nvidia__Inferenceserver__##x

enum {
    RPC_STATUS = OI__LEGACY_RPC_BASE,
    RPC_HEALTH,
    RPC_INFER,
    RPC_STREAM_INFER,
    RPC_SHM_CONTROL,
    RPC_UNSUPPORTED, /* ModelControl, Repository */
};

static void put_varint(oi_sbuf_t *o, uint64_t v, int *rc)
{
    uint8_t b[10];
    size_t n = 0;
    do {
        b[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    *rc |= oi_sbuf_append(o, b, n);
}

/* Appends field `id` as a length-delimited value of `len` bytes (the bytes themselves only
 * when `data` is not NULL: the caller sends them from elsewhere). */
static void put_field(oi_sbuf_t *o, uint32_t id, const void *data, size_t len, int *rc)
{
    put_varint(o, (uint64_t)id << 3 | 2, rc);
    put_varint(o, len, rc);
    if (data != NULL)
        *rc |= oi_sbuf_append(o, data, len);
}

/* Appends field `id` holding message `m`. */
static void put_message(oi_sbuf_t *o, uint32_t id, const ProtobufCMessage *m, int *rc)
{
    oi_sbuf_t tmp = {0};
    *rc |= oi_legacy_write(&tmp, m, OI_LEGACY_BINARY, 0);
    put_field(o, id, tmp.data ? tmp.data : "", tmp.len, rc);
    oi_sbuf_free(&tmp);
}

/* Sends one response message built in `o` (taken) followed by `parts` (taken). */
static void send_message(oi_grpc_call_t *call, oi_sbuf_t *o, oi_iov_t *extra, size_t n_extra)
{
    size_t total = o->len;
    for (size_t i = 0; i < n_extra; i++)
        total += extra[i].len;
    oi_buf_t *b = oi_sbuf_detach(o);
    oi_iov_t small[8];
    oi_iov_t *parts = n_extra + 1 <= 8 ? small : malloc((n_extra + 1) * sizeof(*parts));
    if (b == NULL || parts == NULL) {
        oi_buf_unref(b);
        oi_sbuf_free(o);
        for (size_t i = 0; i < n_extra; i++)
            oi_buf_unref(extra[i].owner);
        if (parts != small)
            free(parts);
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
        return;
    }
    parts[0] = (oi_iov_t){b->data, b->len, b};
    if (n_extra > 0)
        memcpy(parts + 1, extra, n_extra * sizeof(*parts));
    oi_grpc_send(call, parts, n_extra + 1, total);
    if (parts != small)
        free(parts);
}

/* A response of only a RequestStatus (field 1) for `st` (taken; NULL: success), plus
 * `more` (already encoded fields after it, may be NULL). Ends a unary call with OK. */
static void reply_status(oi_server_t *s, oi_grpc_call_t *call, oi_status_t *st, uint64_t id, const oi_sbuf_t *more)
{
    oi_legacy_status_t rs;
    oi_legacy_status_fill(&rs, st, id ? id : oi_legacy_next_id(s));
    oi_sbuf_t o = {0};
    int rc = 0;
    put_message(&o, 1, &rs.base, &rc);
    if (more != NULL && more->len)
        rc |= oi_sbuf_append(&o, more->data, more->len);
    oi_status_free(st);
    if (rc != 0) {
        oi_sbuf_free(&o);
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
        return;
    }
    send_message(call, &o, NULL, 0);
    if (call->kind != RPC_STREAM_INFER)
        oi_grpc_finish(call, OI_GRPC_OK, NULL);
}

static void status_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
{
    PB(StatusRequest) *req =
        nvidia__inferenceserver__status_request__unpack(NULL, msg->len, (const uint8_t *)msg->data);
    if (req == NULL) {
        reply_status(s, call, oi_status_new(OI_BAD_REQUEST, "malformed StatusRequest"), 0, NULL);
        return;
    }
    oi_sbuf_t status = {0}, more = {0};
    oi_status_t *st = oi_legacy_server_status(s, req->model_name, OI_LEGACY_BINARY, &status);
    nvidia__inferenceserver__status_request__free_unpacked(req, NULL);
    int rc = 0;
    if (st == NULL)
        put_field(&more, 2, status.data ? status.data : "", status.len, &rc);
    if (rc != 0 && st == NULL)
        st = oi_status_new(OI_INTERNAL, "out of memory");
    reply_status(s, call, st, 0, &more);
    oi_sbuf_free(&status);
    oi_sbuf_free(&more);
}

static void health_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
{
    PB(HealthRequest) *req =
        nvidia__inferenceserver__health_request__unpack(NULL, msg->len, (const uint8_t *)msg->data);
    if (req == NULL) {
        reply_status(s, call, oi_status_new(OI_BAD_REQUEST, "malformed HealthRequest"), 0, NULL);
        return;
    }
    oi_status_t *st = NULL;
    int ready = strcmp(req->mode, "ready") == 0, health = 0;
    if (!ready && strcmp(req->mode, "live") != 0)
        st = oi_status_new(OI_BAD_REQUEST, "unknown health mode '%.64s'; expected live or ready", req->mode);
    else
        health = oi_legacy_health(s, ready);
    nvidia__inferenceserver__health_request__free_unpacked(req, NULL);
    oi_sbuf_t more = {0};
    if (health) /* field 2, bool true */
        (void)oi_sbuf_append(&more, "\x10\x01", 2);
    reply_status(s, call, st, 0, &more);
    oi_sbuf_free(&more);
}

static void shm_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
{
    PB(SharedMemoryControlRequest) *req =
        nvidia__inferenceserver__shared_memory_control_request__unpack(NULL, msg->len, (const uint8_t *)msg->data);
    if (req == NULL) {
        reply_status(s, call, oi_status_new(OI_BAD_REQUEST, "malformed SharedMemoryControlRequest"), 0, NULL);
        return;
    }
    const oi_peer_t *peer = oi_grpc_call_peer(call);
    oi_status_t *st = NULL;
    oi_sbuf_t more = {0}, status = {0};
    int rc = 0;
    switch (req->shared_memory_control_case) {
    case NVIDIA__INFERENCESERVER__SHARED_MEMORY_CONTROL_REQUEST__SHARED_MEMORY_CONTROL_REGISTER: {
        const PB(SharedMemoryControlRequest__Register) *reg = req->register_;
        if (reg->shared_memory_types_case ==
            NVIDIA__INFERENCESERVER__SHARED_MEMORY_CONTROL_REQUEST__REGISTER__SHARED_MEMORY_TYPES_SYSTEM_SHARED_MEMORY)
            st = oi_shm_register_system(&s->shm, peer, reg->name, reg->system_shared_memory->shared_memory_key,
                                        reg->system_shared_memory->offset, reg->byte_size);
        else if (
            reg->shared_memory_types_case ==
            NVIDIA__INFERENCESERVER__SHARED_MEMORY_CONTROL_REQUEST__REGISTER__SHARED_MEMORY_TYPES_CUDA_SHARED_MEMORY)
            st = oi_shm_register_cuda(&s->shm, peer, reg->name, reg->cuda_shared_memory->raw_handle.data,
                                      reg->cuda_shared_memory->raw_handle.len, reg->cuda_shared_memory->device_id,
                                      reg->byte_size);
        else
            st = oi_status_new(OI_BAD_REQUEST, "register: expected system_shared_memory or cuda_shared_memory");
        break;
    }
    case NVIDIA__INFERENCESERVER__SHARED_MEMORY_CONTROL_REQUEST__SHARED_MEMORY_CONTROL_UNREGISTER:
        st = oi_shm_unregister(&s->shm, peer, OI_SHM_SYSTEM, req->unregister->name);
        if (st == NULL)
            st = oi_shm_unregister(&s->shm, peer, OI_SHM_CUDA, req->unregister->name);
        break;
    case NVIDIA__INFERENCESERVER__SHARED_MEMORY_CONTROL_REQUEST__SHARED_MEMORY_CONTROL_UNREGISTER_ALL:
        st = oi_shm_unregister(&s->shm, peer, OI_SHM_SYSTEM, NULL);
        if (st == NULL)
            st = oi_shm_unregister(&s->shm, peer, OI_SHM_CUDA, NULL);
        break;
    case NVIDIA__INFERENCESERVER__SHARED_MEMORY_CONTROL_REQUEST__SHARED_MEMORY_CONTROL_STATUS:
        st = oi_legacy_shm_status(s, peer, OI_LEGACY_BINARY, &status, 1);
        if (st == NULL)
            put_field(&more, 2, status.data ? status.data : "", status.len, &rc);
        break;
    default: st = oi_status_new(OI_BAD_REQUEST, "expected register, unregister, unregister_all or status"); break;
    }
    nvidia__inferenceserver__shared_memory_control_request__free_unpacked(req, NULL);
    if (rc != 0 && st == NULL)
        st = oi_status_new(OI_INTERNAL, "out of memory");
    reply_status(s, call, st, 0, &more);
    oi_sbuf_free(&more);
    oi_sbuf_free(&status);
}

/* ---- inference ---------------------------------------------------------------------------- */

static void maybe_end_stream(oi_grpc_call_t *call)
{
    if (call->kind == RPC_STREAM_INFER && call->half_closed && call->pending == 0)
        oi_grpc_finish(call, OI_GRPC_OK, NULL);
}

/* An inference that failed: its RequestStatus and an InferResponseHeader with its id. */
static void infer_failed(oi_server_t *s, oi_grpc_call_t *call, const oi_legacy_infer_t *li, oi_status_t *st)
{
    PB(InferResponseHeader) rh = NVIDIA__INFERENCESERVER__INFER_RESPONSE_HEADER__INIT;
    rh.id = li != NULL ? li->hdr->id : 0;
    oi_sbuf_t more = {0};
    int rc = 0;
    put_message(&more, 2, &rh.base, &rc);
    reply_status(s, call, st, li != NULL ? li->request_id : 0, &more);
    oi_sbuf_free(&more);
}

static void release_request(oi_buf_t *b)
{
    protobuf_c_message_free_unpacked(b->ctx, NULL);
    free(b);
}

static void unlink_inf(oi_grpc_call_t *call, oi_infer_t *inf)
{
    if (inf->prev)
        inf->prev->next = inf->next;
    else
        call->work = inf->next;
    if (inf->next)
        inf->next->prev = inf->prev;
}

static void infer_done(oi_infer_t *inf)
{
    oi_legacy_infer_t *li = inf->ctx;
    oi_grpc_call_t *call = li->transport;
    oi_server_t *s = call->data;
    call->pending--;
    unlink_inf(call, inf);
    if (inf->cancelled)
        atomic_fetch_sub(&s->grpc_orphans, 1);
    if (oi_grpc_call_open(call)) {
        oi_status_t *st = inf->job.status;
        inf->job.status = NULL;
        const oi_response_t *resp = &inf->job.resp;
        oi_iov_t *parts = st == NULL ? calloc(resp->n_outputs + 1, sizeof(*parts)) : NULL;
        oi_sbuf_t o = {0}, head = {0};
        int rc = st == NULL && parts == NULL;
        if (st == NULL && !rc) {
            oi_legacy_status_t rs;
            oi_legacy_status_fill(&rs, NULL, li->request_id);
            put_message(&o, 1, &rs.base, &rc);
            rc |= oi_legacy_response_header(li, OI_LEGACY_BINARY, &head, NULL);
            put_field(&o, 2, head.data ? head.data : "", head.len, &rc);
        }
        if (st == NULL && rc)
            st = oi_status_new(OI_INTERNAL, "out of memory");
        if (st != NULL) {
            oi_sbuf_free(&o);
            infer_failed(s, call, li, st);
        } else {
            /* raw_output (3) for each raw output, its bytes sent from the model's memory: the
             * field's tag and length go into the message's head, which is then split. */
            size_t n = 0;
            oi_sbuf_t tags = {0};
            size_t offs[resp->n_outputs + 1];
            for (uint32_t i = 0; i < resp->n_outputs && i < li->hdr->n_output; i++) {
                const oi_tensor_t *t = &resp->outputs[i];
                if (li->cls[i] != 0 || t->shm) /* shared-memory outputs are in their region */
                    continue;
                put_field(&tags, 3, NULL, t->byte_size, &rc);
                offs[n] = tags.len;
                parts[n++] = (oi_iov_t){t->data, t->byte_size, t->owner ? oi_buf_ref(t->owner) : NULL};
            }
            oi_buf_t *tb = rc == 0 ? oi_sbuf_detach(&tags) : NULL;
            if (rc != 0 || (n > 0 && tb == NULL)) {
                for (size_t i = 0; i < n; i++)
                    oi_buf_unref(parts[i].owner);
                oi_sbuf_free(&tags);
                oi_buf_unref(tb);
                oi_sbuf_free(&o);
                infer_failed(s, call, li, oi_status_new(OI_INTERNAL, "out of memory"));
            } else {
                oi_iov_t *all = malloc((2 * n + 1) * sizeof(*all));
                if (all == NULL) {
                    for (size_t i = 0; i < n; i++)
                        oi_buf_unref(parts[i].owner);
                    oi_buf_unref(tb);
                    oi_sbuf_free(&o);
                    infer_failed(s, call, li, oi_status_new(OI_INTERNAL, "out of memory"));
                } else {
                    size_t k = 0, prev = 0;
                    for (size_t i = 0; i < n; i++) {
                        all[k++] = (oi_iov_t){tb->data + prev, offs[i] - prev, oi_buf_ref(tb)};
                        all[k++] = parts[i];
                        prev = offs[i];
                    }
                    oi_buf_unref(tb);
                    send_message(call, &o, all, k);
                    free(all);
                    if (call->kind == RPC_INFER)
                        oi_grpc_finish(call, OI_GRPC_OK, NULL);
                }
            }
        }
        oi_sbuf_free(&head);
        free(parts);
        maybe_end_stream(call);
    }
    oi_legacy_infer_free(li);
    oi_grpc_call_unref(call);
    atomic_fetch_sub(&s->grpc_inflight, 1);
}

static const oi_peer_t *call_peer(void *call)
{
    return oi_grpc_call_peer(call);
}

static void infer_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
{
    PB(InferRequest) *req = nvidia__inferenceserver__infer_request__unpack(NULL, msg->len, (const uint8_t *)msg->data);
    if (req == NULL) {
        infer_failed(s, call, NULL, oi_status_new(OI_BAD_REQUEST, "malformed InferRequest"));
        return;
    }
    if (req->meta_data == NULL) {
        nvidia__inferenceserver__infer_request__free_unpacked(req, NULL);
        infer_failed(s, call, NULL,
                     oi_status_new(OI_BAD_REQUEST, "InferRequest.meta_data: missing; expected an InferRequestHeader"));
        return;
    }
    oi_legacy_infer_t *li = oi_legacy_infer_new(req->meta_data, oi_legacy_next_id(s));
    req->meta_data = NULL; /* the inference holds it now */
    oi_buf_t *owner = li != NULL ? oi_buf_wrap(req, 0, release_request, req) : NULL;
    if (owner == NULL) {
        oi_legacy_infer_free(li);
        nvidia__inferenceserver__infer_request__free_unpacked(req, NULL);
        infer_failed(s, call, NULL, oi_status_new(OI_INTERNAL, "out of memory"));
        return;
    }
    li->transport = call;
    char version[24] = "";
    if (req->model_version >= 0)
        snprintf(version, sizeof(version), "%lld", (long long)req->model_version);
    oi_status_t *st = NULL;
    oi_model_t *m = oi_registry_find(&s->registry, req->model_name, version, &st);
    if (m != NULL)
        st = oi_model_check_ready(m);
    if (st == NULL)
        st = oi_legacy_decode(li, m, owner, NULL, 0, req->raw_input, req->n_raw_input);
    oi_buf_unref(owner); /* the tensors hold their own references */
    if (st == NULL) {
        oi_infer_t *inf = li->inf;
        inf->shm = &s->shm;
        inf->shm_caller = (oi_shm_caller_t){call_peer, call};
        inf->count_stats = s->cfg.statistics;
        oi_grpc_call_ref(call);
        call->pending++;
        atomic_fetch_add(&s->grpc_inflight, 1);
        st = oi_infer_submit(inf, m, call->loop, infer_done, li); /* takes m */
        m = NULL;
        if (st == NULL) {
            inf->next = call->work;
            if (inf->next)
                inf->next->prev = inf;
            call->work = inf;
            return;
        }
        call->pending--;
        atomic_fetch_sub(&s->grpc_inflight, 1);
        oi_grpc_call_unref(call);
    }
    oi_model_unref(m);
    infer_failed(s, call, li, st);
    oi_legacy_infer_free(li);
}

/* ---- the handler -------------------------------------------------------------------------- */

unsigned oi__legacy_grpc_groups(int kind)
{
    switch (kind) {
    case RPC_STATUS:
        return OI_API_BIT(OI_API_METADATA) | OI_API_BIT(OI_API_MODEL_CONFIG) | OI_API_BIT(OI_API_STATISTICS);
    case RPC_HEALTH: return OI_API_BIT(OI_API_HEALTH);
    case RPC_INFER:
    case RPC_STREAM_INFER: return OI_API_BIT(OI_API_INFERENCE);
    case RPC_SHM_CONTROL: return OI_API_BIT(OI_API_SHARED_MEMORY);
    case RPC_UNSUPPORTED: return OI_API_BIT(OI_API_MODEL_REPOSITORY);
    default: return 0;
    }
}

int oi__legacy_grpc_call(oi_server_t *s, oi_grpc_call_t *call)
{
    (void)s;
    if (strncmp(call->method, LEGACY_SERVICE, sizeof(LEGACY_SERVICE) - 1) != 0)
        return 0;
    const char *rpc = call->method + sizeof(LEGACY_SERVICE) - 1;
    static const struct {
        const char *name;
        int kind;
    } rpcs[] = {{"Status", RPC_STATUS},
                {"Health", RPC_HEALTH},
                {"Infer", RPC_INFER},
                {"StreamInfer", RPC_STREAM_INFER},
                {"ModelControl", RPC_UNSUPPORTED},
                {"SharedMemoryControl", RPC_SHM_CONTROL},
                {"Repository", RPC_UNSUPPORTED}};
    call->kind = 0;
    for (size_t i = 0; i < sizeof(rpcs) / sizeof(rpcs[0]); i++)
        if (strcmp(rpc, rpcs[i].name) == 0)
            call->kind = rpcs[i].kind;
    if (call->kind == 0) {
        char msg[300];
        snprintf(msg, sizeof(msg), "method %.200s is not part of nvidia.inferenceserver.GRPCService", rpc);
        oi_grpc_finish(call, OI_GRPC_UNIMPLEMENTED, msg);
        call->kind = OI__LEGACY_RPC_BASE; /* still routed here, finished */
    }
    return 1;
}

void oi__legacy_grpc_message(oi_server_t *s, oi_grpc_call_t *call, oi_buf_t *msg)
{
    if (call->kind != RPC_STREAM_INFER && call->received > 1) {
        oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, "a unary call carries one request message; got a second");
    } else if (atomic_load(&s->stopping)) {
        oi_grpc_finish(call, OI_GRPC_UNAVAILABLE, "the server is shutting down");
    } else {
        switch (call->kind) {
        case RPC_STATUS: status_rpc(s, call, msg); break;
        case RPC_HEALTH: health_rpc(s, call, msg); break;
        case RPC_INFER:
        case RPC_STREAM_INFER: infer_rpc(s, call, msg); break;
        case RPC_SHM_CONTROL: shm_rpc(s, call, msg); break;
        case RPC_UNSUPPORTED:
            reply_status(s, call,
                         oi_status_new(OI_UNIMPLEMENTED,
                                       "%s is not supported by this server's legacy API; use the V2 "
                                       "API's repository extension",
                                       call->method + sizeof(LEGACY_SERVICE) - 1),
                         0, NULL);
            break;
        default: break;
        }
    }
    oi_buf_unref(msg);
}

void oi__legacy_grpc_half_close(oi_server_t *s, oi_grpc_call_t *call)
{
    (void)s;
    if (call->kind == RPC_STREAM_INFER)
        maybe_end_stream(call);
    else if (call->received == 0 && oi_grpc_call_open(call))
        oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, "the call ended without a request message");
}

void oi__legacy_grpc_gone(oi_server_t *s, oi_grpc_call_t *call)
{
    for (oi_infer_t *inf = call->work; inf != NULL; inf = inf->next)
        if (!inf->cancelled) {
            atomic_fetch_add(&s->grpc_orphans, 1);
            oi_infer_cancel(inf);
        }
}
