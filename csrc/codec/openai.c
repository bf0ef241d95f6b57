#include "codec/openai.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codec/json.h"
#include "codec/json_internal.h"
#include "codec/num.h"
#include "codec/openai_logprobs.h"

/* Appends a string literal (its length counted by the compiler). */
#define LIT(out, s) oi_sbuf_append((out), (s), sizeof(s) - 1)

enum { FOR_COMPLETION = 1, FOR_CHAT = 2, FOR_BOTH = 3, FOR_EMBEDDING = 4, FOR_ALL = 7 };

typedef enum {
    F_MODEL,
    F_PROMPT,
    F_MESSAGES,
    F_STREAM,
    F_STREAM_OPTIONS,
    F_MAX_TOKENS,
    F_MAX_COMPLETION_TOKENS,
    F_SAMPLING_NUMBER, /* temperature, top_p, penalties: a number in a range */
    F_SEED,
    F_STOP,
    F_ONE,      /* n, best_of: 1 or null */
    F_ECHO,
    F_USER,
    F_LOGPROBS,      /* chat: logprobs, a boolean */
    F_LOGPROB_COUNT, /* a completion's logprobs, a chat's top_logprobs: alternatives per token */
    F_LOGIT_BIAS,  /* {} or null */
    F_INPUT,       /* embeddings: a string or an array of strings */
    F_ENCODING,    /* embeddings: "float" or "base64" */
    F_UNSUPPORTED, /* defined by OpenAI, not served here: null only */
} field_kind_t;

typedef struct field_s {
    const char *name;
    field_kind_t kind;
    unsigned kinds;
    double lo, hi; /* F_SAMPLING_NUMBER's and F_LOGPROB_COUNT's range */
} field_t;

static const field_t fields[] = {
    {"model", F_MODEL, FOR_ALL, 0, 0},
    {"input", F_INPUT, FOR_EMBEDDING, 0, 0},
    {"encoding_format", F_ENCODING, FOR_EMBEDDING, 0, 0},
    {"dimensions", F_UNSUPPORTED, FOR_EMBEDDING, 0, 0},
    {"prompt", F_PROMPT, FOR_COMPLETION, 0, 0},
    {"messages", F_MESSAGES, FOR_CHAT, 0, 0},
    {"stream", F_STREAM, FOR_BOTH, 0, 0},
    {"stream_options", F_STREAM_OPTIONS, FOR_BOTH, 0, 0},
    {"max_tokens", F_MAX_TOKENS, FOR_BOTH, 0, 0},
    {"max_completion_tokens", F_MAX_COMPLETION_TOKENS, FOR_CHAT, 0, 0},
    {"temperature", F_SAMPLING_NUMBER, FOR_BOTH, 0, 2},
    {"top_p", F_SAMPLING_NUMBER, FOR_BOTH, 0, 1},
    {"frequency_penalty", F_SAMPLING_NUMBER, FOR_BOTH, -2, 2},
    {"presence_penalty", F_SAMPLING_NUMBER, FOR_BOTH, -2, 2},
    {"seed", F_SEED, FOR_BOTH, 0, 0},
    {"stop", F_STOP, FOR_BOTH, 0, 0},
    {"n", F_ONE, FOR_BOTH, 0, 0},
    {"best_of", F_ONE, FOR_COMPLETION, 0, 0},
    {"echo", F_ECHO, FOR_COMPLETION, 0, 0},
    {"user", F_USER, FOR_ALL, 0, 0},
    {"logprobs", F_LOGPROBS, FOR_CHAT, 0, 0},
    {"logprobs", F_LOGPROB_COUNT, FOR_COMPLETION, 0, 5},
    {"top_logprobs", F_LOGPROB_COUNT, FOR_CHAT, 0, OI_OPENAI_MAX_TOP_LOGPROBS},
    {"logit_bias", F_LOGIT_BIAS, FOR_BOTH, 0, 0},
    {"suffix", F_UNSUPPORTED, FOR_COMPLETION, 0, 0},
    {"tools", F_UNSUPPORTED, FOR_CHAT, 0, 0},
    {"tool_choice", F_UNSUPPORTED, FOR_CHAT, 0, 0},
    {"parallel_tool_calls", F_UNSUPPORTED, FOR_CHAT, 0, 0},
    {"functions", F_UNSUPPORTED, FOR_CHAT, 0, 0},
    {"function_call", F_UNSUPPORTED, FOR_CHAT, 0, 0},
    {"response_format", F_UNSUPPORTED, FOR_CHAT, 0, 0},
    {"modalities", F_UNSUPPORTED, FOR_CHAT, 0, 0},
    {"audio", F_UNSUPPORTED, FOR_CHAT, 0, 0},
    {"prediction", F_UNSUPPORTED, FOR_CHAT, 0, 0},
    {"reasoning_effort", F_UNSUPPORTED, FOR_CHAT, 0, 0},
    {"web_search_options", F_UNSUPPORTED, FOR_CHAT, 0, 0},
    {"store", F_UNSUPPORTED, FOR_CHAT, 0, 0},
    {"metadata", F_UNSUPPORTED, FOR_CHAT, 0, 0},
    {"service_tier", F_UNSUPPORTED, FOR_BOTH, 0, 0},
};

