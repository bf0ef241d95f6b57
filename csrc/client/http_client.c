#include "client/http_client.h"

#include "client/socket.h"
#include "client/tls_client.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <llhttp.h>

#define HEAD_BUF 16384
#define CHUNKED_INITIAL 65536

struct oi_http_client_s {
    char host[256]; /* a name, an address, or the path of a Unix socket */
    int port;
    char authority[300]; /* the Host header */
    int fd; /* -1 when not connected */
    oi_ctls_config_t *tls_cfg; /* https: what the connections check and show; NULL: plain */
    oi_ctls_t *tls;            /* the open connection's TLS */
    int reused; /* the connection served a request before: a failure may be a stale socket */
    int rcvtimeo_ms; /* the socket's SO_RCVTIMEO (oi_client_recv_slice) */
    llhttp_t parser;
    /* The response being read. */
    oi_http_client_response_t resp;
    int body_direct;
    int complete;
    int keep_alive;
    char hfield[64];
    size_t hfield_len;
    int in_ihcl;
    char ihcl[24];
    size_t ihcl_len;
    int failed; /* out of memory inside a parser callback */
    char rbuf[HEAD_BUF];
};

static void close_fd(oi_http_client_t *c)
{
    oi_ctls_free(c->tls);
    c->tls = NULL;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->reused = 0;
    c->rcvtimeo_ms = 0;
}

static int connect_to(oi_http_client_t *c, int64_t deadline, char *err, size_t errlen)
{
    int rc = oi_client_connect(c->host, c->port, deadline, &c->fd, err, errlen);
    if (rc == 0 && c->tls_cfg != NULL && (rc = oi_ctls_connect(c->tls_cfg, c->host, c->fd, deadline, &c->tls, err,
                                                               errlen)) != 0)
        close_fd(c);
    return rc;
}

