#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_sigmask under plain -std=c11, pthread_setname_np */
#endif

#include "core/thread.h"

#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int oi_thread_create(pthread_t *t, void *(*fn)(void *), void *arg, int detached)
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
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (detached)
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(t, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

void oi_thread_set_name(const char *name)
{
    char short_name[16];
    snprintf(short_name, sizeof(short_name), "%s", name);
#if defined(__APPLE__)
    pthread_setname_np(short_name);
#elif defined(__linux__)
    pthread_setname_np(pthread_self(), short_name);
#else
    (void)short_name;
#endif
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