typedef struct parse_s {
    cursor_t c;
    oi_openai_request_t *out;
    const field_t *f; /* the member being read */
    int saw_model, saw_prompt, saw_messages, saw_stream_options, saw_max_completion, saw_input, saw_top_logprobs;
} parse_t;

static oi_status_t *oom(void) { return oi_status_new(OI_INTERNAL, "out of memory"); }

/* A 400 naming `param`. */
static oi_status_t *invalid(parse_t *p, const char *param, const char *fmt, const char *a, const char *b)
{
    size_t n = strnlen(param, sizeof(p->out->param) - 1); /* a long unknown key: its start */
    memcpy(p->out->param, param, n);
    p->out->param[n] = '\0';
    char msg[512];
    snprintf(msg, sizeof(msg), fmt, a, b);
    return oi_status_new(OI_BAD_REQUEST, "%s", msg);
}

/* What the value at the cursor is, for messages. */
static const char *kind_of(int ch)
{
    switch (ch) {
    case '"': return "a string";
    case '{': return "an object";
    case '[': return "an array";
    case 't': case 'f': return "a boolean";
    case 'n': return "null";
    default: return "a number";
    }
}

static oi_status_t *wrong_type(parse_t *p, const char *expected)
{
    return invalid(p, p->f->name, "Invalid type for '%s': expected %s.", p->f->name, expected);
}

/* The cursor's value, passed over; its text in *text. -1 on malformed JSON (c.err set). */
static int take_value(parse_t *p, oi_slice_t *text)
{
    char *at = p->c.p;
    if (oi__json_skip_value(&p->c) != 0)
        return -1;
    *text = (oi_slice_t){at, (size_t)(p->c.p - at)};
    return 0;
}

/* A string value decoded and appended to `to`. */
static oi_status_t *read_string(parse_t *p, oi_sbuf_t *to)
{
    if (oi__json_peek(&p->c) != '"')
        return wrong_type(p, "a string");
    char *raw;
    size_t len;
    int escaped;
    if (oi__json_scan_string(&p->c, &raw, &len, &escaped) != 0)
        return NULL; /* c.err says why */
    if (oi_sbuf_reserve(to, len + 1) != 0)
        return oom();
    to->len += escaped ? oi__json_unescape(to->data + to->len, raw, len) : (memcpy(to->data + to->len, raw, len), len);
    return NULL;
}

/* A finite JSON number into *v. */
static oi_status_t *read_number(parse_t *p, double *v, const char *expected)
{
    int ch = oi__json_peek(&p->c);
    if (!oi__json_is_number_start(ch) || ch == 'N' || ch == 'I')
        return wrong_type(p, expected);
    oi_slice_t t;
    if (take_value(p, &t) != 0)
        return NULL;
    char text[64];
    if (t.len >= sizeof(text))
        return wrong_type(p, expected);
    memcpy(text, t.ptr, t.len);
    text[t.len] = '\0';
    uint64_t bits = oi_num_parse_exact(text, OI_TYPE_FP64);
    memcpy(v, &bits, sizeof(*v));
    if (!isfinite(*v))
        return invalid(p, p->f->name, "Invalid '%s': %s is out of range.", p->f->name, text);
    return NULL;
}

