#include "transport/tcp_listen.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <unistd.h>

#define BACKLOG 1024
/* How long a loop stops accepting after the process ran out of descriptors or memory: the
 * socket stays readable, so retrying at once would spin; the connections wait in the queue. */
#define ACCEPT_PAUSE_MS 100
/* How long a loop with more connections than another leaves new ones to the others. */
#define BALANCE_PAUSE_MS 1

static void on_readable(uv_poll_t *poll, int status, int events);

static void resume(uv_timer_t *t)
{
    oi_tcp_listener_t *l = t->data;
    l->grace = 1;
    if (l->handles)
        uv_poll_start(&l->poll, UV_READABLE, on_readable);
}

static void pause_accepting(oi_tcp_listener_t *l, uint64_t ms)
{
    uv_poll_stop(&l->poll);
    uv_timer_start(&l->pause, resume, ms, 0);
}

/* Whether another accepting loop of the server holds fewer connections than l's. */
static int busier_than_another(const oi_tcp_listener_t *l)
{
    int mine = atomic_load_explicit(&l->conns, memory_order_relaxed);
    for (oi_tcp_listener_t *o = l->head; o != NULL; o = atomic_load_explicit(&o->next, memory_order_acquire))
        if (o != l && atomic_load_explicit(&o->accepting, memory_order_relaxed) &&
            atomic_load_explicit(&o->conns, memory_order_relaxed) < mine)
            return 1;
    return 0;
}

/* Whether a failed accept is one that the next wake-up simply retries: another loop took the
 * connection, or its client left before we accepted (accept(2) lists the network errors that
 * Linux passes on the same way), or a firewall rule refused it (EPERM). Not so EMFILE, ENFILE,
 * ENOBUFS, ENOMEM... */
static int accept_retries(int err)
{
    return err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED || err == EPROTO ||
           err == ENETDOWN || err == ENOPROTOOPT || err == EHOSTDOWN || err == ENONET || err == EHOSTUNREACH ||
           err == EOPNOTSUPP || err == ENETUNREACH || err == EPERM;
}

static void on_readable(uv_poll_t *poll, int status, int events)
{
    (void)events;
    oi_tcp_listener_t *l = poll->data;
    if (status < 0) {
        pause_accepting(l, ACCEPT_PAUSE_MS);
        return;
    }
    if (!l->grace && busier_than_another(l)) {
        pause_accepting(l, BALANCE_PAUSE_MS);
        return;
    }
    l->grace = 0;
    int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
        l->cb(l, fd);
        return;
    }
    if (!accept_retries(errno)) /* the socket stays readable: wait a little */
        pause_accepting(l, ACCEPT_PAUSE_MS);
}

/* A new listening socket bound to `addr`, as libuv's uv_tcp_bind makes it (SO_REUSEADDR, and
 * dual-stack for IPv6). A descriptor, or a negative errno. */
static int bind_socket(const struct sockaddr_storage *addr)
{
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), on = 1, off = 0;
    if (fd < 0)
        return -errno;
    socklen_t len = addr->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on)) != 0 ||
        (addr->ss_family == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off)) != 0) ||
        bind(fd, (const struct sockaddr *)addr, len) != 0) {
        int err = errno;
        close(fd);
        return -err;
    }
    return fd;
}

int oi_tcp_listen(uv_loop_t *loop, oi_tcp_listener_t *l, const struct sockaddr_storage *addr,
                  const oi_tcp_listener_t *first, int inherited, oi_tcp_accept_cb cb, void *data)
{
    l->cb = cb;
    l->data = data;
    l->head = first != NULL ? first->head : l;
    int rc, fd;
    if (first != NULL)
        fd = fcntl(first->fd, F_DUPFD_CLOEXEC, 0);
    else if (inherited > 0) /* the parent's stays the parent's: accept on a duplicate */
        fd = fcntl(inherited, F_DUPFD_CLOEXEC, 0);
    else if ((fd = bind_socket(addr)) < 0)
        return uv_translate_sys_error(-fd);
    if (fd < 0)
        return uv_translate_sys_error(errno);
    l->fd = fd;
    l->fd_open = 1;
    /* O_NONBLOCK is shared by every duplicate (one open file): set for an inherited socket,
     * so that a loop that loses the race for a connection is told EAGAIN, never blocks. */
    if (first == NULL) {
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0 || listen(fd, BACKLOG) != 0)
            return uv_translate_sys_error(errno);
    }
    if ((rc = uv_poll_init_socket(loop, &l->poll, fd)) != 0)
        return rc;
    if ((rc = uv_timer_init(loop, &l->pause)) != 0) {
        uv_close((uv_handle_t *)&l->poll, NULL);
        return rc;
    }
    l->handles = 1;
    l->poll.data = l->pause.data = l;
    if ((rc = uv_poll_start(&l->poll, UV_READABLE, on_readable)) != 0)
        return rc;
    atomic_store(&l->accepting, 1);
    if (first != NULL) { /* last in the chain: the loops open one after the other */
        oi_tcp_listener_t *last = l->head;
        while (atomic_load(&last->next) != NULL)
            last = atomic_load(&last->next);
        atomic_store_explicit(&last->next, l, memory_order_release);
    }
    return 0;
}

void oi_tcp_listener_count(oi_tcp_listener_t *l, int delta)
{
    atomic_fetch_add_explicit(&l->conns, delta, memory_order_relaxed);
}

void oi_tcp_listener_close(oi_tcp_listener_t *l)
{
    atomic_store(&l->accepting, 0);
    if (l->handles) {
        l->handles = 0;
        /* Closing the poll takes the descriptor out of the loop's epoll set at once, so the
         * descriptor can be closed right after. */
        uv_close((uv_handle_t *)&l->poll, NULL);
        uv_close((uv_handle_t *)&l->pause, NULL);
    }
    if (l->fd_open) {
        l->fd_open = 0;
        close(l->fd);
    }
}

int oi_tcp_bound_port(const oi_tcp_listener_t *l)
{
    struct sockaddr_storage bound;
    socklen_t len = sizeof(bound);
    if (!l->fd_open || getsockname(l->fd, (struct sockaddr *)&bound, &len) != 0)
        return 0;
    return ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                             : ((struct sockaddr_in *)&bound)->sin_port);
}
