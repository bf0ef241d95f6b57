/* libFuzzer target for the text-format protobuf codec (codec/pbtext.c) the legacy v1 API
 * reads its NV-InferRequest header with: parses the input as an InferRequestHeader, and when
 * that succeeds, prints it back (one line and DebugString's layout, and as JSON), parses the
 * printed text again and checks that both parses serialize to the same bytes.
 *
 * Built with -DOI_FUZZ_MAIN it replays files instead (tests/fuzz/replay_main.h). */
#include "codec/pbtext.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "legacy/api.pb-c.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static uint8_t *pack(const ProtobufCMessage *m, size_t *n)
{
    *n = protobuf_c_message_get_packed_size(m);
    uint8_t *b = malloc(*n ? *n : 1);
    if (b != NULL)
        protobuf_c_message_pack(m, b);
    return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy, so that reads past the text are caught. */
    char *text = malloc(size ? size : 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    char err[256];
    const ProtobufCMessageDescriptor *d = &nvidia__inferenceserver__infer_request_header__descriptor;
    ProtobufCMessage *m = oi_pbtext_parse(d, text, size, err, sizeof(err));
    free(text);
    if (m == NULL) {
        if (err[0] == '\0')
            abort(); /* a refusal always says why */
        return 0;
    }
    for (int one_line = 0; one_line < 2; one_line++) {
        oi_sbuf_t out = {0};
        if (oi_pbtext_write(&out, m, one_line) == 0) {
            ProtobufCMessage *again = oi_pbtext_parse(d, out.data ? out.data : "", out.len, err, sizeof(err));
            if (again == NULL)
                abort(); /* what the writer prints, the reader reads */
            size_t na, nb;
            uint8_t *a = pack(m, &na), *b = pack(again, &nb);
            if (a != NULL && b != NULL && (na != nb || memcmp(a, b, na) != 0))
                abort(); /* and it is the same message */
            free(a);
            free(b);
            protobuf_c_message_free_unpacked(again, NULL);
        }
        oi_sbuf_free(&out);
    }
    oi_sbuf_t json = {0};
    (void)oi_pbjson_write(&json, m);
    oi_sbuf_free(&json);
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
}

#include "replay_main.h"
