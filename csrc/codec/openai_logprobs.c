#include "codec/openai_logprobs.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codec/json.h"
#include "codec/json_internal.h"
#include "codec/num.h"

/* Appends a string literal (its length counted by the compiler). */
#define LIT(out, s) oi_sbuf_append((out), (s), sizeof(s) - 1)

/* The lowest log probability written: what OpenAI's API and vLLM write for -Infinity. */
#define FLOOR_LOGPROB (-9999.0)

/* One token of a position's object, borrowed from the model's text. */
typedef struct candidate_s {
    const char *token; /* decoded_token's JSON text, inside its quotes; NULL: none given */
    size_t token_len;
    int escaped;
    char id[32];       /* its key, the token id: named when the text is missing */
    double logprob;
    int64_t rank;      /* 1 is the likeliest; INT64_MAX when not given */
    uint32_t index;    /* its place in the object: vLLM writes the sampled token first */
} candidate_t;

/* One new token: the sampled one and the likeliest, by rank. */
typedef struct position_s {
    candidate_t sampled;
    candidate_t best[OI_OPENAI_MAX_TOP_LOGPROBS];
    int n_best;
} position_t;

typedef struct reader_s {
    cursor_t c;
    uint32_t token;  /* the token being read, from 1; 0 before the first */
    char what[128];  /* what is wrong, when the JSON is well-formed but not the format */
} reader_t;

static int fail(reader_t *rd, const char *what)
{
    snprintf(rd->what, sizeof(rd->what), "%s", what);
    return -1;
}

/* A number, or Python json's NaN, Infinity and -Infinity (vLLM's -inf logprobs). */
static int read_double(reader_t *rd, double *v, const char *what)
{
    static const char *const special[] = {"-Infinity", "Infinity", "NaN"};
    cursor_t *c = &rd->c;
    int ch = oi__json_peek(c);
    for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++) {
        size_t k = strlen(special[i]);
        if ((size_t)(c->end - c->p) >= k && memcmp(c->p, special[i], k) == 0) {
            c->p += k;
            *v = i == 0 ? -INFINITY : i == 1 ? INFINITY : NAN;
            return 0;
        }
    }
    if (ch < 0 || !oi__json_is_number_start(ch))
        return fail(rd, what);
    char *at = c->p;
    if (oi__json_skip_value(c) != 0)
        return -1;
    char text[64];
    size_t n = (size_t)(c->p - at);
    if (n >= sizeof(text))
        return fail(rd, what);
    memcpy(text, at, n);
    text[n] = '\0';
    uint64_t bits = oi_num_parse_exact(text, OI_TYPE_FP64);
    memcpy(v, &bits, sizeof(*v));
    return 0;
}

/* {"logprob": -0.5, "rank": 1, "decoded_token": "a"}: logprob required, the rest optional
 * (null allowed), other members passed over. */
static int read_candidate(reader_t *rd, candidate_t *cand)
{
    cursor_t *c = &rd->c;
    short_str_t k;
    uint32_t n = 0;
    int r, saw_logprob = 0;
    cand->rank = INT64_MAX;
    if (oi__json_peek(c) != '{')
        return fail(rd, "a token's value is not an object");
    if (oi__json_enter(c, '{') != 0)
        return -1;
    while ((r = oi__json_next_member(c, &n, &k)) == 1) {
        int ch = oi__json_peek(c);
        double v;
        if (oi__json_str_is(&k, "logprob")) {
            if (read_double(rd, &cand->logprob, "\"logprob\" is not a number") != 0)
                return -1;
            if (isnan(cand->logprob) || cand->logprob == INFINITY)
                return fail(rd, "\"logprob\" is NaN or Infinity");
            saw_logprob = 1;
        } else if (oi__json_str_is(&k, "rank") && ch != 'n') {
            if (read_double(rd, &v, "\"rank\" is not a number") != 0)
                return -1;
            if (!(v >= 1 && v < 9007199254740992.0) || v != floor(v))
                return fail(rd, "\"rank\" is not an integer of at least 1");
            cand->rank = (int64_t)v;
        } else if (oi__json_str_is(&k, "decoded_token") && ch != 'n') {
            char *raw;
            if (ch != '"')
                return fail(rd, "\"decoded_token\" is not a string");
            if (oi__json_scan_string(c, &raw, &cand->token_len, &cand->escaped) != 0)
                return -1;
            cand->token = raw;
        } else if (oi__json_skip_value(c) != 0) {
            return -1;
        }
    }
    if (r < 0)
        return -1;
    return saw_logprob ? 0 : fail(rd, "a token has no \"logprob\"");
}

/* Keeps the `top` lowest ranks in pos->best, in order (equal ranks in the model's order). */
static void keep_if_best(position_t *pos, const candidate_t *cand, int top)
{
    int at = pos->n_best;
    while (at > 0 && pos->best[at - 1].rank > cand->rank)
        at--;
    if (at >= top)
        return;
    int last = pos->n_best < top ? pos->n_best : top - 1; /* the full list's last falls off */
    memmove(&pos->best[at + 1], &pos->best[at], (size_t)(last - at) * sizeof(*cand));
    pos->best[at] = *cand;
    if (pos->n_best < top)
        pos->n_best++;
}