static oi_status_t *read_integer(parse_t *p, double *v)
{
    oi_status_t *st = read_number(p, v, "an integer");
    if (st == NULL && p->c.err == NULL && (*v != floor(*v) || fabs(*v) > 9007199254740992.0))
        st = wrong_type(p, "an integer");
    return st;
}

static oi_status_t *read_bool(parse_t *p, int *v)
{
    int ch = oi__json_peek(&p->c);
    if (ch != 't' && ch != 'f')
        return wrong_type(p, "a boolean");
    oi_slice_t t;
    if (take_value(p, &t) == 0)
        *v = ch == 't';
    return NULL;
}

/* A number within the field's range. */
static oi_status_t *in_range(parse_t *p, double v)
{
    if (v >= p->f->lo && v <= p->f->hi)
        return NULL;
    char range[64];
    snprintf(range, sizeof(range), "from %g to %g", p->f->lo, p->f->hi);
    return invalid(p, p->f->name, "Invalid '%s': expected a value %s.", p->f->name, range);
}

/* Adds "name":<value text> to the sampling parameters. */
static oi_status_t *add_sampling(parse_t *p, const char *name, oi_slice_t value)
{
    oi_sbuf_t *s = &p->out->sampling;
    if (p->out->sampling_first == NULL)
        p->out->sampling_first = p->f->name;
    int bad = oi_sbuf_append(s, s->len ? "," : "{", 1) || oi_json_write_string(s, name, strlen(name)) ||
              LIT(s, ":") || oi_sbuf_append(s, value.ptr, value.len);
    return bad ? oom() : NULL;
}

/* max_tokens and max_completion_tokens: a positive count. */
static oi_status_t *read_max_tokens(parse_t *p)
{
    double v;
    oi_status_t *st = read_integer(p, &v);
    if (st != NULL || p->c.err != NULL)
        return st;
    if (v < 1 || v > 2147483647.0)
        return invalid(p, p->f->name, "Invalid '%s': expected a value from 1 to 2147483647, got %s.", p->f->name,
                       v < 1 ? "less" : "more");
    if (p->f->kind == F_MAX_TOKENS && p->saw_max_completion)
        return NULL; /* max_completion_tokens wins, as it replaces max_tokens in OpenAI's API */
    p->saw_max_completion |= p->f->kind == F_MAX_COMPLETION_TOKENS;
    p->out->max_tokens = (int64_t)v; /* written once the body is read: either field may come first */
    return NULL;
}

/* "stop": a string or up to 4 strings. */
static oi_status_t *read_stop(parse_t *p)
{
    char *at = p->c.p;
    int ch = oi__json_peek(&p->c);
    oi_sbuf_t scratch = {0};
    oi_status_t *st = NULL;
    if (ch == '[') {
        uint32_t n = 0;
        int r;
        if (oi__json_enter(&p->c, '[') != 0)
            return NULL;
        while (st == NULL && (r = oi__json_next_element(&p->c, &n)) == 1) {
            if (n > 4)
                st = invalid(p, "stop", "Invalid '%s': expected at most 4 sequences%s.", "stop", "");
            else
                st = read_string(p, &scratch);
            if (p->c.err != NULL)
                break;
        }
    } else if (ch == '"') {
        st = read_string(p, &scratch);
    } else {
        st = wrong_type(p, "a string or an array of strings");
    }
    oi_sbuf_free(&scratch);
    if (st != NULL || p->c.err != NULL)
        return st;
    return add_sampling(p, "stop", (oi_slice_t){at, (size_t)(p->c.p - at)});
}

