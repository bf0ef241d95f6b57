#include "backends/process_wire.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int oi_pw_send(int sock, const void *msg, size_t len, const oi_pw_fds_t *fds)
{
    struct iovec iov = {(void *)msg, len};
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int) * OI_PW_MAX_FDS)];
    } ctl;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fds != NULL && fds->n > 0) {
        memset(&ctl, 0, sizeof(ctl));
        m.msg_control = ctl.space;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * fds->n);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds->n);
        memcpy(CMSG_DATA(c), fds->fd, sizeof(int) * fds->n);
    }
    ssize_t n;
    do
        n = sendmsg(sock, &m, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)len ? 0 : -1;
}

ssize_t oi_pw_recv(int sock, void *buf, size_t cap, oi_pw_fds_t *fds, uint32_t max)
{
    struct iovec iov = {buf, cap};
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int) * OI_PW_MAX_FDS)];
    } ctl;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space, .msg_controllen = sizeof(ctl)};
    ssize_t n;
    do
        n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    fds->n = 0;
    for (struct cmsghdr *c = n >= 0 ? CMSG_FIRSTHDR(&m) : NULL; c != NULL; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (fds->n < max && fds->n < OI_PW_MAX_FDS)
                fds->fd[fds->n++] = fd;
            else
                close(fd); /* more than the message may carry: never leak them */
        }
    }
    return n;
}

void oi_pw_close_fds(oi_pw_fds_t *fds)
{
    for (uint32_t i = 0; i < fds->n; i++)
        close(fds->fd[i]);
    fds->n = 0;
}
