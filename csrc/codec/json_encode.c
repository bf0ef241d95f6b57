/* The V2 JSON codec's writers: inference responses and errors for the server, inference requests
 * for the client. Numbers are written by num.c. */
#include "json.h"
#include "json_internal.h"

#include "num.h"

#include <inttypes.h>
#include <string.h>

/* ---- Encoding ------------------------------------------------------------------------------ */

static char *put_lit(char *w, const char *s)
{
    size_t n = strlen(s);
    memcpy(w, s, n);
    return w + n;
}

static int append_lit(oi_sbuf_t *out, const char *s) { return oi_sbuf_append(out, s, strlen(s)); }

/* Room per element, its ',' included: what the number writers ask for (the longest text
 * are doubles such as -2.2250738585072014e-308 and 20-digit integers with a sign). */
#define ELEMENT_MAX (OI_NUM_ROOM + 1)
#define ELEMENT_BATCH 256

static oi_status_t *out_of_memory_status(void)
{
    return oi_status_new(OI_INTERNAL, "out of memory while encoding the response");
}

/* Writes elements [i, end) of t at w, each but element 0 after a ','. */
static char *put_elements(char *w, const oi_tensor_t *t, int64_t i, int64_t end)
{
    if (i > 0)
        *w++ = ',';
    if (t->dtype != OI_TYPE_BOOL)
        return oi_num_write_list(w, t->data + (size_t)i * oi_dtype_size(t->dtype), (size_t)(end - i), t->dtype, ',');
    for (int64_t j = i; j < end; j++) {
        if (j > i)
            *w++ = ',';
        w = put_lit(w, t->data[j] ? "true" : "false");
    }
    return w;
}

static oi_status_t *write_fixed_data(oi_sbuf_t *out, const oi_tensor_t *t, int64_t count)
{
    /* One reservation per batch keeps the per-element work to formatting. */
    for (int64_t i = 0; i < count; i += ELEMENT_BATCH) {
        int64_t end = count - i < ELEMENT_BATCH ? count : i + ELEMENT_BATCH;
        if (oi_sbuf_reserve(out, (size_t)(end - i) * ELEMENT_MAX) != 0)
            return out_of_memory_status();
        out->len = (size_t)(put_elements(out->data + out->len, t, i, end) - out->data);
    }
    return NULL;
}

static oi_status_t *write_bytes_data(oi_sbuf_t *out, const oi_tensor_t *t)
{
    size_t off = 0;
    for (int64_t i = 0; off < t->byte_size; i++) {
        size_t n = (size_t)oi__json_get_le(t->data + off, 4);
        const char *s = t->data + off + 4;
        off += 4 + n;
        if (!oi__json_utf8_valid(s, n))
            return oi_status_new(OI_BAD_REQUEST,
                                 "output '%.128s': BYTES element %" PRId64
                                 " is not valid UTF-8 and cannot be sent as JSON; request the output with \"binary_data\": true",
                                 t->name, i);
        if ((i > 0 && append_lit(out, ",") != 0) || oi_json_write_string(out, s, n) != 0)
            return out_of_memory_status();
    }
    return NULL;
}

/* An output written into a shared-memory region: its name, datatype and shape alone, as
 * tritonserver answers. The client named the region and knows where it asked for the bytes;
 * Triton's C++ client (perf_analyzer) reads any output `parameters` as binary data. */
static oi_status_t *write_shm_output(oi_sbuf_t *out, const oi_tensor_t *t, const char *name)
{
    char num[24];
    int r = append_lit(out, "{\"name\":") || oi_json_write_string(out, name, strlen(name)) ||
            append_lit(out, ",\"datatype\":\"") || append_lit(out, oi_dtype_name(t->dtype)) ||
            append_lit(out, "\",\"shape\":[");
    for (int i = 0; r == 0 && i < t->ndim; i++)
        r = (i && append_lit(out, ",")) ||
            oi_sbuf_append(out, num, (size_t)(oi_num_write_i64(num, t->shape[i]) - num));
    r = r || append_lit(out, "]}");
    return r ? out_of_memory_status() : NULL;
}

