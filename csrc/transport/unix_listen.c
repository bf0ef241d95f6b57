#include "transport/unix_listen.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* Whether a process listens on the socket at `addr`: 1 yes, 0 no (connect() answers at once on
 * a Unix socket: ECONNREFUSED when nobody accepts), or -errno when connect() cannot tell. */
static int someone_listens(const struct sockaddr_un *addr)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int rc = connect(fd, (const struct sockaddr *)addr, sizeof(*addr));
    int e = errno;
    close(fd);
    if (rc == 0 || e == EAGAIN) /* EAGAIN: its backlog is full, so someone listens */
        return 1;
    return e == ECONNREFUSED || e == ENOENT ? 0 : -e;
}

/* Clears the way for a new socket at addr->sun_path: 0, or -1 with a message. */
static int clear_path(const struct sockaddr_un *addr, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(addr->sun_path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(err, errlen, "cannot use Unix socket path %s: %s", addr->sun_path, strerror(errno));
        return -1;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "cannot listen on %s: it exists and is not a socket; refusing to replace it",
                 addr->sun_path);
        return -1;
    }
    int listens = someone_listens(addr);
    if (listens != 0) {
        if (listens > 0)
            snprintf(err, errlen, "cannot listen on %s: another server is listening on that socket", addr->sun_path);
        else
            snprintf(err, errlen,
                     "cannot listen on %s: a socket is there and connecting to it to see whether it is "
                     "in use failed: %s",
                     addr->sun_path, strerror(-listens));
        return -1;
    }
    if (unlink(addr->sun_path) != 0 && errno != ENOENT) { /* a stale socket: its server is gone */
        snprintf(err, errlen, "cannot remove the stale socket %s: %s", addr->sun_path, strerror(errno));
        return -1;
    }
    return 0;
}

int oi_unix_listen_open(uv_loop_t *loop, uv_pipe_t *pipe, const char *path, unsigned mode, oi_unix_socket_t *out,
                        char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(addr.sun_path)) {
        snprintf(err, errlen, "Unix socket path must be 1 to %zu bytes, got %zu", sizeof(addr.sun_path) - 1, n);
        return UV_EINVAL;
    }
    memcpy(addr.sun_path, path, n + 1);
    if (clear_path(&addr, err, errlen) != 0)
        return UV_EADDRINUSE;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        int rc = uv_translate_sys_error(errno);
        snprintf(err, errlen, "cannot create a Unix socket: %s", uv_strerror(rc));
        return rc;
    }
    struct stat st;
    int rc = 0;
    err[0] = '\0';
    if (bind(fd, (const struct sockaddr *)&addr, sizeof(addr)) != 0) {
        rc = uv_translate_sys_error(errno);
        snprintf(err, errlen, "cannot listen on %s: %s", path, uv_strerror(rc));
        close(fd);
        return rc;
    }
    /* Before listen(): until then a connect is refused, so the umask's wider bits never let
     * anyone in. lstat first: chmod must not follow a link someone put in the file's place. */
    errno = EEXIST; /* what a non-socket in the socket's place reports */
    if (lstat(path, &st) != 0 || !S_ISSOCK(st.st_mode) || chmod(path, mode & 07777) != 0) {
        rc = uv_translate_sys_error(errno);
        snprintf(err, errlen, "cannot set the permissions of %s: %s", path, uv_strerror(rc));
    } else if ((rc = uv_pipe_init(loop, pipe, 0)) == 0 && (rc = uv_pipe_open(pipe, fd)) != 0) {
        uv_close((uv_handle_t *)pipe, NULL);
    }
    if (rc != 0) {
        close(fd);
        unlink(path);
        if (!*err)
            snprintf(err, errlen, "cannot listen on %s: %s", path, uv_strerror(rc));
        return rc;
    }
    memcpy(out->path, path, n + 1);
    out->dev = st.st_dev;
    out->ino = st.st_ino;
    return 0;
}

int oi_unix_listen_dup(uv_loop_t *loop, uv_pipe_t *pipe, const uv_pipe_t *first)
{
    uv_os_fd_t fd;
    int rc = uv_fileno((const uv_handle_t *)first, &fd);
    if (rc != 0)
        return rc;
    int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0)
        return uv_translate_sys_error(errno);
    if ((rc = uv_pipe_init(loop, pipe, 0)) != 0) {
        close(d);
        return rc;
    }
    if ((rc = uv_pipe_open(pipe, d)) != 0) {
        close(d);
        uv_close((uv_handle_t *)pipe, NULL);
    }
    return rc;
}

void oi_unix_listen_unlink(oi_unix_socket_t *s)
{
    struct stat st;
    if (s->path[0] && lstat(s->path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == s->dev && st.st_ino == s->ino)
        unlink(s->path);
    memset(s, 0, sizeof(*s));
}
