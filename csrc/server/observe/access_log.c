#include "server/observe/access_log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "core/recq.h"

/* Queued records: a power of two. At ~300 bytes each, 4096 is about 1.2 MiB. */
#define CAPACITY 4096

struct oi_access_log_s {
    oi_recq_t *queue; /* loop threads push, the queue's writer thread pops */
    FILE *out;
    uint64_t noted; /* the writer's: drops it has written a line about */
};

void oi_access_rec_stamp(oi_access_rec_t *rec, uint64_t start_ns)
{
    uint64_t now = uv_hrtime();
    rec->micros = now > start_ns ? (now - start_ns) / 1000 : 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    rec->wall_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void oi_access_log_push(oi_access_log_t *log, const oi_access_rec_t *rec)
{
    oi_recq_push(log->queue, rec);
}

uint64_t oi_access_log_dropped(const oi_access_log_t *log)
{
    return oi_recq_dropped(log->queue);
}

/* A field as one word: empty becomes "-", spaces and control bytes become '?' (a client's
 * path must not forge a line or a column). */
static void put_word(FILE *f, const char *s)
{
    if (*s == '\0') {
        fputc('-', f);
        return;
    }
    for (; *s; s++)
        fputc((unsigned char)*s <= ' ' || *s == 0x7f ? '?' : *s, f);
}

static void write_line(FILE *f, const oi_access_rec_t *r)
{
    time_t secs = (time_t)(r->wall_ns / 1000000000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    char when[32];
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    char peer[INET6_ADDRSTRLEN] = "-";
    if (r->has_peer) {
        static const uint8_t v4_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(r->peer.bytes, v4_prefix, 12) == 0)
            inet_ntop(AF_INET, r->peer.bytes + 12, peer, sizeof(peer));
        else
            inet_ntop(AF_INET6, r->peer.bytes, peer, sizeof(peer));
    }
    fprintf(f, "%s.%06ldZ %s %s ", when, (long)(r->wall_ns % 1000000000 / 1000), peer, r->grpc ? "gRPC" : "HTTP/1.1");
    put_word(f, r->method);
    fputc(' ', f);
    put_word(f, r->target);
    fputc(' ', f);
    put_word(f, r->version);
    fprintf(f, " %d %llu %llu %lluus\n", r->status, (unsigned long long)r->bytes_in, (unsigned long long)r->bytes_out,
            (unsigned long long)r->micros);
}

static void write_rec(void *ctx, void *rec)
{
    oi_access_log_t *log = ctx;
    write_line(log->out, rec);
}

/* After each pass of the writer: a line about new drops, and the pass's lines flushed. */
static void after_pass(void *ctx, size_t n)
{
    oi_access_log_t *log = ctx;
    uint64_t dropped = oi_access_log_dropped(log);
    if (dropped != log->noted) {
        fprintf(log->out, "# access log: %llu lines dropped so far (the writer fell behind)\n",
                (unsigned long long)dropped);
        log->noted = dropped;
    }
    if (n > 0 || dropped != 0)
        fflush(log->out);
}

oi_access_log_t *oi_access_log_open(const char *path, char *err, size_t errlen)
{
    oi_access_log_t *log = calloc(1, sizeof(*log));
    if (log != NULL)
        log->queue = oi_recq_new(CAPACITY, sizeof(oi_access_rec_t));
    if (log == NULL || log->queue == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (strcmp(path, "-") == 0) {
        int fd = dup(STDOUT_FILENO);
        log->out = fd >= 0 ? fdopen(fd, "a") : NULL;
        if (log->out == NULL && fd >= 0)
            close(fd);
    } else {
        log->out = fopen(path, "ae");
    }
    if (log->out == NULL) {
        snprintf(err, errlen, "cannot open the access log %s: %s", path, strerror(errno));
        goto fail;
    }
    int rc = oi_recq_consume(log->queue, write_rec, after_pass, log);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start the access log writer: %s", strerror(rc));
        fclose(log->out);
        goto fail;
    }
    return log;
fail:
    if (log != NULL)
        oi_recq_free(log->queue);
    free(log);
    return NULL;
}

void oi_access_log_close(oi_access_log_t *log)
{
    if (log == NULL)
        return;
    oi_recq_stop(log->queue);
    fclose(log->out);
    oi_recq_free(log->queue);
    free(log);
}
