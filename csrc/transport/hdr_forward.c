#include "transport/hdr_forward.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "codec/json.h"

/* tritonserver's kReservedParameterKeys: parameters its own protocol code sets. */
static const char *const reserved[] = {"sequence_id", "sequence_start", "sequence_end", "priority",
                                       "timeout",     "headers",        "binary_data_output"};

int oi_hdr_forward_compile(regex_t *re, const char *pattern)
{
    /* tritonserver prefixes the pattern with (?i) for RE2; REG_ICASE is the same here. */
    return regcomp(re, pattern, REG_EXTENDED | REG_ICASE | REG_NOSUB);
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
