/* Model repository control, Triton's model_repository extension: index, load and unload, as
 * the transports decode them. What a load or an unload does belongs to the application (the
 * handler given to oi_server_set_repository); this module runs each call on a control thread
 * of its own, since loading a model can take seconds and a loop thread never waits, and brings
 * the outcome back to the loop thread that asked. */
#ifndef OI_SERVER_MODELS_REPOSITORY_H
#define OI_SERVER_MODELS_REPOSITORY_H

#include <stddef.h>
#include <stdint.h>

#include "codec/compress.h"
#include "core/buf.h"
#include "core/status.h"
#include "transport/loop.h"

/* LOGGING reads or changes the log settings (the logging extension), TRACE the trace settings
 * (the trace extension; `model` names the model, NULL: the global ones), READY asks a model
 * that answers its own readiness (oi_model_t.ready_probe) whether version `version` of `model`
 * is ready (`model` NULL: whether every such loaded version is, for the server's readiness): not repository operations, but they too belong to the application and run its
 * handler (which may take seconds), so they ride here. */
typedef enum { OI_REPO_INDEX, OI_REPO_LOAD, OI_REPO_UNLOAD, OI_REPO_LOGGING, OI_REPO_TRACE, OI_REPO_READY } oi_repo_op_t;

typedef enum {
    OI_REPO_PARAM_BOOL,
    OI_REPO_PARAM_INT,
    OI_REPO_PARAM_STRING,
    OI_REPO_PARAM_BYTES,
    OI_REPO_PARAM_LIST, /* strings, each NUL-terminated, back to back in data (len: all bytes) */
} oi_repo_param_kind_t;

/* One request parameter of a gRPC load or unload (ModelRepositoryParameter). */
typedef struct oi_repo_param_s {
    char *name;                /* owned */
    oi_repo_param_kind_t kind; /* which value the client set */
    int64_t number;            /* BOOL (0/1) and INT */
    char *data;                /* STRING (NUL-terminated) and BYTES; owned */
    size_t len;
} oi_repo_param_t;

/* One line of the index, as Triton writes it; a NULL field is left out. */
typedef struct oi_repo_entry_s {
    char *name;
    char *version;
    char *state; /* READY, UNAVAILABLE, LOADING, UNLOADING */
    char *reason;
} oi_repo_entry_t;

typedef struct oi_repo_call_s oi_repo_call_t;

/* Called on the submitting loop's thread with the outcome in call->status and call->entries. */
typedef void (*oi_repo_done_cb)(oi_repo_call_t *call);

/* One repository request. Owned by the transport that made it, except between a successful
 * oi_repo_submit and its `done` callback, while the control thread has it. */
struct oi_repo_call_s {
    oi_repo_op_t op;
    char *model;    /* load and unload: the model's name (owned) */
    int ready;      /* index: only ready versions (gRPC; over HTTP the body says); READY: the answer */
    int64_t version; /* READY: the version asked about */
    oi_buf_t *body; /* HTTP: the JSON request body as sent (a reference), NULL when empty */
    oi_encoding_t body_encoding; /* how `body` came compressed: the control thread inflates it */
    size_t max_body_bytes;       /* the most it may inflate to */
    int grpc;       /* params below came from gRPC (over HTTP the body holds them) */
    /* Set to 1 (oi_repo_call_stop, on the submitter's loop) once the client has gone: its
     * connection closed, its stream was reset or its deadline passed. The handler may watch it
     * (read it with __atomic_load_n) to give up a long load. */
    unsigned char stop;
    oi_repo_param_t *params;
    size_t n_params;
    /* The handler's outcome. */
    oi_status_t *status;      /* NULL: done */
    oi_repo_entry_t *entries; /* index: the lines, each field owned (oi_repo_call_free frees) */
    size_t n_entries;
    oi_repo_param_t *results; /* LOGGING, TRACE: every setting as it now is (BOOL, INT, STRING or LIST) */
    size_t n_results;
    /* The submitter's. */
    oi_task_t task;
    oi_loop_t *loop;
    oi_repo_done_cb done;
    void *ctx;
    void *server;
};

/* Runs one call on a control thread: sets call->status (NULL on success) and, for an index,
 * call->entries. May block for as long as loading takes. */
typedef void (*oi_repo_handler_fn)(void *ctx, oi_repo_call_t *call);

/* Returns a zeroed call for `op`, or NULL (out of memory). */
oi_repo_call_t *oi_repo_call_new(oi_repo_op_t op);

/* Appends a parameter, copying name and data; 0 or -1 (out of memory). */
int oi_repo_call_add_param(oi_repo_call_t *call, const char *name, oi_repo_param_kind_t kind, int64_t number,
                           const void *data, size_t len);

/* Appends a setting to call->results, as oi_repo_call_add_param does to params. */
int oi_repo_call_add_result(oi_repo_call_t *call, const char *name, oi_repo_param_kind_t kind, int64_t number,
                            const void *data, size_t len);

/* Appends an index line, copying each field (NULL stays absent); 0 or -1 (out of memory). */
int oi_repo_call_add_entry(oi_repo_call_t *call, const char *name, const char *version, const char *state,
                           const char *reason);

/* Tells the handler that the call's client has gone (sets call->stop): called by the
 * transport that submitted it, on its loop, before `done`. */
void oi_repo_call_stop(oi_repo_call_t *call);

/* Frees the call and everything it holds. */
void oi_repo_call_free(oi_repo_call_t *call);

#endif
