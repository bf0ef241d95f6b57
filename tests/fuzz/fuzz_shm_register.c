/* libFuzzer target for the shared-memory registration: register, unregister and status
 * requests as the HTTP API decodes them (oi_shm_decode_register) and the region registry
 * serves them (oi_shm_register_system / _cuda, oi_shm_unregister, oi_shm_list), from two
 * users, on one registry that lives for the input. Only OI_FUZZ_SHM_KEY can be opened and
 * mapped (shm_fence.h): the names and keys are fuzzed, never what they reach.
 *
 * The input is text, one request per line: an operation letter, a space, the region name
 * (up to the next space; "-" for none), a space, then the JSON body to the end of the line.
 *   S <name> <body>   register system memory      C <name> <body>   register CUDA memory
 *   U <name>          unregister (kind: system)   u <name>          unregister (kind: CUDA)
 *   L <name>          status (system)             l <name>          status (CUDA)
 * A letter prefixed with '~' acts as a second user (uid 65534, which may not open the
 * object: mode 0600).
 *
 * Built with -DOI_FUZZ_MAIN it replays files and corpus directories instead, with gcc too. */
#include "shm_fence.h"

#include <stdint.h>
#include <string.h>

#include "server/shm/shm_body.h"

static oi_peer_t me, other;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fence_init();
    me = (oi_peer_t){.uid = getuid(), .gid = getgid()};
    other = (oi_peer_t){.uid = 65534, .gid = 65534};
    return 0;
}

static void one(oi_shm_t *shm, const char *line, size_t len)
{
    const oi_peer_t *peer = &me;
    if (len > 0 && line[0] == '~') {
        peer = &other;
        line++, len--;
    }
    if (len < 2)
        return;
    char op = line[0];
    const char *p = line + 2, *end = line + len;
    const char *sp = memchr(p, ' ', (size_t)(end - p));
    const char *name_end = sp ? sp : end;
    char name[300];
    size_t n = (size_t)(name_end - p) < sizeof(name) - 1 ? (size_t)(name_end - p) : sizeof(name) - 1;
    memcpy(name, p, n);
    name[n] = '\0';
    if (strcmp(name, "-") == 0)
        name[0] = '\0';
    oi_slice_t body = sp ? (oi_slice_t){sp + 1, (size_t)(end - sp - 1)} : (oi_slice_t){NULL, 0};
    oi_status_t *st = NULL;
    oi_shm_register_body_t b;
    switch (op) {
    case 'S':
    case 'C': {
        oi_shm_kind_t kind = op == 'S' ? OI_SHM_SYSTEM : OI_SHM_CUDA;
        st = oi_shm_decode_register(body, kind, &b);
        if (st == NULL && kind == OI_SHM_SYSTEM)
            st = oi_shm_register_system(shm, peer, name, b.key, b.offset, b.byte_size);
        else if (st == NULL)
            st = oi_shm_register_cuda(shm, peer, name, b.handle, b.handle_len, (int64_t)b.device_id, b.byte_size);
        break;
    }
    case 'U':
    case 'u': st = oi_shm_unregister(shm, peer, op == 'U' ? OI_SHM_SYSTEM : OI_SHM_CUDA, name); break;
    case 'L':
    case 'l': {
        oi_shm_region_t **regions = NULL;
        size_t count = 0;
        st = oi_shm_list(shm, peer, op == 'L' ? OI_SHM_SYSTEM : OI_SHM_CUDA, name, &regions, &count);
        if (st == NULL) {
            for (size_t i = 0; i < count; i++) /* read what a status answer reads */
                if (regions[i]->name[0] == '\0' || regions[i]->byte_size == 0)
                    abort();
            oi_shm_release_all(regions, count);
        }
        break;
    }
    default: break;
    }
    if (st != NULL && (st->code < 400 || st->code > 599 || st->message == NULL))
        abort(); /* every refusal is a client or server error with a message */
    oi_status_free(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    oi_shm_t shm;
    oi_shm_init(&shm, 1);
    const char *p = (const char *)data, *end = p + size;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = nl ? nl : end;
        one(&shm, p, (size_t)(line_end - p));
        p = nl ? nl + 1 : end;
    }
    oi_shm_destroy(&shm);
    return 0;
}

#include "replay_main.h"
