/*
 * libddp's small exchanges of host values (ddp_internal.h: ddp__host_coll(), ddp__host_icoll()):
 * a few numbers every rank gives or gets (a checkpoint's step, its writers' results, its CRCs)
 * through the model's communicator, which for a device model takes device memory only, so the
 * values go up into device memory and come back down. The asynchronous kind keeps its buffers in
 * the model (m->xch) and runs one exchange at a time. No decision here depends on timing: every
 * rank issues the same exchanges in the same order.
 */
#include "model.h"

#include <assert.h>
#include <errno.h>
#include <string.h>

/* ddp__host_icoll()'s buffers, with no exchange in flight. */
void ddp__xch_release(ddp_model *m)
{
    if (m->xch.host != m->xch.buf)
        m->ops->host_release(&m->dev, m->xch.host);
    m->ops->release(&m->dev, m->xch.buf);
    m->xch.buf = m->xch.host = NULL;
    m->xch.cap = 0;
}

/* One collective, as ddp__host_coll() names it, issued. */
static int run_icoll(ddp_model *m, enum ddp__host_kind kind, const void *in, void *out,
                     size_t count, coll_dtype dt, coll_op op, coll_request **req)
{
    switch (kind) {
    case DDP__HOST_ALLGATHER:
        return coll_iallgather(m->comm, in, out, count, dt, req);
    case DDP__HOST_BROADCAST:
        return coll_ibroadcast(m->comm, in, out, count, dt, 0, req);
    case DDP__HOST_ALLREDUCE:
        return coll_iallreduce(m->comm, in, out, count, dt, op, req);
    }
    return -EINVAL;
}

/* The same, waited for. */
static int run_coll(ddp_model *m, enum ddp__host_kind kind, const void *in, void *out, size_t count,
                    coll_dtype dt, coll_op op)
{
    coll_request *req = NULL;
    int rc = run_icoll(m, kind, in, out, count, dt, op, &req);
    return rc < 0 ? rc : coll_wait(req);
}

/* The bytes an exchange reads on this rank and writes on every rank. */
static void host_coll_bytes(const ddp_model *m, enum ddp__host_kind kind, size_t count,
                            coll_dtype dt, size_t *nin, size_t *nout)
{
    *nin = count * coll_dtype_size(dt);
    *nout = kind == DDP__HOST_ALLGATHER ? *nin * (size_t)m->world : *nin;
}

int ddp__host_coll(ddp_model *m, enum ddp__host_kind kind, const void *in, void *out, size_t count,
                   coll_dtype dt, coll_op op, const char *what)
{
    bool gather = kind == DDP__HOST_ALLGATHER;
    size_t nin, nout;
    host_coll_bytes(m, kind, count, dt, &nin, &nout);
    if (!m->ops->is_device) {
        int rc = run_coll(m, kind, in, out, count, dt, op);
        return rc < 0 ? ddp__coll_failed(m, rc, what) : 0;
    }
    unsigned char *buf = NULL;
    int rc = m->ops->alloc(&m->dev, nout, (void **)&buf);
    unsigned char *mine = gather ? buf + (size_t)m->rank * nin : buf;
    if (rc == 0)
        rc = m->ops->upload(&m->dev, mine, in, nin);
    if (rc < 0) {
        m->ops->release(&m->dev, buf);
        return ddp__dev_check(m, rc, what);
    }
    rc = run_coll(m, kind, mine, buf, count, dt, op);
    if (rc < 0)
        rc = ddp__coll_failed(m, rc, what);
    else
        rc = ddp__dev_check(m, m->ops->download(&m->dev, out, buf, nout), what);
    m->ops->release(&m->dev, buf);
    return rc;
}

int ddp__host_icoll_reserve(ddp_model *m, size_t nbytes)
{
    assert(!m->xch.req);
    if (nbytes <= m->xch.cap)
        return 0;
    ddp__xch_release(m);
    const ddp__ops *o = m->ops;
    int rc = o->alloc(&m->dev, nbytes, (void **)&m->xch.buf);
    m->xch.host = m->xch.buf;
    if (rc == 0 && o->is_device)
        rc = o->host_alloc(&m->dev, nbytes, (void **)&m->xch.host);
    if (rc < 0) {
        ddp__xch_release(m);
        return rc;
    }
    m->xch.cap = nbytes;
    return 0;
}

/*
 * Device models: this rank's input goes up from the page-locked buffer, the collective runs
 * (nccl: on the communication stream; cpu: on the host, which coll_request_stream_wait()
 * then waits for), the result comes down into the page-locked buffer behind it, and a mark
 * ends the exchange. All of it is enqueued on the communication stream after the step's
 * reductions and gathers, whose buffers it does not share. Host models: the collective, in
 * place in the buffer, on libcollective's progress thread.
 */
int ddp__host_icoll(ddp_model *m, enum ddp__host_kind kind, const void *in, size_t count,
                    coll_dtype dt, coll_op op, const char *what)
{
    const ddp__ops *o = m->ops;
    size_t nin, nout;
    host_coll_bytes(m, kind, count, dt, &nin, &nout);
    assert(!m->xch.req && nout <= m->xch.cap);
    size_t at = kind == DDP__HOST_ALLGATHER ? (size_t)m->rank * nin : 0;
    memcpy(m->xch.host + at, in, nin);
    int rc = o->comm_copy(&m->dev, m->xch.buf + at, m->xch.host + at, nin);
    if (rc < 0)
        return ddp__dev_check(m, rc, what);
    rc = run_icoll(m, kind, m->xch.buf + at, m->xch.buf, count, dt, op, &m->xch.req);
    if (rc < 0)
        return ddp__coll_failed(m, rc, what);
    m->xch.what = what;
    if (!o->is_device)
        return 0;
    /* On failure the request stays, released by the wait or ddp_model_free(). */
    if ((rc = coll_request_stream_wait(m->xch.req, m->dev.comm_stream)) < 0)
        return ddp__coll_failed(m, rc, what);
    rc = o->comm_copy(&m->dev, m->xch.host, m->xch.buf, nout);
    if (rc == 0)
        rc = o->comm_mark(&m->dev);
    return ddp__dev_check(m, rc, what);
}

int ddp__host_icoll_wait(ddp_model *m, const void **out)
{
    coll_request *req = m->xch.req;
    assert(req);
    m->xch.req = NULL;
    int rc = m->ops->comm_wait(&m->dev);
    int w = coll_wait(req); /* device: long done; host: the wait */
    if (rc < 0)
        return ddp__dev_check(m, rc, m->xch.what);
    if (w < 0)
        return ddp__coll_failed(m, w, m->xch.what);
    *out = m->xch.host;
    return 0;
}