/* {"<token id>": {...}, ...}: the sampled token first. */
static int read_position(reader_t *rd, position_t *pos, int top)
{
    cursor_t *c = &rd->c;
    short_str_t k;
    uint32_t n = 0;
    int r;
    if (oi__json_peek(c) != '{')
        return fail(rd, "not an object of tokens");
    if (oi__json_enter(c, '{') != 0)
        return -1;
    while ((r = oi__json_next_member(c, &n, &k)) == 1) {
        candidate_t cand = {.index = n - 1};
        memcpy(cand.id, k.s, k.n < sizeof(cand.id) ? k.n : sizeof(cand.id) - 1); /* NUL-ended: zeroed */
        if (read_candidate(rd, &cand) != 0)
            return -1;
        if (cand.index == 0)
            pos->sampled = cand;
        keep_if_best(pos, &cand, top);
    }
    if (r < 0)
        return -1;
    return n > 0 ? 0 : fail(rd, "no tokens");
}

/* ---- OpenAI's shapes ----------------------------------------------------------------------- */

/* The candidate's text into `text` (vLLM's "token_id:ID" for one given without). */
static int token_text(const candidate_t *cand, oi_sbuf_t *text)
{
    text->len = 0;
    if (cand->token == NULL)
        return oi_sbuf_printf(text, "token_id:%s", cand->id);
    if (oi_sbuf_reserve(text, cand->token_len + 1) != 0)
        return -1;
    if (cand->escaped) {
        text->len = oi__json_unescape(text->data, cand->token, cand->token_len);
    } else {
        memcpy(text->data, cand->token, cand->token_len);
        text->len = cand->token_len;
    }
    return 0;
}

static int write_logprob(oi_sbuf_t *out, double v)
{
    if (v < FLOOR_LOGPROB)
        v = FLOOR_LOGPROB;
    if (oi_sbuf_reserve(out, OI_NUM_ROOM) != 0)
        return -1;
    uint64_t bits;
    memcpy(&bits, &v, sizeof(bits));
    out->len = (size_t)(oi_num_write_f64(out->data + out->len, bits) - out->data);
    return 0;
}

/* "token":..,"logprob":..,"bytes":[..] (null for a token given without its text). */
static int write_token_fields(oi_sbuf_t *out, const candidate_t *cand, oi_sbuf_t *text)
{
    if (token_text(cand, text) != 0 || LIT(out, "\"token\":") || oi_json_write_string(out, text->data, text->len) ||
        LIT(out, ",\"logprob\":") || write_logprob(out, cand->logprob) || LIT(out, ",\"bytes\":"))
        return -1;
    if (cand->token == NULL)
        return LIT(out, "null");
    if (oi_sbuf_reserve(out, text->len * 4 + OI_NUM_ROOM) != 0) /* ",255" each */
        return -1;
    char *w = out->data + out->len;
    *w++ = '[';
    for (size_t i = 0; i < text->len; i++) {
        if (i > 0)
            *w++ = ',';
        w = oi_num_write_u64(w, (unsigned char)text->data[i]);
    }
    *w++ = ']';
    out->len = (size_t)(w - out->data);
    return 0;
}

/* A chat's content item: the sampled token, and the `top` likeliest as its top_logprobs. */
static int write_chat_token(oi_openai_logprobs_t *lp, const position_t *pos, oi_sbuf_t *text)
{
    oi_sbuf_t *o = &lp->items;
    int bad = (lp->n > 0 && LIT(o, ",")) || LIT(o, "{") || write_token_fields(o, &pos->sampled, text) ||
              LIT(o, ",\"top_logprobs\":[");
    for (int i = 0; i < pos->n_best && !bad; i++)
        bad = (i > 0 && LIT(o, ",")) || LIT(o, "{") || write_token_fields(o, &pos->best[i], text) || LIT(o, "}");
    return bad || LIT(o, "]}") ? -1 : 0;
}

/* Characters in UTF-8 text: what OpenAI's text_offset counts (Python's len). */
static int64_t characters(const oi_sbuf_t *text)
{
    int64_t n = 0;
    for (size_t i = 0; i < text->len; i++)
        n += ((unsigned char)text->data[i] & 0xc0) != 0x80;
    return n;
}

/* "text":logprob, a member of a completion's top_logprobs object. */
static int write_top_member(oi_sbuf_t *out, const candidate_t *cand, oi_sbuf_t *text)
{
    return token_text(cand, text) || oi_json_write_string(out, text->data, text->len) || LIT(out, ":") ||
           write_logprob(out, cand->logprob);
}

/* A completion's token: its text, logprob and offset, and the sampled token with the `top`
 * likeliest as its top_logprobs (so up to top + 1 of them, as OpenAI's API says). */
