#include "server/models/registry.h"

#include "server/classify.h"
#include "core/thread.h"
#include "server/sched/ensemble.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* After an unload's bound, how long the requests still running get once queued ones have failed
 * and the backend has aborted the running ones (killed worker processes answer at once). */
#define ABORT_GRACE_MS 2000

static int copy_specs(oi_io_spec_t **dst, const oi_io_spec_t *src, uint32_t n)
{
    *dst = calloc(n ? n : 1, sizeof(**dst));
    if (*dst == NULL)
        return -1;
    for (uint32_t i = 0; i < n; i++) {
        (*dst)[i] = src[i];
        (*dst)[i].name = strdup(src[i].name);
        if ((*dst)[i].name == NULL)
            return -1;
    }
    return 0;
}

static void free_specs(oi_io_spec_t *s, uint32_t n)
{
    if (s == NULL)
        return;
    for (uint32_t i = 0; i < n; i++)
        free(s[i].name);
    free(s);
}

oi_model_t *oi_model_new(const char *name, int64_t version, int max_batch_size, const oi_io_spec_t *inputs,
                         uint32_t n_inputs, const oi_io_spec_t *outputs, uint32_t n_outputs)
{
    oi_model_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    atomic_init(&m->refs, 1);
    m->version = version;
    snprintf(m->version_str, sizeof(m->version_str), "%" PRId64, version);
    m->max_batch_size = max_batch_size;
    m->n_inputs = n_inputs;
    m->n_outputs = n_outputs;
    m->name = strdup(name);
    if (m->name == NULL || copy_specs(&m->inputs, inputs, n_inputs) != 0 ||
        copy_specs(&m->outputs, outputs, n_outputs) != 0 ||
        (m->output_names = calloc(n_outputs ? n_outputs : 1, sizeof(char *))) == NULL) {
        oi_model_unref(m);
        return NULL;
    }
    for (uint32_t i = 0; i < n_outputs; i++)
        m->output_names[i] = m->outputs[i].name;
    return m;
}

void oi_model_ref(oi_model_t *m) { atomic_fetch_add(&m->refs, 1); }

void oi_model_unref(oi_model_t *m)
{
    if (m == NULL || atomic_fetch_sub(&m->refs, 1) != 1)
        return;
    free(m->name);
    free(m->ns);
    free_specs(m->inputs, m->n_inputs);
    free_specs(m->outputs, m->n_outputs);
    free(m->output_names);
    for (uint32_t i = 0; m->labels != NULL && i < m->n_outputs; i++)
        oi_labels_free(m->labels[i]);
    free(m->labels);
    for (uint32_t i = 0; m->openai_names != NULL && i < 2 * m->n_openai_names; i++)
        free(m->openai_names[i]);
    free(m->openai_names);
    oi_buf_unref(m->metadata);
    oi_buf_unref(m->config_json);
    oi_buf_unref(m->config_pb);
    free(m->error);
    free(m);
}

/* Whether two namespaces are the same one (NULL: none, as ""). */
static int same_ns(const char *a, const char *b) { return strcmp(a ? a : "", b ? b : "") == 0; }

static int is_model(const oi_model_t *x, const char *ns, const char *name, int64_t version)
{
    return x->version == version && strcmp(x->name, name) == 0 && same_ns(x->ns, ns);
}

void oi_registry_init(oi_registry_t *r)
{
    pthread_rwlock_init(&r->lock, NULL);
    r->models = NULL;
}

int oi_registry_add(oi_registry_t *r, oi_model_t *m)
{
    pthread_rwlock_wrlock(&r->lock);
    for (oi_model_t *x = r->models; x; x = x->next)
        if (is_model(x, m->ns, m->name, m->version)) {
            pthread_rwlock_unlock(&r->lock);
            return -1;
        }
    m->next = r->models;
    r->models = m;
    pthread_rwlock_unlock(&r->lock);
    return 0;
}

/* Takes `m` out of the list if it is there (the caller holds the write lock); returns it. */
static oi_model_t *unlink_model(oi_registry_t *r, const char *ns, const char *name, int64_t version)
{
    for (oi_model_t **p = &r->models; *p; p = &(*p)->next)
        if (is_model(*p, ns, name, version)) {
            oi_model_t *m = *p;
            *p = m->next;
            m->next = NULL;
            return m;
        }
    return NULL;
}