static oi_status_t *write_output(oi_sbuf_t *out, const oi_tensor_t *t, int binary)
{
    const char *name = t->name != NULL ? t->name : "";
    if (t->shm) /* checked before it was placed; its bytes may not even be on the host */
        return write_shm_output(out, t, name);
    /* A size that does not fit the shape is the model's fault, not the client's. */
    oi_status_t *st = oi_tensor_check_size(t, "output", name);
    if (st != NULL) {
        if (st->code == OI_BAD_REQUEST)
            st->code = OI_INTERNAL;
        return st;
    }
    int64_t count;
    oi_shape_elements(t->shape, t->ndim, &count);
    if (append_lit(out, "{\"name\":") != 0 || oi_json_write_string(out, name, strlen(name)) != 0 ||
        append_lit(out, ",\"datatype\":\"") != 0 || append_lit(out, oi_dtype_name(t->dtype)) != 0 ||
        append_lit(out, "\",\"shape\":[") != 0 ||
        oi_sbuf_reserve(out, (size_t)t->ndim * 21 + 64) != 0)
        return out_of_memory_status();
    char *w = out->data + out->len;
    for (int i = 0; i < t->ndim; i++) {
        if (i > 0)
            *w++ = ',';
        w = oi_num_write_i64(w, t->shape[i]);
    }
    *w++ = ']';
    if (binary) {
        w = put_lit(w, ",\"parameters\":{\"binary_data_size\":");
        w = oi_num_write_u64(w, t->byte_size);
        w = put_lit(w, "}}");
        out->len = (size_t)(w - out->data);
        return NULL;
    }
    w = put_lit(w, ",\"data\":[");
    out->len = (size_t)(w - out->data);
    st = t->dtype == OI_TYPE_BYTES ? write_bytes_data(out, t) : write_fixed_data(out, t, count);
    if (st == NULL && append_lit(out, "]}") != 0)
        st = out_of_memory_status();
    return st;
}

static oi_status_t *write_response(oi_sbuf_t *out, const char *model_name,
                                   const char *model_version, const oi_request_t *req,
                                   const oi_response_t *resp, const uint8_t *binary)
{
    const char *name = model_name != NULL ? model_name : "";
    if (append_lit(out, "{\"model_name\":") != 0 || oi_json_write_string(out, name, strlen(name)) != 0)
        return out_of_memory_status();
    if (model_version != NULL &&
        (append_lit(out, ",\"model_version\":") != 0 ||
         oi_json_write_string(out, model_version, strlen(model_version)) != 0))
        return out_of_memory_status();
    if (req != NULL && req->id != NULL &&
        (append_lit(out, ",\"id\":") != 0 || oi_json_write_string(out, req->id, req->id_len) != 0))
        return out_of_memory_status();
    if (resp->parameters != NULL && /* well-formed JSON: the backend's, sent as Triton's http_server.cc */
        (append_lit(out, ",\"parameters\":") != 0 ||
         oi_sbuf_append(out, resp->parameters->data, resp->parameters->len) != 0))
        return out_of_memory_status();
    if (append_lit(out, ",\"outputs\":[") != 0)
        return out_of_memory_status();
    for (uint32_t i = 0; i < resp->n_outputs; i++) {
        if (i > 0 && append_lit(out, ",") != 0)
            return out_of_memory_status();
        oi_status_t *st = write_output(out, &resp->outputs[i], binary != NULL && binary[i]);
        if (st != NULL)
            return st;
    }
    return append_lit(out, "]}") != 0 ? out_of_memory_status() : NULL;
}

oi_status_t *oi_json_encode_infer_response(oi_sbuf_t *out, const char *model_name,
                                           const char *model_version, const oi_request_t *req,
                                           const oi_response_t *resp, const uint8_t *binary)
{
    size_t mark = out->len;
    oi_status_t *st = write_response(out, model_name, model_version, req, resp, binary);
    if (st != NULL)
        out->len = mark;
    return st;
}

