/* The worker process's reader of its socket (backends/process_wire.h): one thread receives
 * every message the server sends and hands it to whoever waits for it: the job loop (JOB), a
 * decoupled response's sender (ACK, STOP), a BLS call (BLS_PART, BLS_END, by the call's id).
 * So several BLS calls of one worker, from threads or an event loop, are in flight at once.
 * Sends need no reader: each is one SOCK_SEQPACKET message, whole whichever thread sends it. */
#ifndef OI_PYTHON_WORKER_MUX_H
#define OI_PYTHON_WORKER_MUX_H

#include "python/numpy_api.h"
#include "backends/process_wire.h"

/* Starts the reader on `sock`; 0, or -1 (errno). */
int oi_wm_start(int sock);

/* Waits for the next JOB and the memfds that came with it (the caller's to close); 0, or -1
 * once the server has gone. */
int oi_wm_next_job(oi_pw_job_t *job, oi_pw_fds_t *fds);

/* Waits for the server's answer to the decoupled response just sent: OI_PW_ACK, or OI_PW_STOP
 * (also when the server has gone). Callers send and wait under one lock of their own. */
uint32_t oi_wm_answer(void);

/* The job whose inputs a BLS request may name (by index, source k in process_bls.h) runs from
 * begin to end. Its end is marked before its last message goes, so a request naming them is
 * always on the wire before the job ends at the server. */
void oi_wm_job_begin(const oi_request_t *req);
void oi_wm_job_end(void);

/* _core.worker_bls(fd, job=None) -> WorkerBlsCall | None: sends the BLS request in memfd `fd`
 * (process_bls.h; the caller keeps fd) as a new call. With `job` (the request names that job's
 * inputs): None, unsent, when that job is no longer the one running. */
PyObject *oi_py_worker_bls(PyObject *self, PyObject *args);
/* _core.worker_job_inputs() -> (job, ((address, byte_size), ...)) | None: the running job's
 * inputs, for a BLS request to name rather than copy. */
PyObject *oi_py_worker_job_inputs(PyObject *self, PyObject *unused);
/* The calls worker_bls makes: next(timeout=-1), fileno(), cancel(). */
extern PyTypeObject oi_py_worker_call_type;

#endif
