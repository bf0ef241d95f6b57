#include "server/shm/shm_guard.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* One watched range. A slot is claimed with `used`, filled, then published by storing
 * `start` last; the handler reads `start` first, so it sees a range whole or not at all. A
 * range is removed only once nothing reads it, so a fault never races its removal. */
typedef struct slot_s {
    atomic_int used;
    _Atomic uintptr_t start;
    size_t len;
    atomic_int *faulted;
} slot_t;

static slot_t slots[OI_SHM_GUARD_SLOTS];
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int installed;
static struct sigaction previous;
static uintptr_t page_size;

/* What would have happened without us: the previous handler, or the default action (the
 * faulting access runs again with it in place and ends the process as before). */
static void chain(int sig, siginfo_t *si, void *uc)
{
    if (previous.sa_flags & SA_SIGINFO) {
        previous.sa_sigaction(sig, si, uc);
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
    } else {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof(dfl));
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGBUS, &dfl, NULL);
    }
}

/* Async-signal-safe: atomics, and mmap (a plain system call on Linux). */
static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    uintptr_t addr = (uintptr_t)si->si_addr;
    if (si->si_code == BUS_ADRERR) {
        for (size_t i = 0; i < OI_SHM_GUARD_SLOTS; i++) {
            uintptr_t start = atomic_load_explicit(&slots[i].start, memory_order_acquire);
            if (start == 0 || addr < start || addr - start >= slots[i].len)
                continue;
            uintptr_t page = addr & ~(page_size - 1);
            void *p = mmap((void *)page, start + slots[i].len - page, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            if (p == MAP_FAILED)
                break;
            atomic_store(slots[i].faulted, 1);
            return;
        }
    }
    chain(sig, si, uc);
}

static void install(void)
{
    page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    installed = sigaction(SIGBUS, &sa, &previous) == 0;
}

int oi_shm_guard_add(void *start, size_t len, atomic_int *faulted)
{
    pthread_once(&install_once, install);
    if (!installed)
        return -1;
    for (size_t i = 0; i < OI_SHM_GUARD_SLOTS; i++) {
        int free_ = 0;
        if (!atomic_compare_exchange_strong(&slots[i].used, &free_, 1))
            continue;
        slots[i].len = len;
        slots[i].faulted = faulted;
        atomic_store_explicit(&slots[i].start, (uintptr_t)start, memory_order_release);
        return 0;
    }
    return -1;
}

void oi_shm_guard_remove(void *start)
{
    for (size_t i = 0; i < OI_SHM_GUARD_SLOTS; i++) {
        if (atomic_load_explicit(&slots[i].start, memory_order_relaxed) != (uintptr_t)start)
            continue;
        atomic_store_explicit(&slots[i].start, 0, memory_order_release);
        atomic_store(&slots[i].used, 0);
        return;
    }
}
