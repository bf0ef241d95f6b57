/* The access log: one line per answered request (HTTP or gRPC). Loop threads push a fixed-size
 * record, copied into a bounded lock-free queue (never a lock, never text, never a write);
 * a writer thread of its own formats the lines and writes them. When the writer falls behind
 * and the queue is full, the record is dropped and counted, and the writer notes the count in
 * the log, so the loops never wait on the disk or on a pipe nobody reads. */
#ifndef OI_SERVER_OBSERVE_ACCESS_LOG_H
#define OI_SERVER_OBSERVE_ACCESS_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "transport/peers.h"

typedef struct oi_access_log_s oi_access_log_t;

/* One request as the loop saw it. Text fields are NUL-terminated, cut to fit. */
typedef struct oi_access_rec_s {
    int64_t wall_ns;              /* CLOCK_REALTIME when answered */
    uint64_t micros;              /* from the request's first byte (HTTP) or its headers (gRPC) to the answer */
    uint64_t bytes_in, bytes_out; /* HTTP: head and body in, body out; gRPC: message bytes */
    oi_peer_addr_t peer;          /* IPv6 or v4-mapped; has_peer 0 when the socket has no IP peer */
    int has_peer;
    int grpc;         /* 0: HTTP/1.1 */
    int status;       /* HTTP status or gRPC status code */
    char method[32];  /* HTTP method or the RPC's name */
    char target[192]; /* HTTP: the path; gRPC: the model, when the RPC names one */
    char version[24]; /* gRPC: the model version asked for */
} oi_access_rec_t;

/* Opens `path` for appending ("-": standard output) and starts the writer. NULL with a
 * message in `err` when the file cannot be opened or memory runs out. */
oi_access_log_t *oi_access_log_open(const char *path, char *err, size_t errlen);

/* Queues a copy of `rec`; any thread, never blocks. Drops it (and counts) when full. */
void oi_access_log_push(oi_access_log_t *log, const oi_access_rec_t *rec);

/* Records dropped so far. */
uint64_t oi_access_log_dropped(const oi_access_log_t *log);

/* Writes what is queued, stops the writer and closes the file. No push may follow. */
void oi_access_log_close(oi_access_log_t *log);

/* Fills rec->micros and rec->wall_ns for a request that began at `start_ns` (uv_hrtime). */
void oi_access_rec_stamp(oi_access_rec_t *rec, uint64_t start_ns);

#endif
