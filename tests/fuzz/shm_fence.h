/* A fence for fuzz targets that reach shm_open: the only key that can be opened is
 * OI_FUZZ_SHM_KEY, backed by a memfd of this process (OI_FUZZ_SHM_BYTES long, mode 0600).
 * Whatever name a fuzzer comes up with, no object of another process on this machine is ever
 * mapped, let alone written. The definition of shm_open below, in the executable, takes the
 * place of libc's for the server code linked into it. */
#ifndef OI_FUZZ_SHM_FENCE_H
#define OI_FUZZ_SHM_FENCE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define OI_FUZZ_SHM_KEY "/oi_fuzz_region"
#define OI_FUZZ_SHM_BYTES 4096

static int fence_fd = -1;

/* Creates the one object; aborts when it cannot. */
static void fence_init(void)
{
    fence_fd = memfd_create("oi_fuzz_region", MFD_CLOEXEC);
    if (fence_fd < 0 || ftruncate(fence_fd, OI_FUZZ_SHM_BYTES) != 0 || fchmod(fence_fd, 0600) != 0) {
        perror("memfd for the fuzz shm fence");
        abort();
    }
}

int shm_open(const char *name, int oflag, mode_t mode)
{
    (void)oflag, (void)mode;
    if (strcmp(name, OI_FUZZ_SHM_KEY) != 0 || fence_fd < 0) {
        errno = ENOENT;
        return -1;
    }
    return fcntl(fence_fd, F_DUPFD_CLOEXEC, 0);
}

#endif
