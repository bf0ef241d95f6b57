/* What grpc_api.c (the RPC table, dispatch, health and metadata), grpc_infer.c (ModelInfer,
 * ModelStreamInfer) and grpc_control.c (the extensions) share; nothing outside server/api
 * includes this. */
#ifndef OI_SERVER_API_GRPC_API_IMPL_H
#define OI_SERVER_API_GRPC_API_IMPL_H

#include <protobuf-c/protobuf-c.h>

#include "server/server_impl.h"
#include "transport/grpc.h"

/* oi_grpc_call_t.kind of the V2 service's RPCs. */
enum {
    RPC_UNKNOWN = 0,
    RPC_SERVER_LIVE,
    RPC_SERVER_READY,
    RPC_MODEL_READY,
    RPC_SERVER_METADATA,
    RPC_MODEL_METADATA,
    RPC_MODEL_CONFIG,
    RPC_MODEL_INFER,
    RPC_MODEL_STREAM_INFER,
    RPC_SYS_SHM_STATUS,
    RPC_SYS_SHM_REGISTER,
    RPC_SYS_SHM_UNREGISTER,
    RPC_CUDA_SHM_STATUS,
    RPC_CUDA_SHM_REGISTER,
    RPC_CUDA_SHM_UNREGISTER,
    RPC_REPO_INDEX,
    RPC_REPO_LOAD,
    RPC_REPO_UNLOAD,
    RPC_HEALTH_CHECK,
    RPC_HEALTH_WATCH,
    RPC_MODEL_STATISTICS,
    RPC_LOG_SETTINGS,
    RPC_TRACE_SETTING,
};

/* grpc_api.c: the access log's model, and the two ways a call is answered. */
void oi__grpc_note_model(const oi_server_t *s, oi_grpc_call_t *call, const char *name, const char *version);
void oi__grpc_finish_status(oi_grpc_call_t *call, oi_status_t *st);
void oi__grpc_reply(oi_grpc_call_t *call, const ProtobufCMessage *msg);

/* grpc_infer.c: `msg` is taken. */
void oi__grpc_handle_infer(oi_server_t *s, oi_grpc_call_t *call, oi_buf_t *msg);
void oi__grpc_maybe_end_stream(oi_grpc_call_t *call);

/* grpc_control.c */
void oi__grpc_shm_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg);
void oi__grpc_model_statistics(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg);
void oi__grpc_repo_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg);
/* ModelReady of a version that answers its own readiness (oi_model_t.ready_probe), or
 * ServerReady or a health Check or Watch (`m` NULL) when oi__server_ready_asks, asked on a control thread and answered
 * from there. -1 when it could not be asked (the caller answers). */
int oi__grpc_probe_ready(oi_server_t *s, oi_grpc_call_t *call, const oi_model_t *m);
/* grpc_health.c: a health Check or Watch answered with the models' readiness (`ready`), on
 * the call's loop thread. */
void oi__health_answer(oi_server_t *s, oi_grpc_call_t *call, int ready);
void oi__grpc_log_settings_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg);
void oi__grpc_trace_setting_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg);

#endif