int oi_registry_swap(oi_registry_t *r, oi_model_t **add, size_t n_add, const char *const *remove_ns,
                     const char *const *remove_names, const int64_t *remove_versions, size_t n_remove,
                     oi_model_t ***retired, size_t *n_retired)
{
    /* At most one entry leaves per added or removed one: allocated before anything moves. */
    oi_model_t **out = calloc(n_add + n_remove + 1, sizeof(*out));
    if (out == NULL)
        return -1;
    size_t n = 0;
    pthread_rwlock_wrlock(&r->lock);
    for (size_t i = 0; i < n_remove; i++) {
        oi_model_t *m = unlink_model(r, remove_ns ? remove_ns[i] : NULL, remove_names[i], remove_versions[i]);
        if (m != NULL)
            out[n++] = m;
    }
    for (size_t i = 0; i < n_add; i++) {
        oi_model_t *m = unlink_model(r, add[i]->ns, add[i]->name, add[i]->version);
        if (m != NULL)
            out[n++] = m;
        add[i]->next = r->models;
        r->models = add[i];
    }
    pthread_rwlock_unlock(&r->lock);
    if (n == 0) {
        free(out);
        out = NULL;
    }
    *retired = out;
    *n_retired = n;
    return 0;
}

/* Waits until the caller's reference to `m` is the last, up to `timeout_ms` (< 0: no bound);
 * returns whether it is. */
static int await_last_ref(oi_model_t *m, int64_t timeout_ms)
{
    /* Each request admitted to this version holds a reference until its answer is written;
     * none can be added now that no registry lists it. Unloads are rare: polling is enough. */
    for (int64_t waited_ms = 0; atomic_load(&m->refs) > 1; waited_ms++) {
        if (timeout_ms >= 0 && waited_ms >= timeout_ms)
            return 0;
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 1;
}

static void retire_now(oi_model_t *m);

/* An abandoned version's own thread: it ends the version if its last execute ever returns. */
static void *retire_later(void *arg)
{
    oi_model_t *m = arg;
    (void)await_last_ref(m, -1);
    retire_now(m);
    return NULL;
}

int oi_model_retire_within(oi_model_t *m, int64_t timeout_ms)
{
    if (m == NULL)
        return 0;
    if (!await_last_ref(m, timeout_ms)) {
        oi_seq_stop(m->seq); /* before the scheduler: its requests go on to it until stopped */
        oi_scheduler_cancel_queued(m->sched);
        if (m->backend && m->backend->abort)
            m->backend->abort(m->state);
        if (!await_last_ref(m, ABORT_GRACE_MS)) {
            /* An execute still runs on its executors and state: they stay, left to a thread of
             * their own (or for good, when none can start). */
            pthread_t t;
            (void)oi_thread_create(&t, "oi-retire", retire_later, m, 1);
            return 1;
        }
    }
    retire_now(m);
    return 0;
}

/* Ends `m` once no request holds it: its executors, batchers and backend, then the caller's reference. */
static void retire_now(oi_model_t *m)
{
    oi_seq_stop(m->seq);
    oi_scheduler_free(m->sched);
    m->sched = NULL;
    oi_seq_free(m->seq);
    m->seq = NULL;
    if (m->backend && m->backend->release)
        m->backend->release(m->state);
    m->backend = NULL;
    oi_model_unref(m);
}

void oi_model_retire(oi_model_t *m) { (void)oi_model_retire_within(m, -1); }

/* Parses a URL version: decimal digits only. */
static int parse_version(const char *s, int64_t *out)
{
    if (*s == '\0' || strlen(s) > 18)
        return -1;
    int64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (*s - '0');
    }
    *out = v;
    return 0;
}

/* The default version of `name` in namespace `ns`: the highest ready one, else the highest.
 * Caller holds the lock. */
static oi_model_t *default_version(oi_registry_t *r, const char *ns, const char *name)
{
    oi_model_t *best = NULL;
    for (oi_model_t *x = r->models; x; x = x->next) {
        if (strcmp(x->name, name) != 0 || !same_ns(x->ns, ns))
            continue;
        int x_ready = x->error == NULL, b_ready = best && best->error == NULL;
        if (best == NULL || x_ready > b_ready || (x_ready == b_ready && x->version > best->version))
            best = x;
    }
    return best;
}

/* The namespace that model `name` resolves to, in *ns: `prefer` when it has a model of that
 * name, else the only namespace that has one. Returns how many namespaces have one when that
 * is ambiguous (2 or more; *ns unset), else 0 or 1. Caller holds the lock. */
static int resolve_ns(oi_registry_t *r, const char *prefer, const char *name, const char **ns)
{
    const oi_model_t *first = NULL;
    int count = 0;
    for (oi_model_t *x = r->models; x; x = x->next) {
        if (strcmp(x->name, name) != 0)
            continue;
        if (prefer != NULL && same_ns(x->ns, prefer)) {
            *ns = x->ns;
            return 1;
        }
        if (first == NULL) {
            first = x;
            count = 1;
        } else if (!same_ns(x->ns, first->ns)) {
            int seen = 0; /* another namespace: counted once, at its first model */
            for (oi_model_t *y = r->models; y != x && !seen; y = y->next)
                seen = strcmp(y->name, name) == 0 && same_ns(y->ns, x->ns);
            count += !seen;
        }
    }
    if (count == 1)
        *ns = first->ns;
    return count;
}

