#include "transport/grpc.h"

#include <string.h>

int oi_grpc_status_from_http(int code)
{
    switch (code) {
    case 0:
    case 200: return OI_GRPC_OK;
    case 400:
    case 405:
    case 415:
    case 422: return OI_GRPC_INVALID_ARGUMENT;
    case 401: return OI_GRPC_UNAUTHENTICATED;
    case 403: return OI_GRPC_PERMISSION_DENIED;
    case 404: return OI_GRPC_NOT_FOUND;
    case 408:
    case 504: return OI_GRPC_DEADLINE_EXCEEDED;
    case 409:
    case OI_TRITON_ALREADY_EXISTS: return OI_GRPC_ALREADY_EXISTS;
    case OI_TRITON_UNKNOWN: return OI_GRPC_UNKNOWN;
    case OI_TRITON_CANCELLED: return OI_GRPC_CANCELLED;
    case 412: return OI_GRPC_FAILED_PRECONDITION;
    case 413:
    case 429:
    case 431: return OI_GRPC_RESOURCE_EXHAUSTED;
    case 499: return OI_GRPC_CANCELLED;
    case 501: return OI_GRPC_UNIMPLEMENTED;
    case 502:
    case 503: return OI_GRPC_UNAVAILABLE;
    default: return code >= 400 && code < 500 ? OI_GRPC_INVALID_ARGUMENT : OI_GRPC_INTERNAL;
    }
}

int oi_grpc_parse_timeout(const char *v, size_t n, uint64_t *ms)
{
    if (n < 2 || n > 9)
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    switch (v[n - 1]) {
    case 'H': *ms = x * 3600000; return 0;
    case 'M': *ms = x * 60000; return 0;
    case 'S': *ms = x * 1000; return 0;
    case 'm': *ms = x; return 0;
    case 'u': *ms = (x + 999) / 1000; return 0;
    case 'n': *ms = (x + 999999) / 1000000; return 0;
    default: return -1;
    }
}

int oi_grpc_percent_encode(oi_sbuf_t *out, const char *msg)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(msg);
    if (oi_sbuf_reserve(out, n * 3 + 1) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)msg[i];
        if (c >= 0x20 && c <= 0x7e && c != '%') {
            out->data[out->len++] = (char)c;
        } else {
            out->data[out->len++] = '%';
            out->data[out->len++] = hex[c >> 4];
            out->data[out->len++] = hex[c & 15];
        }
    }
    return 0;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

size_t oi_grpc_percent_decode(const char *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int hi, lo;
        if (in[i] == '%' && i + 2 < n && (hi = hex_value(in[i + 1])) >= 0 && (lo = hex_value(in[i + 2])) >= 0) {
            out[o++] = (char)(hi << 4 | lo);
            i += 2;
        } else {
            out[o++] = in[i];
        }
    }
    out[o] = '\0';
    return o;
}

void oi_grpc_put_prefix(uint8_t out[5], uint32_t len)
{
    out[0] = 0;
    out[1] = (uint8_t)(len >> 24);
    out[2] = (uint8_t)(len >> 16);
    out[3] = (uint8_t)(len >> 8);
    out[4] = (uint8_t)len;
}
