#include "transport/tcp_listen.h"

#include <errno.h>
#include <netinet/in.h>
#include <unistd.h>

int oi_tcp_listen(uv_loop_t *loop, uv_tcp_t *tcp, const struct sockaddr_storage *addr, const uv_tcp_t *first,
                  int inherited, uv_connection_cb cb, int *initialised)
{
    int rc, share_fd = inherited > 0 ? inherited : -1;
    if (first != NULL) {
        uv_os_fd_t fd;
        if ((rc = uv_fileno((const uv_handle_t *)first, &fd)) != 0)
            return rc;
        share_fd = fd;
    }
    if (share_fd >= 0) {
        int fd = dup(share_fd);
        if (fd < 0)
            return uv_translate_sys_error(errno);
        if ((rc = uv_tcp_init(loop, tcp)) != 0) {
            close(fd);
            return rc;
        }
        *initialised = 1;
        if ((rc = uv_tcp_open(tcp, fd)) != 0) {
            close(fd);
            return rc;
        }
    } else {
        if ((rc = uv_tcp_init_ex(loop, tcp, addr->ss_family)) != 0)
            return rc;
        *initialised = 1;
        if ((rc = uv_tcp_bind(tcp, (const struct sockaddr *)addr, 0)) != 0)
            return rc;
    }
    return uv_listen((uv_stream_t *)tcp, 1024, cb);
}

int oi_tcp_bound_port(const uv_tcp_t *tcp)
{
    struct sockaddr_storage bound;
    int len = sizeof(bound);
    if (uv_tcp_getsockname(tcp, (struct sockaddr *)&bound, &len) != 0)
        return 0;
    return ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                             : ((struct sockaddr_in *)&bound)->sin_port);
}