/* "prompt": one string (a list of one string is the same; more, or token ids, are not served). */
static oi_status_t *read_prompt(parse_t *p)
{
    p->saw_prompt = 1;
    if (oi__json_peek(&p->c) != '[')
        return read_string(p, &p->out->prompt);
    uint32_t n = 0;
    int r;
    oi_status_t *st = NULL;
    if (oi__json_enter(&p->c, '[') != 0)
        return NULL;
    while (st == NULL && p->c.err == NULL && (r = oi__json_next_element(&p->c, &n)) == 1) {
        if (n > 1 || oi__json_peek(&p->c) != '"')
            return invalid(p, "prompt",
                           "Invalid '%s': only one string prompt per request is served (a batch of prompts or "
                           "token ids is not)%s.", "prompt", "");
        st = read_string(p, &p->out->prompt);
    }
    if (st == NULL && p->c.err == NULL && n == 0)
        return invalid(p, "prompt", "Invalid '%s': the list of prompts is empty%s.", "prompt", "");
    return st;
}

/* Embeddings' "input": a string or a non-empty array of strings (token ids are not served). */
static oi_status_t *read_input(parse_t *p)
{
    p->saw_input = 1;
    char *at = p->c.p;
    oi_sbuf_t scratch = {0};
    oi_status_t *st = NULL;
    uint32_t n = 0;
    if (oi__json_peek(&p->c) == '[') {
        int r;
        if (oi__json_enter(&p->c, '[') != 0)
            return NULL;
        while (st == NULL && p->c.err == NULL && (r = oi__json_next_element(&p->c, &n)) == 1)
            st = oi__json_peek(&p->c) == '"' ? read_string(p, &scratch)
                                             : invalid(p, "input", "Invalid '%s': only strings are served (token "
                                                       "ids are not)%s.", "input", "");
        if (st == NULL && p->c.err == NULL && n == 0)
            st = invalid(p, "input", "Invalid '%s': empty array. Expected an array with minimum length 1%s.", "input",
                         "");
    } else {
        st = read_string(p, &scratch);
        n = 1;
    }
    oi_sbuf_free(&scratch);
    if (st == NULL && p->c.err == NULL) {
        p->out->input = (oi_slice_t){at, (size_t)(p->c.p - at)};
        p->out->n_inputs = n;
    }
    return st;
}

static oi_status_t *read_stream_options(parse_t *p)
{
    p->saw_stream_options = 1;
    if (oi__json_peek(&p->c) != '{')
        return wrong_type(p, "an object");
    short_str_t k;
    uint32_t n = 0;
    int r;
    if (oi__json_enter(&p->c, '{') != 0)
        return NULL;
    while ((r = oi__json_next_member(&p->c, &n, &k)) == 1) {
        if (!oi__json_str_is(&k, "include_usage")) {
            char name[160];
            snprintf(name, sizeof(name), "stream_options.%.*s", (int)(k.n > 128 ? 128 : k.n), k.s);
            return invalid(p, "stream_options", "Unrecognized request argument supplied: %s%s", name, "");
        }
        const field_t *outer = p->f;
        static const field_t inner = {"stream_options.include_usage", F_STREAM_OPTIONS, FOR_BOTH, 0, 0};
        p->f = &inner;
        oi_status_t *st = read_bool(p, &p->out->include_usage);
        p->f = outer;
        if (st != NULL)
            return st;
    }
    return NULL;
}

/* Values that must say "nothing": 1 (n, best_of), {} (logit_bias). */
static oi_status_t *read_neutral(parse_t *p)
{
    oi_slice_t t;
    int ch = oi__json_peek(&p->c);
    if (take_value(p, &t) != 0)
        return NULL;
    int neutral = p->f->kind == F_ONE         ? t.len == 1 && t.ptr[0] == '1'
                  : p->f->kind == F_LOGIT_BIAS ? ch == '{' && t.len >= 2 && strspn(t.ptr + 1, " \t\r\n") == t.len - 2
                                               : 0;
    if (neutral)
        return NULL;
    const char *why = p->f->kind == F_ONE          ? "only 1 is served: each request gives one choice"
                      : p->f->kind == F_LOGIT_BIAS ? "the served models take no logit bias"
                                                   : "it is not supported by this server";
    return invalid(p, p->f->name, "Unsupported value for '%s': %s.", p->f->name, why);
}

