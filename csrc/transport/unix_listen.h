/* Listening on a Unix-domain socket file, the recommended transport for clients on this host:
 * the kernel tells the server who the client is (SO_PEERCRED, see transport/peer.h), and the
 * file's permissions decide who may connect at all. Shared by the HTTP/1.1 and gRPC servers. */
#ifndef OI_TRANSPORT_UNIX_LISTEN_H
#define OI_TRANSPORT_UNIX_LISTEN_H

#include <stddef.h>
#include <sys/types.h>
#include <uv.h>

/* What was created at a path, so that only that file is removed at the end (an operator may
 * have replaced it meanwhile). */
typedef struct oi_unix_socket_s {
    char path[108]; /* sun_path's size; "" when nothing was created */
    dev_t dev;
    ino_t ino;
} oi_unix_socket_t;

/* Binds a new socket to `path` with permission bits `mode` (e.g. 0660) and hands it to `pipe`
 * (initialised here on `loop`), ready for uv_listen. The file is made safely: an existing
 * socket that nobody listens on (left by a server that died) is replaced, one with a listener
 * is "address in use", and anything else (a regular file, a directory, a link) is refused, never
 * removed. The mode is set before listen(), so no client can connect under wider permissions.
 * Returns 0 with *out filled, or a libuv error with a message in `err`. */
int oi_unix_listen_open(uv_loop_t *loop, uv_pipe_t *pipe, const char *path, unsigned mode, oi_unix_socket_t *out,
                        char *err, size_t errlen);

/* Another loop's handle on the same listening socket (a duplicate of `first`'s descriptor), so
 * that the loops share one accept queue. 0 or a libuv error. */
int oi_unix_listen_dup(uv_loop_t *loop, uv_pipe_t *pipe, const uv_pipe_t *first);

/* Removes the socket file, if it is still the one created (same device and inode), and clears
 * *s. Idempotent. */
void oi_unix_listen_unlink(oi_unix_socket_t *s);

#endif
