/* Opening a TCP listener on a loop, shared by the HTTP/1.1 and gRPC servers. */
#ifndef OI_TRANSPORT_TCP_LISTEN_H
#define OI_TRANSPORT_TCP_LISTEN_H

#include <sys/socket.h>
#include <uv.h>

/* Opens `tcp` (not yet initialised) on `loop` as a listener calling `cb` for each connection,
 * on a duplicate of a listening socket: `first`'s (the server's first loop), else `inherited`
 * when it is > 0 (made by the parent of `openinfer serve --workers` for this worker); else on a
 * new socket bound to `addr`. Sharing `first` is how a server's loops listen (one accept queue;
 * the port stays exclusive to the server, unlike SO_REUSEPORT, which would let any process of
 * the same user join it). Sets *initialised once `tcp` must be closed, whatever the result.
 * 0 or a libuv error. */
int oi_tcp_listen(uv_loop_t *loop, uv_tcp_t *tcp, const struct sockaddr_storage *addr, const uv_tcp_t *first,
                  int inherited, uv_connection_cb cb, int *initialised);

/* The port a listening handle is bound to; 0 when it cannot be read. */
int oi_tcp_bound_port(const uv_tcp_t *tcp);

#endif