static oi_status_t *read_member(parse_t *p)
{
    oi_openai_request_t *out = p->out;
    double v;
    oi_slice_t t;
    char *at = p->c.p;
    oi_status_t *st = NULL;
    switch (p->f->kind) {
    case F_MODEL: {
        oi_sbuf_t name = {0};
        p->saw_model = 1;
        st = read_string(p, &name);
        if (st == NULL && p->c.err == NULL && (name.len == 0 || name.len >= sizeof(out->model) ||
                                                memchr(name.data, '\0', name.len) != NULL))
            st = invalid(p, "model", "Invalid '%s': expected a model name of 1 to 255 bytes%s.", "model", "");
        else if (st == NULL && p->c.err == NULL) {
            memcpy(out->model, name.data, name.len);
            out->model[name.len] = '\0';
        }
        oi_sbuf_free(&name);
        return st;
    }
    case F_PROMPT:
        return read_prompt(p);
    case F_MESSAGES:
        p->saw_messages = 1;
        if (oi__json_peek(&p->c) != '[')
            return wrong_type(p, "an array of messages");
        if (take_value(p, &t) == 0) {
            out->messages = t;
            if (strspn(t.ptr + 1, " \t\r\n") == t.len - 2)
                return invalid(p, "messages", "Invalid '%s': empty array. Expected an array with minimum length 1%s.",
                               "messages", "");
        }
        return NULL;
    case F_STREAM:
        return read_bool(p, &out->stream);
    case F_STREAM_OPTIONS:
        return read_stream_options(p);
    case F_MAX_TOKENS:
    case F_MAX_COMPLETION_TOKENS:
        return read_max_tokens(p);
    case F_SAMPLING_NUMBER:
        st = read_number(p, &v, "a number");
        if (st == NULL && p->c.err == NULL)
            st = in_range(p, v);
        break;
    case F_SEED:
        st = read_integer(p, &v);
        break;
    case F_STOP:
        return read_stop(p);
    case F_ECHO:
        return read_bool(p, &out->echo);
    case F_LOGPROBS:
        return read_bool(p, &out->logprobs);
    case F_LOGPROB_COUNT:
        st = read_integer(p, &v);
        if (st == NULL && p->c.err == NULL && (st = in_range(p, v)) == NULL) {
            out->top_logprobs = (int)v;
            out->logprobs |= out->kind == OI_OPENAI_COMPLETION; /* a completion's count asks for them */
            p->saw_top_logprobs = 1;
        }
        return st;
    case F_INPUT:
        return read_input(p);
    case F_ENCODING: {
        oi_sbuf_t format = {0};
        st = read_string(p, &format);
        int is_float = format.len == 5 && memcmp(format.data, "float", 5) == 0;
        out->base64 = format.len == 6 && memcmp(format.data, "base64", 6) == 0;
        oi_sbuf_free(&format);
        if (st == NULL && p->c.err == NULL && !is_float && !out->base64)
            st = invalid(p, "encoding_format", "Invalid '%s': expected 'float' or 'base64'%s.", "encoding_format", "");
        return st;
    }
    case F_USER: { /* for OpenAI's abuse monitoring: nothing to do with it here */
        oi_sbuf_t user = {0};
        st = read_string(p, &user);
        oi_sbuf_free(&user);
        return st;
    }
    case F_ONE:
    case F_LOGIT_BIAS:
    case F_UNSUPPORTED:
        if (p->f->kind == F_UNSUPPORTED) {
            take_value(p, &t);
            return p->c.err ? NULL
                            : invalid(p, p->f->name, "Unsupported parameter: '%s' is not supported by this server%s.",
                                      p->f->name, "");
        }
        return read_neutral(p);
    }
    if (st != NULL || p->c.err != NULL)
        return st;
    return add_sampling(p, p->f->name, (oi_slice_t){at, (size_t)(p->c.p - at)});
}

