/* What the blocking client connections share: a monotonic clock in milliseconds, waiting on
 * a socket against a deadline, and connecting with one. */
#ifndef OI_CLIENT_SOCKET_H
#define OI_CLIENT_SOCKET_H

#include <stddef.h>
#include <stdint.h>

/* Milliseconds of a monotonic clock. */
int64_t oi_client_now_ms(void);

/* Waits until fd is ready for poll `events`; deadline 0 waits forever. Returns 0, -1 on
 * error (errno set) or -2 on timeout. */
int oi_client_wait_fd(int fd, short events, int64_t deadline);

/* Connects to host:port (any address family the name resolves to), or to the Unix-domain
 * socket at `host` when it is an absolute path (port unused), before `deadline` (0: none).
 * The socket comes back blocking, with TCP_NODELAY and close-on-exec: a wait without a
 * deadline is then the read itself; calls that must not wait pass MSG_DONTWAIT. Returns 0
 * with *fd set, -1 (error) or -2 (timeout) with a message in `err`. */
int oi_client_connect(const char *host, int port, int64_t deadline, int *fd, char *err, size_t errlen);

#endif
