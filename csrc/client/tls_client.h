/* TLS for the blocking client connections (https://, grpcs://): OpenSSL over memory, with the
 * connection's own send and recv calls (and their flags, deadlines and interrupt checks) moving
 * the ciphertext. Each call below does what the system call it replaces does when the
 * connection has no TLS (a NULL oi_ctls_t). */
#ifndef OI_CLIENT_TLS_CLIENT_H
#define OI_CLIENT_TLS_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

typedef struct oi_ctls_s oi_ctls_t;

/* What a client checks and shows. Strings are the caller's, copied by oi_ctls_config_copy. */
typedef struct oi_ctls_config_s {
    char *ca_file;   /* PEM CAs to verify the server with; NULL: the system's */
    char *cert_file; /* PEM client certificate (chain), for mutual TLS; NULL: none */
    char *key_file;  /* its private key (NULL: in cert_file) */
    int verify;      /* check the server's certificate and that it names the host; 0: neither */
    const char *alpn; /* the protocol offered ("h2", "http/1.1"); a static string */
} oi_ctls_config_t;

/* A copy of `cfg` (free it with oi_ctls_config_free), or NULL when out of memory. */
oi_ctls_config_t *oi_ctls_config_copy(const oi_ctls_config_t *cfg);
void oi_ctls_config_free(oi_ctls_config_t *cfg);

/* Runs the handshake over the connected socket `fd` to `host` (checked against the server's
 * certificate when cfg->verify) before `deadline` (0: none). 0 with *out set, -1 (error) or
 * -2 (timeout) with a message in `err` saying why (the certificate check's reason). */
int oi_ctls_connect(const oi_ctls_config_t *cfg, const char *host, int fd, int64_t deadline, oi_ctls_t **out,
                    char *err, size_t errlen);

/* Frees the TLS state (not the socket). NULL is ignored. */
void oi_ctls_free(oi_ctls_t *t);

/* sendmsg(fd, iov[0..n), MSG_NOSIGNAL | flags). With TLS the first 256 KiB or so of the
 * iovecs are encrypted and sent, and their count returned once all their ciphertext has gone
 * (a short write, as sendmsg may make); when the socket cannot take it (-1, EAGAIN), the
 * caller calls again with iovecs that start with the same bytes, as after any EAGAIN. */
ssize_t oi_ctls_sendmsg(oi_ctls_t *t, int fd, const struct iovec *iov, int n, int flags);

/* recv(fd, buf, len, flags). With TLS, plain text decrypted into `buf`: as much as is already
 * there before reading the socket, so that a return short of `len` leaves nothing buffered
 * and the socket's readiness tells when more has come. -1 with errno EPROTO for a bad record. */
ssize_t oi_ctls_recv(oi_ctls_t *t, int fd, void *buf, size_t len, int flags);

/* Why the last oi_ctls_recv failed with EPROTO: OpenSSL's reason (the server's alert). */
const char *oi_ctls_error(const oi_ctls_t *t);

/* Whether decrypted or undecrypted bytes wait in the TLS state (a poll of the socket would not
 * see them). */
int oi_ctls_buffered(const oi_ctls_t *t);

#endif
