/* ModelInfer and ModelStreamInfer, for grpc_api.c's dispatch: one request or a stream of them
 * through oi_infer_submit, answers encoded with the purpose-built wire codec (codec/pb_infer.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "grpc_service.pb-c.h"

#include "codec/pb_infer.h"
#include "server/infer.h"
#include "server/server_impl.h"
#include "server/api/grpc_api_impl.h"

/* ---- inference ---------------------------------------------------------------------------- */

/* A streamed request failed: one ModelStreamInferResponse with error_message, and the
 * stream goes on. */
static void stream_error(oi_grpc_call_t *call, const char *message, const oi_model_t *m, const oi_request_t *req)
{
    oi_sbuf_t out = {0};
    if (oi_pb_encode_stream_error(&out, message, m ? m->name : NULL, m ? m->version_str : NULL,
                                  req ? req->id : NULL, req ? req->id_len : 0) != 0) {
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
        return;
    }
    oi_buf_t *b = oi_sbuf_detach(&out);
    if (b == NULL) {
        oi_sbuf_free(&out);
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
        return;
    }
    oi_iov_t part = {b->data, b->len, b};
    oi_grpc_send(call, &part, 1, b->len);
}

/* Whether a stream's client asked for Triton's triton_grpc_error mode: an error ends the stream
 * with its status instead of travelling in it (infer_handler.h). */
static int errors_end_stream(const oi_grpc_call_t *call)
{
    size_t n = 0;
    const char *v = oi_grpc_call_header(call, OI_GRPC_ERROR_SLOT, &n);
    return v != NULL && n == 4 && strncasecmp(v, "true", 4) == 0;
}

/* A request failed: the status ends a unary call; a stream answers it and goes on (or, in
 * triton_grpc_error mode, ends with it). */
static void infer_failed(oi_grpc_call_t *call, oi_status_t *st, const oi_model_t *m, const oi_request_t *req)
{
    if (call->kind == RPC_MODEL_STREAM_INFER && !errors_end_stream(call)) {
        stream_error(call, st->message, m, req);
        oi_status_free(st);
    } else {
        oi__grpc_finish_status(call, st);
    }
}

/* A stream ends once the client has sent its last request and every answer is out. */
void oi__grpc_maybe_end_stream(oi_grpc_call_t *call)
{
    if (call->kind == RPC_MODEL_STREAM_INFER && call->half_closed && call->pending == 0)
        oi_grpc_finish(call, OI_GRPC_OK, NULL);
}

/* Encodes `resp` (one of `inf`'s responses) as `mode` asks (OI_PB_*) and queues it; with
 * `part`, the part's credit rides on the message's last slice. A failure to encode answers
 * the error instead. */
static void send_response(oi_grpc_call_t *call, oi_infer_t *inf, const oi_response_t *resp, int mode,
                          oi_infer_part_t *part)
{
    oi_pb_iov_t small[9];
    size_t cap = OI_PB_RESPONSE_PARTS(resp->n_outputs), n = 0, total = 0;
    oi_pb_iov_t *parts = cap <= 9 ? small : malloc(cap * sizeof(*parts));
    oi_status_t *st = parts == NULL ? oi_status_new(OI_INTERNAL, "out of memory") : NULL;
    if (st == NULL)
        st = oi_pb_encode_infer_response(inf->model->name, inf->model->version_str, &inf->req, resp, mode, parts, &n,
                                         &total);
    if (st != NULL) {
        infer_failed(call, st, inf->model, &inf->req);
    } else {
        /* oi_pb_iov_t and oi_iov_t have one layout; the copy keeps the codec free of the
         * transport's types. */
        oi_iov_t iov_small[9];
        oi_iov_t *iov = n <= 9 ? iov_small : malloc(n * sizeof(*iov));
        if (iov == NULL) {
            for (size_t i = 0; i < n; i++)
                oi_buf_unref(parts[i].owner);
            oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
        } else {
            for (size_t i = 0; i < n; i++)
                iov[i] = (oi_iov_t){parts[i].base, parts[i].len, parts[i].owner};
            size_t last = n;
            while (last > 0 && iov[last - 1].len == 0)
                last--;
            if (part != NULL && last > 0)
                oi_infer_part_hold(part, &iov[last - 1]);
            oi_grpc_send(call, iov, n, total);
            if (iov != iov_small)
                free(iov);
        }
    }
    if (parts != small)
        free(parts);
}

/* One response of a decoupled model, as it comes: more will follow, unless the model flagged
 * it final (then it carries triton_final_response true, as Triton sends it). */
static void stream_part(oi_infer_t *inf, oi_infer_part_t *part)
{
    oi_grpc_call_t *call = inf->ctx;
    inf->final_sent |= part->resp.final;
    if (oi_grpc_call_open(call))
        send_response(call, inf, &part->resp, part->resp.final ? OI_PB_STREAM_FINAL : OI_PB_STREAM_MORE, part);
}