static int write_completion_token(oi_openai_logprobs_t *lp, const position_t *pos, oi_sbuf_t *text)
{
    int more = lp->n > 0; /* a comma before each array's item */
    char offset[OI_NUM_ROOM];
    if (token_text(&pos->sampled, text) != 0 || (more && LIT(&lp->items, ",")) ||
        oi_json_write_string(&lp->items, text->data, text->len) || (more && LIT(&lp->values, ",")) ||
        write_logprob(&lp->values, pos->sampled.logprob) || (more && LIT(&lp->offsets, ",")) ||
        oi_sbuf_append(&lp->offsets, offset, (size_t)(oi_num_write_i64(offset, lp->offset) - offset)))
        return -1;
    lp->offset += characters(text);
    int bad = (more && LIT(&lp->tops, ",")) || LIT(&lp->tops, "{") || write_top_member(&lp->tops, &pos->sampled, text);
    for (int i = 0; i < pos->n_best && !bad; i++)
        if (pos->best[i].index != 0)
            bad = LIT(&lp->tops, ",") || write_top_member(&lp->tops, &pos->best[i], text);
    return bad || LIT(&lp->tops, "}") ? -1 : 0;
}

oi_status_t *oi_openai_logprobs_add(oi_openai_logprobs_t *lp, const char *json, size_t len, int *none)
{
    reader_t rd = {.c = {.base = (char *)json, .p = (char *)json, .end = (char *)json + len, .max_depth = 16}};
    cursor_t *c = &rd.c;
    oi_sbuf_t text = {0};
    uint32_t n = 0;
    int r = -1, ch = oi__json_peek(c);
    int top = lp->top < 0 ? 0 : lp->top > OI_OPENAI_MAX_TOP_LOGPROBS ? OI_OPENAI_MAX_TOP_LOGPROBS : lp->top;
    *none = 0;
    if (ch == 'n') {
        if (oi__json_skip_value(c) == 0 && oi__json_peek(c) == -1)
            *none = r = 1;
        else if (c->err == NULL)
            fail(&rd, "bytes follow null");
    } else if (ch != '[') {
        fail(&rd, "not a JSON list of tokens");
    } else if (oi__json_enter(c, '[') == 0) {
        while ((r = oi__json_next_element(c, &n)) == 1) {
            position_t pos;
            pos.n_best = 0;
            rd.token = n;
            if (read_position(&rd, &pos, top) != 0) {
                r = -1;
                break;
            }
            if ((lp->kind == OI_OPENAI_CHAT ? write_chat_token(lp, &pos, &text)
                                            : write_completion_token(lp, &pos, &text)) != 0) {
                r = -1;
                fail(&rd, "out of memory");
                break;
            }
            lp->n++;
        }
        if (r == 0 && oi__json_peek(c) != -1) {
            r = -1;
            fail(&rd, "bytes follow the list");
        }
    }
    oi_sbuf_free(&text);
    oi_status_t *st = NULL;
    if (r < 0) {
        const char *why = c->err != NULL ? c->err->message : rd.what[0] ? rd.what : "malformed JSON";
        st = rd.token > 0 ? oi_status_new(OI_INTERNAL, "token %u: %s", (unsigned)rd.token, why)
                          : oi_status_new(OI_INTERNAL, "%s", why);
    }
    oi_status_free(c->err);
    return st;
}

static int append_items(oi_sbuf_t *out, const oi_sbuf_t *items)
{
    return items->len > 0 ? oi_sbuf_append(out, items->data, items->len) : 0;
}

int oi_openai_logprobs_write(oi_sbuf_t *out, const oi_openai_logprobs_t *lp)
{
    if (lp == NULL)
        return LIT(out, "null");
    if (lp->kind == OI_OPENAI_CHAT)
        return LIT(out, "{\"content\":[") || append_items(out, &lp->items) || LIT(out, "]}") ? -1 : 0;
    return LIT(out, "{\"text_offset\":[") || append_items(out, &lp->offsets) || LIT(out, "],\"token_logprobs\":[") ||
                   append_items(out, &lp->values) || LIT(out, "],\"tokens\":[") || append_items(out, &lp->items) ||
                   LIT(out, "],\"top_logprobs\":[") || append_items(out, &lp->tops) || LIT(out, "]}")
               ? -1
               : 0;
}

size_t oi_openai_logprobs_size(const oi_openai_logprobs_t *lp)
{
    return lp->items.len + lp->values.len + lp->tops.len + lp->offsets.len;
}

void oi_openai_logprobs_clear(oi_openai_logprobs_t *lp)
{
    lp->n = 0;
    lp->items.len = lp->values.len = lp->tops.len = lp->offsets.len = 0;
}

void oi_openai_logprobs_free(oi_openai_logprobs_t *lp)
{
    oi_sbuf_free(&lp->items);
    oi_sbuf_free(&lp->values);
    oi_sbuf_free(&lp->tops);
    oi_sbuf_free(&lp->offsets);
}