static const field_t *find_field(const short_str_t *k, oi_openai_kind_t kind)
{
    unsigned bit = kind == OI_OPENAI_CHAT ? FOR_CHAT : kind == OI_OPENAI_EMBEDDING ? FOR_EMBEDDING : FOR_COMPLETION;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        if ((fields[i].kinds & bit) && oi__json_str_is(k, fields[i].name))
            return &fields[i];
    return NULL;
}

/* What the body must have once read. */
static oi_status_t *check_whole(parse_t *p)
{
    oi_openai_request_t *out = p->out;
    if (!p->saw_model)
        return invalid(p, "model", "you must provide a model parameter%s%s", "", "");
    if (out->kind == OI_OPENAI_CHAT && !p->saw_messages)
        return invalid(p, "messages", "Missing required parameter: '%s'.%s", "messages", "");
    if (out->kind == OI_OPENAI_COMPLETION && !p->saw_prompt)
        return invalid(p, "prompt", "Missing required parameter: '%s'.%s", "prompt", "");
    if (out->kind == OI_OPENAI_EMBEDDING && !p->saw_input)
        return invalid(p, "input", "Missing required parameter: '%s'.%s", "input", "");
    if (p->saw_stream_options && !out->stream)
        return invalid(p, "stream_options",
                       "The '%s' parameter is only allowed when 'stream' is enabled.%s", "stream_options", "");
    if (out->kind == OI_OPENAI_CHAT && p->saw_top_logprobs && !out->logprobs)
        return invalid(p, "top_logprobs", "`%s` can only be used when `logprobs` is True%s", "top_logprobs", "");
    if (out->logprobs && out->echo)
        return invalid(p, "echo", "Unsupported parameter: '%s' with 'logprobs': the models give no log probabilities "
                       "of the prompt%s.", "echo", "");
    if (out->logprobs) { /* vLLM's count: the likeliest alternatives besides the sampled token */
        char k[16];
        snprintf(k, sizeof(k), "%d", out->top_logprobs);
        static const field_t logprobs = {"logprobs", F_LOGPROBS, FOR_BOTH, 0, 0};
        p->f = &logprobs;
        if (add_sampling(p, "logprobs", (oi_slice_t){k, strlen(k)}) != NULL)
            return oom();
    }
    if (out->max_tokens > 0) {
        char n[24];
        snprintf(n, sizeof(n), "%lld", (long long)out->max_tokens);
        static const field_t max_tokens = {"max_tokens", F_MAX_TOKENS, FOR_BOTH, 0, 0};
        p->f = &max_tokens;
        if (add_sampling(p, "max_tokens", (oi_slice_t){n, strlen(n)}) != NULL)
            return oom();
    }
    if (out->sampling.len > 0 && LIT(&out->sampling, "}") != 0)
        return oom();
    return NULL;
}

oi_status_t *oi_openai_parse(const char *json, size_t len, oi_openai_kind_t kind, oi_openai_request_t *out)
{
    out->kind = kind;
    parse_t p = {.c = {.base = (char *)json, .p = (char *)json, .end = (char *)json + len, .max_depth = 64},
                 .out = out};
    oi_status_t *st = NULL;
    short_str_t k;
    uint32_t n = 0;
    int r = 0;
    int first = oi__json_peek(&p.c);
    if (first != '{')
        return oi_status_new(OI_BAD_REQUEST, "We could not parse the JSON body of your request: expected a JSON "
                             "object, got %s.", first < 0 ? "nothing" : kind_of(first));
    if (oi__json_enter(&p.c, '{') == 0) {
        while (st == NULL && p.c.err == NULL && (r = oi__json_next_member(&p.c, &n, &k)) == 1) {
            p.f = find_field(&k, kind);
            if (p.f == NULL) {
                char name[160];
                snprintf(name, sizeof(name), "%.*s", (int)(k.n > 128 ? 128 : k.n), k.s);
                st = invalid(&p, name, "Unrecognized request argument supplied: %s%s", name, "");
            } else if (oi__json_peek(&p.c) == 'n' && p.f->kind != F_MODEL) {
                oi_slice_t t;
                take_value(&p, &t); /* null: as if not given, as OpenAI's SDK reads it */
            } else {
                st = read_member(&p);
            }
        }
        if (st == NULL && p.c.err == NULL && oi__json_peek(&p.c) != -1)
            st = oi_status_new(OI_BAD_REQUEST, "We could not parse the JSON body of your request: bytes follow the "
                                               "JSON object at byte %zu", (size_t)(p.c.p - json));
    }
    if (st == NULL && p.c.err != NULL) {
        out->param[0] = '\0';
        st = oi_status_new(OI_BAD_REQUEST, "We could not parse the JSON body of your request: %s", p.c.err->message);
    }
    oi_status_free(p.c.err);
    if (st == NULL)
        st = check_whole(&p);
    return st;
}

