/* TCP listeners for the HTTP/1.1 and gRPC servers: one listening socket per server, watched by
 * each of its loops, every loop accepting one connection per wake-up. */
#ifndef OI_TRANSPORT_TCP_LISTEN_H
#define OI_TRANSPORT_TCP_LISTEN_H

#include <stdatomic.h>
#include <sys/socket.h>
#include <uv.h>

typedef struct oi_tcp_listener_s oi_tcp_listener_t;

/* A connection accepted on `l`: `fd` (non-blocking, close-on-exec) is the callee's, to open as a
 * uv_tcp_t on l's loop or to close. */
typedef void (*oi_tcp_accept_cb)(oi_tcp_listener_t *l, int fd);

/* One loop's watch on the server's listening socket. Owned by that loop's thread: opened,
 * woken and closed there only (the embedding struct lives until the loop has closed). */
struct oi_tcp_listener_s {
    uv_poll_t poll;   /* readable: a connection waits in the accept queue */
    uv_timer_t pause; /* after a failed accept (EMFILE...): resumes the poll */
    int fd;           /* this loop's own duplicate of the listening socket, with fd_open */
    int fd_open;      /* fd is ours to close */
    int handles;      /* poll and pause are initialised: close them */
    int grace;        /* the pause for balance is over: accept the next one whatever the counts */
    oi_tcp_accept_cb cb;
    void *data; /* the caller's */
    /* The server's listeners, one per loop, chained from the first (`head`); `next` is set once,
     * before that loop accepts, and the chain lives as long as the server. Other loops read
     * `conns` and `accepting` to compare themselves with this one. */
    struct oi_tcp_listener_s *head;
    struct oi_tcp_listener_s *_Atomic next;
    atomic_int conns;     /* connections open on this loop, kept by oi_tcp_listener_count */
    atomic_int accepting; /* open and watching the socket */
};

/* Opens `l` (zeroed) on `loop`, calling `cb` for each connection it accepts, on a duplicate of a listening
 * socket: `first`'s (the server's first loop), else `inherited` when it is > 0 (made by the parent
 * of `openinfer serve --workers` for this worker), else on a new socket bound to `addr`.
 * Every loop of a server shares that one socket (one accept queue; the port stays exclusive to the
 * server, unlike SO_REUSEPORT, which would let any process of the same user join the group). A
 * loop accepts ONE connection per wake-up (libuv's uv_listen takes the whole queue at once, so
 * the first loop awake took every burst): a busy loop polls less often and idle loops take more.
 * And a loop that holds more connections than another accepting loop leaves the next one to
 * it: it pauses a millisecond (then accepts one whatever the counts, so a stuck loop delays
 * a connection by that much at most). That spreads a burst even when the other loops are slow
 * to be scheduled (a loop accepts in microseconds, a thread may wait milliseconds for a CPU).
 * On failure `l` needs oi_tcp_listener_close all the same. 0 or a libuv error. */
int oi_tcp_listen(uv_loop_t *loop, oi_tcp_listener_t *l, const struct sockaddr_storage *addr,
                  const oi_tcp_listener_t *first, int inherited, oi_tcp_accept_cb cb, void *data);

/* Counts a connection opened (+1) or closed (-1) on l's loop (any connection of the loop,
 * accepted here or not), for the comparison above; on the loop's thread. */
void oi_tcp_listener_count(oi_tcp_listener_t *l, int delta);

/* Stops accepting on this loop and closes its duplicate (others keep theirs). Idempotent; on
 * the loop's thread. */
void oi_tcp_listener_close(oi_tcp_listener_t *l);

/* The port a listener is bound to; 0 when it cannot be read. */
int oi_tcp_bound_port(const oi_tcp_listener_t *l);

#endif
