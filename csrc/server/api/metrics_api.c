/* The metrics listener's one route: GET /metrics (also /metrics/, as Triton answers it); other
 * paths answer as Triton's metrics listener does. It runs on its own loop thread, so
 * rendering never holds up an inference connection. */
#include <stdio.h>
#include <string.h>

#include <llhttp.h>

#include "codec/json.h"
#include "server/server_impl.h"

#define TEXT_HEADERS "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"

static void respond_error(oi_http_request_t *r, int status, const char *message, const char *extra_headers)
{
    oi_sbuf_t body = {0};
    char headers[128];
    snprintf(headers, sizeof(headers), "Content-Type: application/json\r\n%s", extra_headers);
    oi_buf_t *b = oi_json_encode_error(&body, message) == 0 ? oi_sbuf_detach(&body) : NULL;
    if (b == NULL) {
        oi_sbuf_free(&body);
        oi_http_respond(r, 500, "", NULL, 0);
        return;
    }
    oi_iov_t part = {b->data, b->len, b};
    oi_http_respond(r, status, headers, &part, 1);
}

void oi__metrics_api_handle(void *ctx, oi_http_request_t *r)
{
    oi_server_t *s = ctx;
    /* Triton's HTTPMetricsServer: any method but GET is refused on every path, and a GET of
     * any other path is answered 200 with an empty text body. */
    if (r->method != HTTP_GET) {
        respond_error(r, OI_METHOD_NOT_ALLOWED, "Method Not Allowed", "Allow: GET\r\n");
        return;
    }
    if (strcmp(r->path, "/metrics") != 0 && strcmp(r->path, "/metrics/") != 0) {
        oi_http_respond(r, 200, "Content-Type: text/plain; charset=utf-8\r\n", NULL, 0);
        return;
    }
    if (atomic_load(&s->stopping)) {
        respond_error(r, OI_UNAVAILABLE, "the server is shutting down", "");
        return;
    }
    oi_sbuf_t text = {0};
    oi_buf_t *b = NULL;
    if (oi_metrics_render(s->metrics, &s->registry, s->cfg.statistics, &text) == 0)
        b = oi_sbuf_detach(&text);
    if (b == NULL) {
        oi_sbuf_free(&text);
        respond_error(r, OI_INTERNAL, "out of memory rendering the metrics", "");
        return;
    }
    oi_iov_t part = {b->data, b->len, b};
    oi_http_respond(r, 200, TEXT_HEADERS, &part, 1);
}