void oi_openai_request_free(oi_openai_request_t *req)
{
    oi_sbuf_free(&req->prompt);
    oi_sbuf_free(&req->sampling);
}

/* ---- answers ------------------------------------------------------------------------------ */

static int write_nullable(oi_sbuf_t *out, const char *s)
{
    return s != NULL && s[0] != '\0' ? oi_json_write_string(out, s, strlen(s)) : LIT(out, "null");
}

int oi_openai_encode_error(oi_sbuf_t *out, const char *message, const char *type, const char *param, const char *code)
{
    return LIT(out, "{\"error\":{\"message\":") || oi_json_write_string(out, message, strlen(message)) ||
           LIT(out, ",\"type\":") || oi_json_write_string(out, type, strlen(type)) ||
           LIT(out, ",\"param\":") || write_nullable(out, param) ||
           LIT(out, ",\"code\":") || write_nullable(out, code) || LIT(out, "}}")
               ? -1
               : 0;
}

/* {"id":..,"object":..,"created":..,"model":.., (once per chunk: appends, no printf) */
static int write_head(oi_sbuf_t *out, const oi_openai_meta_t *m, const char *object)
{
    char created[OI_NUM_ROOM];
    return LIT(out, "{\"id\":") || oi_json_write_string(out, m->id, strlen(m->id)) ||
           LIT(out, ",\"object\":\"") || oi_sbuf_append(out, object, strlen(object)) || LIT(out, "\",\"created\":") ||
           oi_sbuf_append(out, created, (size_t)(oi_num_write_i64(created, m->created) - created)) ||
           LIT(out, ",\"model\":") || oi_json_write_string(out, m->model, strlen(m->model)) || LIT(out, ",");
}

static int write_usage(oi_sbuf_t *out, const oi_openai_meta_t *m)
{
    if (m->prompt_tokens < 0 || m->completion_tokens < 0)
        return LIT(out, "\"usage\":null");
    return oi_sbuf_printf(out, "\"usage\":{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,\"total_tokens\":%lld}",
                          (long long)m->prompt_tokens, (long long)m->completion_tokens,
                          (long long)(m->prompt_tokens + m->completion_tokens));
}

/* One choice's text: chat's under a message or delta, a completion's as "text". */
static int write_choice(oi_sbuf_t *out, const oi_openai_meta_t *m, const char *key, const char *text, size_t len,
                        const oi_openai_logprobs_t *lp, int role, const char *finish_reason)
{
    int bad = LIT(out, "{\"index\":0,");
    if (m->kind == OI_OPENAI_CHAT)
        bad = bad || LIT(out, "\"") || oi_sbuf_append(out, key, strlen(key)) || LIT(out, "\":{") ||
              (role && LIT(out, "\"role\":\"assistant\",")) || LIT(out, "\"content\":") ||
              oi_json_write_string(out, text, len) || LIT(out, "}");
    else
        bad = bad || LIT(out, "\"text\":") || oi_json_write_string(out, text, len);
    return bad || LIT(out, ",\"logprobs\":") || oi_openai_logprobs_write(out, lp) ||
           LIT(out, ",\"finish_reason\":") || write_nullable(out, finish_reason) || LIT(out, "}");
}

