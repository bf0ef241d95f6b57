#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_sigmask under plain -std=c11, pthread_setname_np */
#endif

#include "core/thread.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a new thread runs first: it names itself before anything else, so that a thread it
 * starts at once (libuv's pool, started from oi-work) inherits that name, not its creator's
 * (the creator's naming below can come after that). The creator names it too, so that the
 * name shows as soon as oi_thread_create returns, whenever the new thread first runs. */
typedef struct {
    void *(*fn)(void *);
    void *arg;
    char name[16]; /* the kernel keeps 15 characters */
} named_start_t;

static void *named_start(void *p)
{
    named_start_t s = *(named_start_t *)p;
    free(p);
#if defined(__linux__)
    pthread_setname_np(pthread_self(), s.name);
#endif
    return s.fn(s.arg);
}

int oi_thread_create(pthread_t *t, const char *name, void *(*fn)(void *), void *arg, int detached)
{
    named_start_t *start = malloc(sizeof(*start));
    if (start == NULL)
        return ENOMEM;
    start->fn = fn;
    start->arg = arg;
    snprintf(start->name, sizeof(start->name), "%s", name);
    sigset_t all, old;
    sigfillset(&all);
    /* Faults stay deliverable: blocked, they kill the process without running a handler,
     * and the shared-memory guard (server/shm/shm_guard.h) handles SIGBUS on these threads. */
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* the new thread inherits the mask */
    int rc = pthread_create(t, NULL, named_start, start);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        free(start);
        return rc;
    }
#if defined(__linux__)
    char short_name[16];
    snprintf(short_name, sizeof(short_name), "%s", name);
    pthread_setname_np(*t, short_name); /* while still joinable: the handle is valid */
#endif
    if (detached)
        pthread_detach(*t);
    return 0;
}

static _Thread_local int thread_instance = -1;

void oi_thread_set_instance(int instance) { thread_instance = instance; }

int oi_thread_instance(void) { return thread_instance; }

void oi_thread_prefer_batch(void)
{
#ifdef SCHED_BATCH
    const char *policy = getenv("OPENINFER_EXECUTOR_SCHED");
    if (policy != NULL && strcmp(policy, "normal") == 0)
        return;
    struct sched_param p = {0};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &p); /* unprivileged; on failure stays normal */
#endif
}

struct timespec oi_deadline_in(double seconds)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    long long ns = t.tv_nsec + (long long)(seconds * 1e9);
    t.tv_sec += ns / 1000000000LL;
    t.tv_nsec = ns % 1000000000LL;
    return t;
}
