#include "server/shm/shm_body.h"

#include <string.h>

#include "codec/json.h"

/* Decodes standard base64 (padding optional) into out (cap bytes); returns the length or -1. */
static long b64_decode(const char *s, size_t n, unsigned char *out, size_t cap)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t k = 0;
    while (n > 0 && s[n - 1] == '=')
        n--;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        int v = ch >= 'A' && ch <= 'Z'   ? ch - 'A'
                : ch >= 'a' && ch <= 'z' ? ch - 'a' + 26
                : ch >= '0' && ch <= '9' ? ch - '0' + 52
                : ch == '+'              ? 62
                : ch == '/'              ? 63
                                         : -1;
        if (v < 0)
            return -1;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (k >= cap)
                return -1;
            out[k++] = (unsigned char)(acc >> bits);
        }
    }
    return (long)k;
}

/* Reads a non-negative integer member; an absent optional one reads as 0. */
static oi_status_t *body_count(oi_slice_t body, const char *key, int required, uint64_t *out)
{
    oi_json_param_t v;
    char none[1];
    oi_json_param(body, key, &v, none, sizeof(none));
    if (v.kind == OI_JSON_PARAM_ABSENT && !required) {
        *out = 0;
        return NULL;
    }
    if (v.kind != OI_JSON_PARAM_COUNT)
        return oi_status_new(OI_BAD_REQUEST, "register request: '%s' must be a non-negative integer%s", key,
                             v.kind == OI_JSON_PARAM_ABSENT ? " and is missing" : "");
    *out = (uint64_t)v.count;
    return NULL;
}

oi_status_t *oi_shm_decode_register(oi_slice_t body, oi_shm_kind_t kind, oi_shm_register_body_t *out)
{
    memset(out, 0, sizeof(*out));
    oi_json_param_t v;
    char probe[1];
    if (body.ptr == NULL || oi_json_param(body, "", &v, probe, sizeof(probe)) != 0)
        return oi_status_new(OI_BAD_REQUEST, "register request: expected a JSON object body, got %s",
                             body.ptr == NULL ? "no body" : "malformed JSON");
    oi_status_t *st = body_count(body, "byte_size", 1, &out->byte_size);
    if (st != NULL)
        return st;
    if (kind == OI_SHM_SYSTEM) {
        if ((st = body_count(body, "offset", 0, &out->offset)) != NULL)
            return st;
        oi_json_param(body, "key", &v, out->key, sizeof(out->key));
        if (v.kind != OI_JSON_PARAM_STRING || v.too_long || strlen(out->key) != v.len)
            return oi_status_new(OI_BAD_REQUEST,
                                 "register request: 'key' must be a string, a shared-memory name "
                                 "(\"/name\") of at most %d bytes",
                                 OI_SHM_MAX_NAME + 1);
        return NULL;
    }
    if ((st = body_count(body, "device_id", 1, &out->device_id)) != NULL)
        return st;
    oi_json_param(body, "raw_handle", &v, probe, sizeof(probe));
    char b64[128];
    oi_json_param_t h = {0};
    if (v.kind == OI_JSON_PARAM_OTHER)
        oi_json_param(v.raw, "b64", &h, b64, sizeof(b64));
    long n =
        h.kind == OI_JSON_PARAM_STRING && !h.too_long ? b64_decode(b64, h.len, out->handle, sizeof(out->handle)) : -1;
    if (n < 0)
        return oi_status_new(OI_BAD_REQUEST,
                             "register request: 'raw_handle' must be {\"b64\": <base64 of a %d-byte "
                             "cudaIpcMemHandle_t>}",
                             OI_CUDA_IPC_HANDLE_BYTES);
    out->handle_len = (size_t)n;
    return NULL;
}