/* Writes every byte of the iovecs. 0, -1 (error, errno kept) or -2 (timeout). */
static int send_all(oi_http_client_t *c, struct iovec *iov, int n, int64_t deadline)
{
    while (n > 0) {
        ssize_t w = oi_ctls_sendmsg(c->tls, c->fd, iov, n > IOV_MAX ? IOV_MAX : n,
                                    deadline > 0 || oi_client_interruptible() ? MSG_DONTWAIT : 0);
        if (w < 0) {
            if (errno == EINTR && !oi_client_interrupted())
                continue;
            if (errno == EINTR)
                return -1;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return -1;
            int rc = oi_client_wait_fd(c->fd, POLLOUT, deadline);
            if (rc != 0)
                return rc;
            continue;
        }
        size_t left = (size_t)w;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    return 0;
}

/* ---- response parsing ---------------------------------------------------------------------- */

static oi_http_client_t *client_of(llhttp_t *p) { return p->data; }

static int on_header_field(llhttp_t *p, const char *at, size_t n)
{
    oi_http_client_t *c = client_of(p);
    size_t room = sizeof(c->hfield) - c->hfield_len;
    size_t k = n < room ? n : room;
    memcpy(c->hfield + c->hfield_len, at, k);
    c->hfield_len += k;
    return 0;
}

static int on_header_field_complete(llhttp_t *p)
{
    oi_http_client_t *c = client_of(p);
    static const char name[] = "inference-header-content-length";
    c->in_ihcl = c->hfield_len == sizeof(name) - 1 && strncasecmp(c->hfield, name, c->hfield_len) == 0;
    c->hfield_len = 0;
    c->ihcl_len = 0;
    return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t n)
{
    oi_http_client_t *c = client_of(p);
    if (!c->in_ihcl)
        return 0;
    if (c->ihcl_len + n >= sizeof(c->ihcl))
        return -1;
    memcpy(c->ihcl + c->ihcl_len, at, n);
    c->ihcl_len += n;
    return 0;
}

static int on_header_value_complete(llhttp_t *p)
{
    oi_http_client_t *c = client_of(p);
    if (c->in_ihcl) {
        c->ihcl[c->ihcl_len] = '\0';
        char *end;
        long long v = strtoll(c->ihcl, &end, 10);
        if (*end != '\0' || v < 0)
            return -1;
        c->resp.inference_header_length = v;
        c->in_ihcl = 0;
    }
    return 0;
}

static int on_headers_complete(llhttp_t *p)
{
    oi_http_client_t *c = client_of(p);
    c->resp.status = p->status_code;
    if (p->status_code == 100)
        return 0;
    if (p->flags & F_CONTENT_LENGTH) {
        if (p->content_length > 0) {
            c->resp.body = oi_buf_new((size_t)p->content_length);
            c->body_direct = 1;
        }
    } else {
        c->resp.body = oi_buf_new(CHUNKED_INITIAL); /* chunked, or read until close */
    }
    if ((p->flags & (F_CONTENT_LENGTH)) && p->content_length > 0 && c->resp.body == NULL) {
        c->failed = 1;
        return -1;
    }
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n)
{
    oi_http_client_t *c = client_of(p);
    oi_buf_t *b = c->resp.body;
    if (b == NULL) {
        c->failed = 1;
        return -1;
    }
    if (at == b->data + b->len) { /* received straight into the body */
        b->len += n;
        return 0;
    }
    if (b->cap - b->len < n) {
        oi_buf_t *nb = oi_buf_grow(b, b->cap * 2 > b->len + n ? b->cap * 2 : b->len + n);
        if (nb == NULL) {
            c->failed = 1;
            return -1;
        }
        c->resp.body = b = nb;
    }
    memcpy(b->data + b->len, at, n);
    b->len += n;
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    oi_http_client_t *c = client_of(p);
    if (p->status_code == 100) /* an interim response: the final one follows */
        return 0;
    c->complete = 1;
    c->keep_alive = llhttp_should_keep_alive(p);
    return HPE_PAUSED;
}

static const llhttp_settings_t settings = {
    .on_header_field = on_header_field,
    .on_header_field_complete = on_header_field_complete,
    .on_header_value = on_header_value,
    .on_header_value_complete = on_header_value_complete,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* Reads until one whole response is parsed. 0, -1 (error: message in err), -2 (timeout), or
 * -3 when the peer closed before sending anything (a stale keep-alive connection). */
static int read_response(oi_http_client_t *c, int64_t deadline, char *err, size_t errlen)
{
    size_t got = 0;
    llhttp_init(&c->parser, HTTP_RESPONSE, &settings);
    c->parser.data = c;
    while (!c->complete) {
        oi_buf_t *b = c->resp.body;
        char *dst = c->rbuf;
        size_t room = sizeof(c->rbuf);
        if (c->body_direct && b != NULL && b->len < b->cap) {
            dst = b->data + b->len;
            room = b->cap - b->len;
        }
        /* One blocking recv waits a slice at most (SO_RCVTIMEO): deadline and Ctrl-C are
         * looked at between slices, at no cost to a response that comes in time. */
        if (oi_client_recv_slice(c->fd, deadline, &c->rcvtimeo_ms) != 0) {
            snprintf(err, errlen, "timed out waiting for the response from %s:%d", c->host, c->port);
            return -2;
        }
        ssize_t n = oi_ctls_recv(c->tls, c->fd, dst, room, 0);
        if (n < 0) {
            if ((errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) && !oi_client_interrupted())
                continue;
            if (errno == EINTR) {
                snprintf(err, errlen, "interrupted waiting for the response from %s:%d", c->host, c->port);
                return -1;
            }
            if (got == 0 && c->reused && (errno == ECONNRESET || errno == EPIPE))
                return -3;
            snprintf(err, errlen, "receiving from %s:%d: %s", c->host, c->port,
                     errno == EPROTO && c->tls ? oi_ctls_error(c->tls) : strerror(errno));
            return -1;
        }
        if (n == 0) {
            if (got == 0 && c->reused)
                return -3;
            if (llhttp_finish(&c->parser) == HPE_OK && c->complete)
                break;
            snprintf(err, errlen, "%s:%d closed the connection in the middle of a response", c->host, c->port);
            return -1;
        }
        got += (size_t)n;
        llhttp_errno_t e = llhttp_execute(&c->parser, dst, (size_t)n);
        if (e != HPE_OK && e != HPE_PAUSED) {
            snprintf(err, errlen, c->failed ? "out of memory for the response" : "malformed response: %s",
                     llhttp_get_error_reason(&c->parser));
            return -1;
        }
    }
    return 0;
}

static void reset_response(oi_http_client_t *c)
{
    oi_buf_unref(c->resp.body);
    memset(&c->resp, 0, sizeof(c->resp));
    c->resp.inference_header_length = -1;
    c->body_direct = c->complete = c->failed = c->in_ihcl = 0;
    c->hfield_len = c->ihcl_len = 0;
    c->keep_alive = 1;
}

oi_http_client_t *oi_http_client_new(const char *host, int port)
{
    oi_http_client_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    snprintf(c->host, sizeof(c->host), "%s", host);
    c->port = port;
    if (host[0] == '/') /* a Unix socket: the name HTTP clients use there */
        snprintf(c->authority, sizeof(c->authority), "localhost");
    else
        snprintf(c->authority, sizeof(c->authority), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    c->fd = -1;
    return c;
}

int oi_http_client_set_tls(oi_http_client_t *c, const oi_ctls_config_t *cfg)
{
    oi_ctls_config_t copy = *cfg;
    copy.alpn = "http/1.1";
    oi_ctls_config_t *n = oi_ctls_config_copy(&copy);
    if (n == NULL)
        return -1;
    close_fd(c);
    oi_ctls_config_free(c->tls_cfg);
    c->tls_cfg = n;
    return 0;
}

int oi_http_client_request(oi_http_client_t *c, const char *method, const char *path, const char *headers,
                           const struct iovec *parts, int nparts, int64_t timeout_ms, oi_http_client_response_t *out,
                           char *err, size_t errlen)
{
    int64_t deadline = timeout_ms > 0 ? oi_client_now_ms() + timeout_ms : 0;
    size_t body_len = 0;
    for (int i = 0; i < nparts; i++)
        body_len += parts[i].iov_len;
    char head[1024];
    int hn = snprintf(head, sizeof(head), "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %zu\r\n%s\r\n", method, path,
                      c->authority, body_len, headers ? headers : "");
    if (hn < 0 || (size_t)hn >= sizeof(head)) {
        snprintf(err, errlen, "request line and headers too long");
        return -1;
    }
    struct iovec small[17], *iov = nparts < 16 ? small : malloc((size_t)(nparts + 1) * sizeof(*iov));
    if (iov == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        reset_response(c);
        if (c->fd < 0 && (rc = connect_to(c, deadline, err, errlen)) != 0)
            break;
        iov[0] = (struct iovec){head, (size_t)hn};
        memcpy(iov + 1, parts, (size_t)nparts * sizeof(*iov));
        rc = send_all(c, iov, nparts + 1, deadline);
        if (rc == -1 && c->reused && (errno == EPIPE || errno == ECONNRESET)) {
            close_fd(c); /* the server closed an idle connection: once more on a new one */
            continue;
        }
        if (rc == -2) {
            snprintf(err, errlen, "timed out sending the request to %s:%d", c->host, c->port);
            break;
        }
        if (rc != 0 && errno == EINTR) {
            snprintf(err, errlen, "interrupted sending to %s:%d", c->host, c->port);
            break;
        }
        if (rc != 0) {
            /* The server may have answered before reading everything (413, say) and closed:
             * its answer, when it arrived, says more than the broken pipe. */
            int send_errno = errno;
            rc = read_response(c, deadline, err, errlen) == 0 ? 0 : -1;
            if (rc != 0)
                snprintf(err, errlen, "sending to %s:%d: %s", c->host, c->port, strerror(send_errno));
            break;
        }
        rc = read_response(c, deadline, err, errlen);
        if (rc == -3) {
            close_fd(c);
            rc = -1;
            snprintf(err, errlen, "%s:%d closed the connection without answering", c->host, c->port);
            continue;
        }
        break;
    }
    if (iov != small)
        free(iov);
    if (rc != 0) {
        close_fd(c);
        reset_response(c);
        return rc;
    }
    *out = c->resp;
    c->resp.body = NULL;
    if (c->keep_alive)
        c->reused = 1;
    else
        close_fd(c);
    return 0;
}

void oi_http_client_free(oi_http_client_t *c)
{
    if (c == NULL)
        return;
    close_fd(c);
    reset_response(c);
    oi_ctls_config_free(c->tls_cfg);
    free(c);
}
