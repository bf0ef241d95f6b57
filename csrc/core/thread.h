/* Threads for the core's own work (loops, executors), which must never receive process
 * signals: those belong to the application's main thread (Python runs its handlers there,
 * and a signal landing on a native thread would leave a waiting main thread asleep). */
#ifndef OI_CORE_THREAD_H
#define OI_CORE_THREAD_H

#include <pthread.h>
#include <time.h>

/* pthread_create with every signal blocked in the new thread, named `name` for ps -L, top -H
 * and /proc/PID/task/TID/comm (15 characters kept): a thread would otherwise take its
 * creator's name, and one that a loop starts would show as a loop. Returns 0 or an errno. */
int oi_thread_create(pthread_t *t, const char *name, void *(*fn)(void *), void *arg, int detached);

/* The model instance the calling thread serves: an executor sets it once, and a backend with
 * a pool of instances (TorchScript modules, ONNX sessions) takes that one, so a sequence that
 * the sequence batcher binds to an executor is bound to one instance too. -1 elsewhere. */
void oi_thread_set_instance(int instance);
int oi_thread_instance(void);

/* Marks the calling thread CPU-bound to the kernel's scheduler (SCHED_BATCH): waking it does
 * not preempt the thread that woke it. Executors call it, so that a loop sharing their CPU
 * goes on reading the requests already there after handing one over, instead of switching to
 * the executor and back for each request (1.38x the requests/s at c=8, 1.37x at c=64, 1.05x
 * at c=1 with the loop and the executor on one CPU: benchmarks/executor_policy.py). The
 * environment variable OPENINFER_EXECUTOR_SCHED=normal leaves the policy alone. */
void oi_thread_prefer_batch(void);

/* The CLOCK_REALTIME moment `seconds` (>= 0) from now, as pthread_cond_timedwait takes it. */
struct timespec oi_deadline_in(double seconds);

#endif
