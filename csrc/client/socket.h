/* What the blocking client connections share: a monotonic clock in milliseconds, waiting on
 * a socket against a deadline, and connecting with one. */
#ifndef OI_CLIENT_SOCKET_H
#define OI_CLIENT_SOCKET_H

#include <stddef.h>
#include <stdint.h>

/* Lets the calling thread's blocking calls be interrupted (Ctrl-C in Python): a wait that a
 * signal interrupts (EINTR), and every OI_CLIENT_INTERRUPT_MS of any wait (a signal that
 * lands between two system calls interrupts none), asks `check(arg)`; the call stops with an
 * error, closing its connection, when it returns nonzero. Per thread; check NULL removes it. */
void oi_client_set_interrupt(int (*check)(void *arg), void *arg);
#define OI_CLIENT_INTERRUPT_MS 50

/* Whether the thread has an interrupt check: its waits must then go through poll, sliced. */
int oi_client_interruptible(void);

/* The poll timeout for a wait of `ms` (-1: forever): at most OI_CLIENT_INTERRUPT_MS when
 * interruptible. */
int oi_client_poll_ms(int ms);

/* Before a blocking recv on `fd` (a wait of one system call on the hot path, rather than
 * poll then recv): gives the socket a receive timeout (SO_RCVTIMEO) of the wait's next slice,
 * the time left before `deadline` (0: none) cut to OI_CLIENT_INTERRUPT_MS when
 * interruptible. `*set_ms` remembers what the socket has (start at 0 for a new socket), so
 * that the usual call changes nothing. 0, or -2 when the deadline has passed. A recv that
 * then fails with EAGAIN has waited a slice: check the deadline and oi_client_interrupted. */
int oi_client_recv_slice(int fd, int64_t deadline, int *set_ms);

/* After EINTR or a wait slice: 1 when the thread's interrupt check says to stop (errno is
 * then EINTR), 0 to go on waiting. */
int oi_client_interrupted(void);

/* Milliseconds of a monotonic clock. */
int64_t oi_client_now_ms(void);

/* Waits until fd is ready for poll `events`; deadline 0 waits forever. Returns 0, -1 on
 * error (errno set) or -2 on timeout. */
int oi_client_wait_fd(int fd, short events, int64_t deadline);

/* Connects to host:port (any address family the name resolves to) before `deadline` (0:
 * none). The socket comes back blocking, with TCP_NODELAY and close-on-exec: a wait without
 * a deadline is then the read itself; calls that must not wait pass MSG_DONTWAIT. Returns 0
 * with *fd set, -1 (error) or -2 (timeout) with a message in `err`. */
int oi_client_connect(const char *host, int port, int64_t deadline, int *fd, char *err, size_t errlen);

#endif
