/* libFuzzer target for the gRPC path: the input is what an HTTP/2 client writes on one
 * connection after the 24-byte client preface (which the target puts in front) and after the
 * first byte (below): frames,
 * normally a SETTINGS frame, then HEADERS and DATA of one or more calls. A real server reads
 * it through nghttp2 (nghttp2_session_mem_recv) into our callbacks, the gRPC message
 * reassembly, the service router and the protobuf decoders, with inferences run by echo
 * models on their executor threads (see server_harness.h). The input's first byte says how
 * the rest is written (0: at once; n: n bytes at a time, each read before the next is
 * written), so that frames split anywhere are fuzzed too.
 *
 *   make fuzz FUZZ_TARGETS=fuzz_grpc     (builds with clang -fsanitize=fuzzer,address,undefined)
 *
 * Built with -DOI_FUZZ_MAIN it replays files and corpus directories instead, with gcc too. */
#include "server_harness.h"

#include <stdlib.h>
#include <string.h>

static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    harness_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t chunk = harness_chunk(&data, &size);
    size_t n = sizeof(preface) - 1;
    uint8_t *wire = malloc(n + size);
    if (wire == NULL)
        return 0;
    memcpy(wire, preface, n);
    if (size > 0)
        memcpy(wire + n, data, size);
    harness_drive(wire, n + size, 1, chunk);
    free(wire);
    /* A call may have registered a region (its name can hide in HPACK's Huffman code). */
    harness_reset();
    return 0;
}

#include "replay_main.h"