oi_model_t *oi_registry_find(oi_registry_t *r, const char *name, const char *version, oi_status_t **err)
{
    return oi_registry_find_in(r, NULL, name, version, err);
}

oi_model_t *oi_registry_find_in(oi_registry_t *r, const char *prefer, const char *name, const char *version,
                                oi_status_t **err)
{
    int64_t v = -1;
    if (version != NULL && *version != '\0' && parse_version(version, &v) != 0) {
        *err =
            oi_status_new(OI_BAD_REQUEST,
                          "failed to get model version from specified version string '%s' (details: not an integer), "
                          "version should be an integral value > 0",
                          version);
        return NULL;
    }
    pthread_rwlock_rdlock(&r->lock);
    oi_model_t *found = NULL;
    const char *ns = NULL;
    int known = resolve_ns(r, prefer, name, &ns);
    for (oi_model_t *x = r->models; known == 1 && v >= 0 && x; x = x->next)
        if (is_model(x, ns, name, v)) {
            found = x;
            break;
        }
    if (v < 0 && known == 1)
        found = default_version(r, ns, name);
    /* Worded as Triton's core words them: clients and scripts match on these. */
    if (known > 1)
        *err = oi_status_new(OI_BAD_REQUEST,
                             "There are %d identifiers of model '%s' in global map, model namespace must be provided "
                             "to resolve ambiguity.",
                             known, name);
    else if (!known)
        *err = oi_status_new(OI_NOT_FOUND, "Request for unknown model: '%s' is not found", name);
    else if (found == NULL)
        *err = oi_status_new(OI_NOT_FOUND, "Request for unknown model: '%s' version %lld is not found", name,
                             (long long)v);
    if (found)
        oi_model_ref(found);
    pthread_rwlock_unlock(&r->lock);
    return found;
}

int oi_registry_namespaces(oi_registry_t *r, const char *name)
{
    const char *ns;
    pthread_rwlock_rdlock(&r->lock);
    int n = resolve_ns(r, NULL, name, &ns);
    pthread_rwlock_unlock(&r->lock);
    return n;
}

int oi_registry_visit_ready(oi_registry_t *r, const char *name, int (*fn)(void *ctx, oi_model_t *m), void *ctx)
{
    int rc = 0;
    pthread_rwlock_rdlock(&r->lock);
    for (oi_model_t *x = r->models; x && rc == 0; x = x->next)
        if (x->error == NULL && x->sched != NULL && (name == NULL || strcmp(x->name, name) == 0))
            rc = fn(ctx, x);
    pthread_rwlock_unlock(&r->lock);
    return rc;
}

int oi_registry_visit(oi_registry_t *r, const char *name, int (*fn)(void *ctx, oi_model_t *m), void *ctx)
{
    int rc = 0;
    pthread_rwlock_rdlock(&r->lock);
    for (oi_model_t *x = r->models; x && rc == 0; x = x->next)
        if (name == NULL || strcmp(x->name, name) == 0)
            rc = fn(ctx, x);
    pthread_rwlock_unlock(&r->lock);
    return rc;
}

int oi_registry_all_ready(oi_registry_t *r)
{
    int ready = 1;
    pthread_rwlock_rdlock(&r->lock);
    for (oi_model_t *x = r->models; x && ready; x = x->next)
        if (default_version(r, x->ns, x->name)->error != NULL)
            ready = 0;
    pthread_rwlock_unlock(&r->lock);
    return ready;
}

void oi_registry_cancel_queued(oi_registry_t *r)
{
    pthread_rwlock_rdlock(&r->lock);
    for (oi_model_t *m = r->models; m != NULL; m = m->next) {
        oi_seq_stop(m->seq); /* before the scheduler: its requests go on to it until stopped */
        oi_scheduler_cancel_queued(m->sched);
    }
    pthread_rwlock_unlock(&r->lock);
}

void oi_registry_destroy(oi_registry_t *r)
{
    pthread_rwlock_wrlock(&r->lock);
    oi_model_t *m = r->models;
    r->models = NULL;
    pthread_rwlock_unlock(&r->lock);
    /* Ensembles first: their requests send steps to the other models' schedulers, which must
     * outlive them. */
    for (oi_model_t *x = m; x != NULL; x = x->next)
        if (x->backend == &oi_ensemble_backend) {
            oi_scheduler_free(x->sched);
            x->sched = NULL;
        }
    while (m) {
        oi_model_t *next = m->next;
        oi_seq_stop(m->seq);
        oi_scheduler_free(m->sched);
        m->sched = NULL;
        oi_seq_free(m->seq);
        m->seq = NULL;
        if (m->backend && m->backend->release)
            m->backend->release(m->state);
        m->backend = NULL;
        oi_model_unref(m);
        m = next;
    }
    pthread_rwlock_destroy(&r->lock);
}
