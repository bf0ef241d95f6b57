/* Event-loop threads: each runs one libuv loop, and any thread can post a task to it. */
#ifndef OI_TRANSPORT_LOOP_H
#define OI_TRANSPORT_LOOP_H

#include <pthread.h>
#include <uv.h>

typedef struct oi_task_s oi_task_t;

/* A unit of work run on a loop thread. Embedded in the poster's own struct (no allocation);
 * the poster keeps it alive until `run` is called. */
struct oi_task_s {
    oi_task_t *next;
    void (*run)(oi_task_t *task);
};

typedef struct oi_loop_s {
    uv_loop_t uv;
    uv_async_t wake;
    pthread_mutex_t mu; /* guards the task list */
    oi_task_t *head;
    oi_task_t *tail;
    pthread_t thread;
    int started;
    char name[16]; /* the thread's name (ps -L, /proc/PID/task/TID/comm), set by oi_loop_start */
    /* Turns of the loop (each poll for events and the callbacks after it), counted by `turn`;
     * `ran_model_turn`: the last turn in which the loop ran a model itself, which it does for
     * the first request of a turn only (see oi_infer_submit). Loop thread only. */
    uv_prepare_t turn;
    uint64_t turns;
    uint64_t ran_model_turn;
} oi_loop_t;

typedef struct oi_work_s oi_work_t;

/* CPU-heavy work that must not hold up a loop (decompressing a request, compressing a
 * response): `run` goes to libuv's worker pool, then `done` runs back on the loop thread that
 * queued it, like a model's completion. Embedded in the poster's own struct; the poster keeps
 * it and what `run` reads alive until `done`, and `run` touches nothing of the loop's. */
struct oi_work_s {
    uv_work_t req; /* private */
    void (*run)(oi_work_t *w);
    void (*done)(oi_work_t *w);
};

/* Queues `w` from `l`'s own thread. 0, or a libuv error (then neither callback runs). The
 * loop keeps running until `done` has run, also while it is being stopped. */
int oi_loop_work(oi_loop_t *l, oi_work_t *w);

/* For tests: while `on`, each `run` waits before starting (so that a test can see the loop
 * serve other requests meanwhile); oi__work_held says how many wait. Not for production. */
void oi__work_hold(int on);
int oi__work_held(void);

/* Writes bufs[0..nb) to `s`: at once what the socket takes, the rest (if any) queued with
 * uv_write(req, ..., cb). Returns 1 when everything went at once (cb is not called), 0 when
 * queued (cb will be), or a libuv error (cb is not called). An answer written at once skips
 * libuv's write queue, whose completion costs a pass through the loop's pending queue and an
 * epoll_ctl per write (the drain re-arms the watcher even when nothing changes). Never ahead
 * of queued writes: nothing is written at once while any wait. May change `bufs`. */
int oi_stream_send(uv_stream_t *s, uv_write_t *req, uv_buf_t *bufs, unsigned nb, uv_write_cb cb);

/* Initializes the loop on the calling thread; 0 or a libuv error code. */
int oi_loop_init(oi_loop_t *l);

/* Starts the loop's thread, named `name` (at most 15 characters are kept), which runs until
 * every handle is closed. 0 or a libuv error. */
int oi_loop_start(oi_loop_t *l, const char *name);

/* Queues `t` to run on the loop's thread. Safe from any thread, the loop's own included. */
void oi_loop_post(oi_loop_t *l, oi_task_t *t);

/* Runs fn(arg) on the loop's thread and waits for it to return; runs it on the calling thread
 * when the loop's thread is not started. For set-up and shutdown steps that must touch the
 * loop's handles. Never call it from the loop's own thread. */
void oi_loop_call(oi_loop_t *l, void (*fn)(void *arg), void *arg);

/* Closes the wake-up handle so that the loop can end once the owner of every other handle
 * has closed it; call on the loop's thread. Tasks posted afterwards never run. */
void oi_loop_close_wake(oi_loop_t *l);

/* Waits for the loop's thread to end and frees the loop's resources (not `l` itself). */
void oi_loop_join(oi_loop_t *l);

#endif
