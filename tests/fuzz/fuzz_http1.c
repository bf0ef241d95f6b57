/* libFuzzer target for the HTTP/1.1 request path: the input is what a client writes on one
 * connection (one or more pipelined requests, any bytes), served by a real server through
 * llhttp, the transport's callbacks, the V2 router and the request decoders (JSON, binary
 * tensor data, compression, shared-memory registration), with inferences run by echo models
 * on their executor threads (see server_harness.h). The input's first byte says how it is
 * written (0: at once; n: n bytes at a time, each read before the next is written), so that
 * requests split anywhere are fuzzed too.
 *
 *   make fuzz FUZZ_TARGETS=fuzz_http1     (builds with clang -fsanitize=fuzzer,address,undefined)
 *
 * Built with -DOI_FUZZ_MAIN it replays files and corpus directories instead, with gcc too. */
#include "server_harness.h"

#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    harness_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t chunk = harness_chunk(&data, &size);
    harness_drive(data, size, 0, chunk);
    if (memmem(data, size, "egister", 7) != NULL)
        harness_reset();
    return 0;
}

#include "replay_main.h"
