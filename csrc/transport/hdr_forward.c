#include "transport/hdr_forward.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "codec/json.h"

/* tritonserver's kReservedParameterKeys: parameters its own protocol code sets. */
static const char *const reserved[] = {"sequence_id", "sequence_start", "sequence_end", "priority",
                                       "timeout",     "headers",        "binary_data_output"};

/* The POSIX extended expression of an RE2 one, for what ERE spells otherwise: "(?:" groups
 * become plain groups, and \d / \D outside brackets [0-9] / [^0-9]. NULL when out of memory. */
static char *ere_of_re2(const char *p)
{
    char *out = malloc(strlen(p) * 3 + 1), *w = out; /* \D (2 bytes) -> [^0-9] (6) at most */
    if (out == NULL)
        return NULL;
    int in_class = 0;
    while (*p != '\0') {
        if (!in_class && p[0] == '(' && p[1] == '?' && p[2] == ':') {
            *w++ = '(';
            p += 3;
        } else if (!in_class && p[0] == '\\' && (p[1] == 'd' || p[1] == 'D')) {
            const char *cls = p[1] == 'd' ? "[0-9]" : "[^0-9]";
            w += strlen(strcpy(w, cls));
            p += 2;
        } else if (p[0] == '\\' && p[1] != '\0') {
            *w++ = *p++;
            *w++ = *p++;
        } else {
            in_class = *p == '[' ? 1 : *p == ']' ? 0 : in_class;
            *w++ = *p++;
        }
    }
    *w = '\0';
    return out;
}

int oi_hdr_forward_compile(regex_t *re, const char *pattern)
{
    /* tritonserver matches RE2's "(?i)" + pattern: case-insensitive unless the pattern turns
     * that off ("(?-i)" at its start, which is where this reads flags). */
    int flags = REG_EXTENDED | REG_ICASE | REG_NOSUB;
    for (;;) {
        if (strncmp(pattern, "(?i)", 4) == 0) {
            flags |= REG_ICASE;
            pattern += 4;
        } else if (strncmp(pattern, "(?-i)", 5) == 0) {
            flags &= ~REG_ICASE;
            pattern += 5;
        } else {
            break;
        }
    }
    char *ere = ere_of_re2(pattern);
    if (ere == NULL)
        return REG_ESPACE;
    int rc = regcomp(re, ere, flags);
    free(ere);
    return rc;
}

static int is_reserved(const char *name, size_t n)
{
    if (n >= 7 && memcmp(name, "triton_", 7) == 0)
        return 1;
    for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
        if (strlen(reserved[i]) == n && memcmp(reserved[i], name, n) == 0)
            return 1;
    return 0;
}

int oi_hdr_forward(const regex_t *re, oi_sbuf_t *members, const char *name, size_t n, const char *value,
                   size_t vlen, char *err, size_t errlen)
{
    /* regexec wants a NUL-terminated name (REG_STARTEND is not portable, and sanitizers read
     * to the NUL regardless); HTTP/1.1 and HTTP/2 header names hold no NUL byte. */
    char small[256], *z = n < sizeof(small) ? small : malloc(n + 1);
    if (z == NULL)
        return OI_HDR_NOMEM;
    memcpy(z, name, n);
    z[n] = '\0';
    int match = regexec(re, z, 0, NULL, 0) == 0;
    if (z != small)
        free(z);
    if (!match)
        return OI_HDR_SKIPPED;
    if (is_reserved(name, n)) {
        snprintf(err, errlen, "Header '%.*s' is reserved for Triton usage and cannot be forwarded.",
                 n > 200 ? 200 : (int)n, name);
        return OI_HDR_RESERVED;
    }
    if ((members->len > 0 && oi_sbuf_append(members, ",", 1) != 0) || oi_json_write_string(members, name, n) != 0 ||
        oi_sbuf_append(members, ":", 1) != 0 || oi_json_write_string(members, value, vlen) != 0)
        return OI_HDR_NOMEM;
    return OI_HDR_ADDED;
}
