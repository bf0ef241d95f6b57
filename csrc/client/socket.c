#include "client/socket.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int64_t oi_client_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static _Thread_local int (*interrupt_check)(void *);
static _Thread_local void *interrupt_arg;

void oi_client_set_interrupt(int (*check)(void *arg), void *arg)
{
    interrupt_check = check;
    interrupt_arg = arg;
}

int oi_client_interruptible(void)
{
    return interrupt_check != NULL;
}

int oi_client_poll_ms(int ms)
{
    return interrupt_check != NULL && (ms < 0 || ms > OI_CLIENT_INTERRUPT_MS) ? OI_CLIENT_INTERRUPT_MS : ms;
}

int oi_client_recv_slice(int fd, int64_t deadline, int *set_ms)
{
    int ms = -1;
    if (deadline > 0) {
        int64_t left = deadline - oi_client_now_ms();
        if (left <= 0)
            return -2;
        ms = left > INT_MAX ? INT_MAX : (int)left;
    }
    ms = oi_client_poll_ms(ms);
    if (ms < 0)
        ms = 0; /* SO_RCVTIMEO's "forever" */
    if (ms != *set_ms) {
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0)
            *set_ms = ms;
    }
    return 0;
}

int oi_client_interrupted(void)
{
    if (interrupt_check == NULL || !interrupt_check(interrupt_arg))
        return 0;
    errno = EINTR;
    return 1;
}

int oi_client_wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int ms = -1;
        if (deadline > 0) {
            int64_t left = deadline - oi_client_now_ms();
            if (left <= 0)
                return -2;
            ms = left > INT_MAX ? INT_MAX : (int)left;
        }
        struct pollfd p = {fd, events, 0};
        int slice = oi_client_poll_ms(ms);
        int n = poll(&p, 1, slice);
        if (n > 0)
            return 0;
        if (n == 0 && slice == ms)
            return -2;
        if ((n < 0 && errno != EINTR) || oi_client_interrupted())
            return -1;
    }
}

/* One address: a non-blocking connect waited for against the deadline. Returns the socket,
 * or -1 (errno set; *timed_out when the deadline passed). */
static int connect_one(const struct addrinfo *a, int64_t deadline, int *timed_out)
{
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0)
        return -1;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS)
        goto fail;
    int w = oi_client_wait_fd(fd, POLLOUT, deadline);
    if (w != 0) {
        *timed_out |= w == -2;
        goto fail;
    }
    int soerr = 0;
    socklen_t len = sizeof(soerr);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
    if (soerr != 0) {
        errno = soerr;
        goto fail;
    }
    int one = 1, fl = fcntl(fd, F_GETFL);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        goto fail;
    return fd;
fail:;
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

int oi_client_connect(const char *host, int port, int64_t deadline, int *fd, char *err, size_t errlen)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    int rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    int last_errno = 0, timed_out = 0;
    *fd = -1;
    for (struct addrinfo *a = res; a != NULL && *fd < 0; a = a->ai_next)
        if ((*fd = connect_one(a, deadline, &timed_out)) < 0)
            last_errno = errno;
    freeaddrinfo(res);
    if (*fd >= 0)
        return 0;
    if (timed_out) {
        snprintf(err, errlen, "timed out connecting to %s:%d", host, port);
        return -2;
    }
    snprintf(err, errlen, "cannot connect to %s:%d: %s", host, port, strerror(last_errno));
    return -1;
}
