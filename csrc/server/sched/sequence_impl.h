/* What sequence.c (the sequences: id table, slots, backlog, submit, cancel, idle release),
 * sequence_request.c (controls and state) and sequence_direct.c (the Direct strategy's
 * batches) share; nothing but these three includes this. Functions named _locked want
 * q->mu held. */
#ifndef OI_SERVER_SCHED_SEQUENCE_IMPL_H
#define OI_SERVER_SCHED_SEQUENCE_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "server/sched/sequence.h"

typedef struct sequence_s sequence_t;

/* One request of a sequence, from oi_seq_submit until its job's `done`. Owned by the batcher;
 * `inner` is what the scheduler runs: the transport's request plus controls and state. */
typedef struct item_s {
    oi_job_t inner;
    oi_job_t *outer; /* the transport's job; borrowed until its done is called */
    oi_seq_t *q;
    struct item_s *next;
    struct item_s *live_prev, *live_next; /* in q->live from submit until it leaves the batcher */
    sequence_t *seq;
    oi_request_t req;        /* a shallow copy of the outer request with more inputs */
    const char **out_names;  /* the outer job's outputs, then state outputs it did not ask for */
    uint32_t n_outer_inputs; /* inputs past these are the item's own (one reference each) */
    uint64_t arrived_ns;
    uint8_t start, end;
    uint8_t in_sched; /* `inner` is in the scheduler: cancelled there, not here */
    uint8_t pad;      /* Direct: a padding row of instance `inst`'s batch (no outer job, no sequence) */
    int inst;
} item_t;

/* A sequence: one correlation id from its START until its END ran or it was released. */
struct sequence_s {
    sequence_t *hnext;        /* in the id table, while `mapped` */
    sequence_t *bnext, *bprev; /* in the backlog, while waiting for a slot */
    uint64_t id;
    uint64_t session; /* the client session of its last request (oi_seq_params_t.session) */
    char *id_str; /* NULL: numeric id */
    size_t id_str_len;
    uint64_t hash;
    int mapped;   /* requests for its id come here (until its END is queued, or idle release) */
    int has_slot; /* may run; else it waits in the backlog */
    int slot;     /* Direct: the slot it holds (row slot % rows of instance slot / rows) */
    int busy;     /* one of its requests is in the scheduler */
    item_t *head, *tail;
    uint64_t last_ns;    /* when it was last active (a request arrived or ended) */
    oi_tensor_t *states; /* the current state tensors (n_states); none before the first output */
    int have_states;
};

struct oi_seq_s {
    pthread_mutex_t mu;
    pthread_cond_t reaper_cv; /* monotonic clock */
    pthread_t reaper;
    int reaper_started;
    int stopping;
    oi_scheduler_t *sched;
    char *model_name;
    int max_batch_size;
    int free_slots;
    uint64_t idle_ns;
    oi_seq_control_t *controls;
    uint32_t n_controls;
    oi_seq_state_t *states;
    uint32_t n_states;
    int states_follow_outputs; /* oi_seq_config_t's */
    int corrid; /* index of the CORRID control, or -1 */
    sequence_t **table;
    size_t n_buckets, n_mapped;
    sequence_t *backlog_head, *backlog_tail;
    uint32_t n_backlog, max_backlog; /* sequences in the backlog, and how many may be (0: any) */
    item_t *live; /* every item not yet completed: what oi_seq_cancel looks a job up in */
    /* Direct strategy (n_instances > 0); Oldest counts free_slots instead. */
    int n_instances;
    int rows;              /* slots per instance: max(1, max_batch_size) */
    sequence_t **slot_seq; /* n_instances x rows: the sequence holding each slot, or NULL */
    int *rows_out;         /* per instance: rows of its batch not yet done (0: it takes the next) */
    item_t **batch;        /* rows: scratch for forming a batch */
    uint64_t delay_ns;     /* max_queue_delay_microseconds, while utilization is below min_util */
    double min_util;
    uint64_t wake_ns; /* a batch waiting for utilization goes then at the latest; 0: none waits */
};

/* sequence.c */
void oi__seq_clear_states(oi_seq_t *q, sequence_t *s);
void oi__seq_free_sequence(oi_seq_t *q, sequence_t *s);
void oi__seq_free_item(item_t *it);
void oi__seq_item_done(oi_job_t *j);
void oi__seq_fail_later(oi_seq_t *q, item_t **failed, item_t *it, oi_status_t *st);
sequence_t *oi__seq_release_slot_locked(oi_seq_t *q, sequence_t *s);
int oi__seq_over(const sequence_t *s);
item_t *oi__seq_pop_head(sequence_t *s);
void oi__seq_drop_unrunnable_locked(oi_seq_t *q, sequence_t *s, item_t **failed);
void oi__seq_finish_failed(item_t *failed);

/* sequence_request.c */
size_t oi__seq_put_flag(const oi_seq_control_t *c, int on, char *p);
oi_status_t *oi__seq_build_request(oi_seq_t *q, sequence_t *s, item_t *it);
void oi__seq_take_outputs(oi_seq_t *q, sequence_t *s, item_t *it);

/* sequence_direct.c */
void oi__seq_dispatch_locked(oi_seq_t *q, int inst, item_t **failed);
void oi__seq_row_done_locked(oi_seq_t *q, int inst, item_t **failed);

#endif
