#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_sigmask under plain -std=c11, pthread_setname_np */
#endif

#include "core/thread.h"

#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int oi_thread_create(pthread_t *t, const char *name, void *(*fn)(void *), void *arg, int detached)
{
    sigset_t all, old;
    sigfillset(&all);
    /* Faults stay deliverable: blocked, they kill the process without running a handler,
     * and the shared-memory guard (server/shm_guard.h) handles SIGBUS on these threads. */
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* the new thread inherits the mask */
    int rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return rc;
    /* Named while still joinable, so the handle is valid even if the thread has ended. */
#if defined(__linux__)
    char short_name[16]; /* the kernel keeps 15 characters */
    snprintf(short_name, sizeof(short_name), "%s", name);
    pthread_setname_np(*t, short_name);
#else
    (void)name;
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
