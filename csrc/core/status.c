#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static char oom_message[] = "out of memory";
static oi_status_t oom_status = {OI_INTERNAL, oom_message};

oi_status_t *oi_status_new(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    oi_status_t *st = malloc(sizeof(*st) + (size_t)(n < 0 ? 0 : n) + 1);
    if (st == NULL || n < 0) {
        free(st);
        return &oom_status;
    }
    st->code = code;
    st->message = (char *)(st + 1);
    va_start(ap, fmt);
    vsnprintf(st->message, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return st;
}

void oi_status_free(oi_status_t *st)
{
    if (st != &oom_status)
        free(st);
}
