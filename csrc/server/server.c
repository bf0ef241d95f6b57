#include "server/server_impl.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- life cycle --------------------------------------------------------------------------- */

oi_server_t *oi_server_new(const oi_server_config_t *cfg)
{
    oi_server_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->cfg = *cfg;
    oi_registry_init(&s->registry);
    s->http = oi_http_server_new(&s->cfg.http, oi__http_api_handle, s);
    if (s->http == NULL) {
        oi_registry_destroy(&s->registry);
        free(s);
        return NULL;
    }
    return s;
}

int oi_server_set_metadata(oi_server_t *s, const char *json, size_t len)
{
    oi_buf_t *b = oi_buf_new(len);
    if (b == NULL)
        return -1;
    memcpy(b->data, json, len);
    b->len = len;
    oi_buf_unref(s->metadata);
    s->metadata = b;
    return 0;
}

int oi_server_add_model(oi_server_t *s, oi_model_t *m) { return oi_registry_add(&s->registry, m); }

int oi_server_start(oi_server_t *s, char *err, size_t errlen) { return oi_http_server_start(s->http, err, errlen); }

int oi_server_port(const oi_server_t *s) { return oi_http_server_port(s->http); }

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void wait_inflight(oi_server_t *s, uint64_t deadline)
{
    while (oi_http_server_inflight(s->http) > 0 && now_ms() < deadline) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void oi_server_stop(oi_server_t *s, uint64_t timeout_ms)
{
    if (s == NULL)
        return;
    /* Handlers that started before the flag finish before the barrier inside
     * stop_accepting; later ones see it and touch neither registry nor schedulers. */
    atomic_store(&s->stopping, 1);
    oi_http_server_stop_accepting(s->http);
    wait_inflight(s, now_ms() + timeout_ms);
    /* Executors finish their current job; queued ones are failed with 503 and answered. */
    oi_registry_destroy(&s->registry);
    wait_inflight(s, now_ms() + 5000);
    oi_http_server_free(s->http);
    oi_buf_unref(s->metadata);
    free(s);
}