static const char *chunk_object(const oi_openai_meta_t *m)
{
    return m->kind == OI_OPENAI_CHAT ? "chat.completion.chunk" : "text_completion";
}

int oi_openai_encode_chunk(oi_sbuf_t *out, const oi_openai_meta_t *m, const char *text, size_t text_len,
                           const oi_openai_logprobs_t *lp, int first, const char *finish_reason, int with_usage)
{
    return LIT(out, "data: ") || write_head(out, m, chunk_object(m)) ||
           LIT(out, "\"choices\":[") ||
           write_choice(out, m, "delta", text, text_len, lp, first, finish_reason) || LIT(out, "]") ||
           (with_usage && LIT(out, ",\"usage\":null")) || LIT(out, "}\n\n")
               ? -1
               : 0;
}

int oi_openai_encode_usage_chunk(oi_sbuf_t *out, const oi_openai_meta_t *m)
{
    return LIT(out, "data: ") || write_head(out, m, chunk_object(m)) ||
           LIT(out, "\"choices\":[],") || write_usage(out, m) || LIT(out, "}\n\n")
               ? -1
               : 0;
}

static int write_base64(oi_sbuf_t *out, const unsigned char *b, size_t n)
{
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (oi_sbuf_reserve(out, (n + 2) / 3 * 4 + 2) != 0)
        return -1;
    char *w = out->data + out->len;
    *w++ = '"';
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < n ? b[i + 2] : 0);
        *w++ = alphabet[v >> 18 & 63];
        *w++ = alphabet[v >> 12 & 63];
        *w++ = i + 1 < n ? alphabet[v >> 6 & 63] : '=';
        *w++ = i + 2 < n ? alphabet[v & 63] : '=';
    }
    *w++ = '"';
    out->len = (size_t)(w - out->data);
    return 0;
}

int oi_openai_encode_embeddings(oi_sbuf_t *out, const char *model, const char *data, size_t n, size_t dim,
                                int base64, int64_t prompt_tokens)
{
    int bad = LIT(out, "{\"object\":\"list\",\"data\":[");
    for (size_t i = 0; i < n && !bad; i++) {
        const char *row = data + i * dim * 4;
        bad = oi_sbuf_printf(out, "%s{\"object\":\"embedding\",\"index\":%zu,\"embedding\":", i ? "," : "", i);
        if (!bad && base64) {
            bad = write_base64(out, (const unsigned char *)row, dim * 4);
        } else if (!bad) {
            bad = oi_sbuf_reserve(out, dim * 24 + 2); /* a float's shortest decimal fits 24 bytes */
            if (!bad) {
                char *w = out->data + out->len;
                *w++ = '[';
                for (size_t j = 0; j < dim; j++) {
                    uint32_t bits;
                    memcpy(&bits, row + j * 4, 4);
                    if (j)
                        *w++ = ',';
                    w = oi_num_write_f32(w, bits);
                }
                *w++ = ']';
                out->len = (size_t)(w - out->data);
            }
        }
        bad = bad || LIT(out, "}");
    }
    bad = bad || LIT(out, "],\"model\":") || oi_json_write_string(out, model, strlen(model));
    if (prompt_tokens >= 0)
        bad = bad || oi_sbuf_printf(out, ",\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}",
                                    (long long)prompt_tokens, (long long)prompt_tokens);
    else
        bad = bad || LIT(out, ",\"usage\":null}");
    return bad ? -1 : 0;
}

int oi_openai_encode_completion(oi_sbuf_t *out, const oi_openai_meta_t *m, const char *text, size_t text_len,
                                const oi_openai_logprobs_t *lp, const char *finish_reason)
{
    const char *object = m->kind == OI_OPENAI_CHAT ? "chat.completion" : "text_completion";
    return write_head(out, m, object) || LIT(out, "\"choices\":[") ||
           write_choice(out, m, "message", text, text_len, lp, 1, finish_reason) || LIT(out, "],") ||
           write_usage(out, m) || LIT(out, "}")
               ? -1
               : 0;
}
