#include "transport/loop.h"

#include <stdatomic.h>
#include <stdio.h>

#include "core/thread.h"

static void drain(uv_async_t *h)
{
    oi_loop_t *l = h->data;
    pthread_mutex_lock(&l->mu);
    oi_task_t *t = l->head;
    l->head = l->tail = NULL;
    pthread_mutex_unlock(&l->mu);
    while (t != NULL) {
        oi_task_t *next = t->next; /* `run` may free the task */
        t->run(t);
        t = next;
    }
}

static void count_turn(uv_prepare_t *h)
{
    oi_loop_t *l = h->data;
    l->turns++;
}

int oi_loop_init(oi_loop_t *l)
{
    int rc = uv_loop_init(&l->uv);
    if (rc != 0)
        return rc;
    rc = uv_async_init(&l->uv, &l->wake, drain);
    if (rc != 0) {
        uv_loop_close(&l->uv);
        return rc;
    }
    uv_prepare_init(&l->uv, &l->turn); /* cannot fail on Linux */
    l->turn.data = l;
    l->turns = 1;
    l->ran_model_turn = 0;
    uv_prepare_start(&l->turn, count_turn);
    uv_unref((uv_handle_t *)&l->turn); /* it keeps the loop alive no more than the wake does */
    l->wake.data = l;
    l->uv.data = l;
    pthread_mutex_init(&l->mu, NULL);
    l->head = l->tail = NULL;
    l->started = 0;
    return 0;
}

static void *run_loop(void *arg)
{
    oi_loop_t *l = arg;
    uv_run(&l->uv, UV_RUN_DEFAULT);
    return NULL;
}

static void start_pool_once(void);

int oi_loop_start(oi_loop_t *l, const char *name)
{
    /* Here, not at the first oi_loop_work: that runs on a loop, which must not wait. */
    static pthread_once_t pool_started = PTHREAD_ONCE_INIT;
    pthread_once(&pool_started, start_pool_once);
    snprintf(l->name, sizeof(l->name), "%s", name);
    int rc = oi_thread_create(&l->thread, l->name, run_loop, l, 0);
    if (rc != 0)
        return uv_translate_sys_error(rc);
    l->started = 1;
    return 0;
}

void oi_loop_post(oi_loop_t *l, oi_task_t *t)
{
    t->next = NULL;
    pthread_mutex_lock(&l->mu);
    if (l->tail != NULL)
        l->tail->next = t;
    else
        l->head = t;
    l->tail = t;
    pthread_mutex_unlock(&l->mu);
    uv_async_send(&l->wake);
}

typedef struct call_task_s {
    oi_task_t task;
    void (*fn)(void *);
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
} call_task_t;

static void run_call(oi_task_t *t)
{
    call_task_t *ct = (call_task_t *)t;
    ct->fn(ct->arg);
    pthread_mutex_lock(&ct->mu);
    ct->done = 1;
    pthread_cond_signal(&ct->cv);
    pthread_mutex_unlock(&ct->mu);
}

void oi_loop_call(oi_loop_t *l, void (*fn)(void *arg), void *arg)
{
    if (!l->started) {
        fn(arg);
        return;
    }
    call_task_t ct = {.fn = fn, .arg = arg};
    ct.task.run = run_call;
    pthread_mutex_init(&ct.mu, NULL);
    pthread_cond_init(&ct.cv, NULL);
    oi_loop_post(l, &ct.task);
    pthread_mutex_lock(&ct.mu);
    while (!ct.done)
        pthread_cond_wait(&ct.cv, &ct.mu);
    pthread_mutex_unlock(&ct.mu);
    pthread_cond_destroy(&ct.cv);
    pthread_mutex_destroy(&ct.mu);
}

void oi_loop_close_wake(oi_loop_t *l)
{
    drain(&l->wake); /* run what is queued: completions release their resources */
    uv_close((uv_handle_t *)&l->wake, NULL);
    uv_close((uv_handle_t *)&l->turn, NULL);
}

void oi_loop_join(oi_loop_t *l)
{
    if (l->started)
        pthread_join(l->thread, NULL);
    else
        uv_run(&l->uv, UV_RUN_DEFAULT); /* let closed handles finish */
    uv_loop_close(&l->uv);
    pthread_mutex_destroy(&l->mu);
    l->started = 0;
}

/* The test hold (oi__work_hold): checked with one atomic load per work item. */
static atomic_int work_hold;
static int work_held;
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;

static void work_run(uv_work_t *req)
{
    oi_work_t *w = (oi_work_t *)req;
    if (atomic_load(&work_hold)) {
        pthread_mutex_lock(&hold_mu);
        work_held++;
        while (atomic_load(&work_hold))
            pthread_cond_wait(&hold_cv, &hold_mu);
        work_held--;
        pthread_mutex_unlock(&hold_mu);
    }
    w->run(w);
}

static void work_done(uv_work_t *req, int status)
{
    (void)status; /* never cancelled: uv_cancel is not used */
    oi_work_t *w = (oi_work_t *)req;
    w->done(w);
}

int oi_stream_send(uv_stream_t *s, uv_write_t *req, uv_buf_t *bufs, unsigned nb, uv_write_cb cb)
{
    int n = uv_try_write(s, bufs, nb); /* UV_EAGAIN also while writes are queued */
    if (n < 0 && n != UV_EAGAIN)
        return n;
    size_t left = n > 0 ? (size_t)n : 0;
    unsigned i = 0;
    while (i < nb && left >= bufs[i].len)
        left -= bufs[i++].len;
    if (i == nb)
        return 1;
    bufs[i].base += left;
    bufs[i].len -= left;
    return uv_write(req, s, bufs + i, nb - i, cb);
}

static void no_work(uv_work_t *req) { (void)req; }

/* libuv starts its pool threads (oi_loop_work's) on the first uv_queue_work of the process,
 * and they take the name (and signal mask) of the thread that queued it: from a loop, `top -H`
 * would show them as loops. Queued first from a thread named for them, they are named for
 * what they do; once a process, as its first loop starts. */
static void *start_pool(void *arg)
{
    (void)arg;
    uv_loop_t loop;
    uv_work_t req;
    if (uv_loop_init(&loop) != 0)
        return NULL;
    if (uv_queue_work(&loop, &req, no_work, NULL) == 0)
        uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return NULL;
}

static void start_pool_once(void)
{
    pthread_t t;
    if (oi_thread_create(&t, "oi-work", start_pool, NULL, 0) == 0)
        pthread_join(t, NULL);
}

int oi_loop_work(oi_loop_t *l, oi_work_t *w) { return uv_queue_work(&l->uv, &w->req, work_run, work_done); }

void oi__work_hold(int on)
{
    pthread_mutex_lock(&hold_mu);
    atomic_store(&work_hold, on != 0);
    pthread_cond_broadcast(&hold_cv);
    pthread_mutex_unlock(&hold_mu);
}

int oi__work_held(void)
{
    pthread_mutex_lock(&hold_mu);
    int n = work_held;
    pthread_mutex_unlock(&hold_mu);
    return n;
}