/* Appends `"name":"..."` style fields of one tensor's header: name, datatype, shape. */
static int write_tensor_head(oi_sbuf_t *out, const oi_tensor_t *t)
{
    char num[24];
    if (append_lit(out, "{\"name\":") != 0 || oi_json_write_string(out, t->name, strlen(t->name)) != 0 ||
        append_lit(out, ",\"datatype\":\"") != 0 || append_lit(out, oi_dtype_name(t->dtype)) != 0 ||
        append_lit(out, "\",\"shape\":[") != 0)
        return -1;
    for (int i = 0; i < t->ndim; i++)
        if ((i && append_lit(out, ",") != 0) ||
            oi_sbuf_append(out, num, (size_t)(oi_num_write_u64(num, (uint64_t)t->shape[i]) - num)) != 0)
            return -1;
    return append_lit(out, "]");
}

int oi_json_encode_infer_request(oi_sbuf_t *out, const oi_tensor_t *inputs, uint32_t n_inputs,
                                 const char *const *outputs, uint32_t n_outputs, const char *id,
                                 oi_slice_t parameters)
{
    size_t mark = out->len;
    char num[24];
    int r = append_lit(out, "{");
    if (r == 0 && id != NULL)
        r = append_lit(out, "\"id\":") || oi_json_write_string(out, id, strlen(id)) || append_lit(out, ",");
    if (r == 0 && parameters.ptr != NULL)
        r = append_lit(out, "\"parameters\":") || oi_sbuf_append(out, parameters.ptr, parameters.len) ||
            append_lit(out, ",");
    if (r == 0)
        r = append_lit(out, "\"inputs\":[");
    for (uint32_t i = 0; r == 0 && i < n_inputs; i++)
        r = (i && append_lit(out, ",")) || write_tensor_head(out, &inputs[i]) ||
            append_lit(out, ",\"parameters\":{\"binary_data_size\":") ||
            oi_sbuf_append(out, num, (size_t)(oi_num_write_u64(num, inputs[i].byte_size) - num)) || append_lit(out, "}}");
    if (r == 0)
        r = append_lit(out, "]");
    if (r == 0 && n_outputs > 0) {
        r = append_lit(out, ",\"outputs\":[");
        for (uint32_t i = 0; r == 0 && i < n_outputs; i++)
            r = (i && append_lit(out, ",")) || append_lit(out, "{\"name\":") ||
                oi_json_write_string(out, outputs[i], strlen(outputs[i])) ||
                append_lit(out, ",\"parameters\":{\"binary_data\":true}}");
        if (r == 0)
            r = append_lit(out, "]");
    }
    if (r == 0)
        r = append_lit(out, "}");
    if (r != 0)
        out->len = mark;
    return r ? -1 : 0;
}

int oi_json_output_is_binary(const oi_request_t *req, const char *output_name)
{
    for (uint32_t i = 0; i < req->n_outputs; i++)
        if (req->outputs[i].binary_data >= 0 && strcmp(req->outputs[i].name, output_name) == 0)
            return req->outputs[i].binary_data;
    return req->binary_data_output > 0;
}

int oi_json_encode_error(oi_sbuf_t *out, const char *message)
{
    size_t mark = out->len;
    if (append_lit(out, "{\"error\":") != 0 || oi_json_write_string(out, message, strlen(message)) != 0 ||
        append_lit(out, "}") != 0) {
        out->len = mark;
        return -1;
    }
    return 0;
}

int oi_json_write_string(oi_sbuf_t *out, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    if (oi_sbuf_reserve(out, n + 2) != 0)
        return -1;
    out->data[out->len++] = '"';
    while (p < end) {
        const unsigned char *run = p;
        while (p < end && oi__json_is_plain(*p))
            p++;
        if (p > run && oi_sbuf_append(out, run, (size_t)(p - run)) != 0)
            return -1;
        if (p == end)
            break;
        char esc[6] = {'\\', 0};
        size_t k = 2;
        if (*p >= 0x80) {
            size_t len = oi__json_utf8_len(p, (size_t)(end - p));
            if (len == 0 ? oi_sbuf_append(out, "\xef\xbf\xbd", 3) : oi_sbuf_append(out, p, len))
                return -1;
            p += len ? len : 1;
            continue;
        }
        switch (*p) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            memcpy(esc + 1, "u00", 3);
            esc[4] = hex[*p >> 4];
            esc[5] = hex[*p & 15];
            k = 6;
        }
        if (oi_sbuf_append(out, esc, k) != 0)
            return -1;
        p++;
    }
    return oi_sbuf_append(out, "\"", 1);
}