/* On the call's loop thread once the backend has run: encode and send. */
static void finish_infer(oi_infer_t *inf)
{
    oi_grpc_call_t *call = inf->ctx;
    oi_server_t *s = call->data;
    call->pending--;
    if (inf->prev)
        inf->prev->next = inf->next;
    else
        call->work = inf->next;
    if (inf->next)
        inf->next->prev = inf->prev;
    if (inf->cancelled)
        atomic_fetch_sub(&s->grpc_orphans, 1);
    uint64_t send_start = inf->trace != NULL ? oi_now_ns() : 0;
    if (oi_grpc_call_open(call)) {
        oi_status_t *st = inf->job.status;
        inf->job.status = NULL;
        if (st != NULL) {
            infer_failed(call, st, inf->model, &inf->req);
        } else if (inf->ds == NULL || (inf->req.empty_final && !inf->final_sent)) {
            /* A decoupled model's responses went as they came: its end is an empty response
             * flagged final, only when the client asked for one and the final flag did not
             * come with the last response (as Triton). */
            int mode = call->kind == RPC_MODEL_INFER ? OI_PB_UNARY : OI_PB_STREAM_FINAL;
            send_response(call, inf, &inf->job.resp, mode, NULL);
            if (call->kind == RPC_MODEL_INFER && oi_grpc_call_open(call))
                oi_grpc_finish(call, OI_GRPC_OK, NULL);
        }
        oi__grpc_maybe_end_stream(call);
        oi_infer_trace_end(inf, send_start);
    }
    oi_infer_free(inf);
    oi_grpc_call_unref(call);
    atomic_fetch_sub(&s->grpc_inflight, 1);
}

static const oi_peer_t *call_peer(void *call) { return oi_grpc_call_peer(call); }

void oi__grpc_handle_infer(oi_server_t *s, oi_grpc_call_t *call, oi_buf_t *msg)
{
    uint64_t read_end = s->tracer != NULL ? oi_now_ns() : 0;
    oi_infer_t *inf = oi_infer_new();
    if (inf == NULL) {
        oi_buf_unref(msg);
        infer_failed(call, oi_status_new(OI_INTERNAL, "out of memory"), NULL, NULL);
        return;
    }
    oi_slice_t name, version;
    oi_status_t *st = oi_pb_decode_infer_request(msg, &inf->req, &name, &version);
    if (st != NULL) {
        /* The request is cleared; a stream's answer still names it by its id. */
        oi_request_t id_only = {0};
        oi_slice_t id;
        if (oi_pb_peek_request_id(msg->data, msg->len, &id) == 0) {
            id_only.id = id.ptr;
            id_only.id_len = id.len;
        }
        infer_failed(call, st, NULL, &id_only);
        oi_buf_unref(msg);
        oi_infer_free(inf);
        return;
    }
    oi_buf_unref(msg); /* the request holds its own reference */
    oi__grpc_note_model(s, call, name.ptr, version.ptr);
    st = oi_infer_forward_headers(&inf->req, call->forwarded.data, call->forwarded.len);
    oi_model_t *m = st == NULL ? oi_registry_find(&s->registry, name.ptr, version.ptr, &st) : NULL;
    if (st == NULL && m->decoupled && call->kind == RPC_MODEL_INFER) /* Triton's status and words */
        st = oi_status_new(OI_UNIMPLEMENTED, "ModelInfer RPC doesn't support models with decoupled transaction policy");
    if (st != NULL) {
        infer_failed(call, st, NULL, &inf->req);
        oi_model_unref(m);
        oi_infer_free(inf);
        return;
    }
    if (m->decoupled)
        inf->part = stream_part;
    /* A stream's sequences are its own until another call sends their next request: they are
     * released when it is cancelled (on_gone). */
    if (call->kind == RPC_MODEL_STREAM_INFER && m->seq != NULL) {
        if (call->session == 0)
            call->session = atomic_fetch_add(&s->grpc_sessions, 1) + 1;
        inf->req.seq.session = call->session;
    }
    oi_grpc_call_ref(call);
    call->pending++;
    atomic_fetch_add(&s->grpc_inflight, 1);
    inf->shm = &s->shm;
    inf->shm_caller = (oi_shm_caller_t){call_peer, call};
    inf->count_stats = s->cfg.statistics;
    /* A stream's message was read when it came (the call began long before); out of memory,
     * the request goes untraced. */
    uint64_t read_start = call->kind == RPC_MODEL_INFER ? call->start_ns : read_end;
    if (s->tracer != NULL)
        (void)oi_infer_trace_begin(inf, s->tracer, m, 1, read_start, read_end);
    st = oi_infer_submit(inf, m, call->loop, finish_infer, call); /* takes the model reference */
    if (st != NULL) {
        call->pending--;
        atomic_fetch_sub(&s->grpc_inflight, 1);
        infer_failed(call, st, m, &inf->req);
        oi_infer_free(inf);
        oi_grpc_call_unref(call);
        return;
    }
    inf->next = call->work; /* for on_gone */
    if (inf->next)
        inf->next->prev = inf;
    call->work = inf;
}
