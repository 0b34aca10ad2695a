/*
 * Failure settlement as a pure decision: which rank a failed operation blames, and with which
 * code, from the evidence gathered so far. No I/O, no clock, no printing, no allocation: comm.c
 * asks the store the questions this file names (coll__settle() returns them one at a time),
 * writes the answers into the evidence and calls again, until a verdict comes back; then it
 * formats the message. Unit tests drive it with fake store answers
 * (tests/libcollective/test_settle.c).
 *
 * The rules (libcollective(3), FAILURES):
 *  - an operation of an aborted communicator that ended with -ECANCELED blames this rank;
 *  - failures other than a timeout or a remote failure (bad arguments, socket errors, NCCL or
 *    CUDA errors) keep their code and the rank the failed call named;
 *  - otherwise a collective first publishes how far this rank got (its index k), so that
 *    others can tell it took part;
 *  - direct evidence (a rank on this host died) is recorded at once as COLL_EREMOTE naming it;
 *  - any other evidence first reads the failure record, waiting 3 s for it when a rank on
 *    this host marked the segment failed (it records before it marks), 1 s when a socket
 *    closed (the peer may have recorded before it went), not at all after a timeout; a record
 *    found is adopted as it stands;
 *  - with no record, a closed socket with a known peer is recorded as COLL_EREMOTE naming that
 *    peer; anything else is a timeout, which for a collective blames the lowest rank whose
 *    progress is missing or behind k after a grace period (the guess if every rank got there);
 *  - recording is first-writer-wins: the verdict is what the store holds afterwards;
 *  - when the store cannot be reached the verdict falls back on local knowledge: the segment's
 *    culprit after an abort seen in the segment, else the guess, and the code the evidence
 *    implies (-ETIMEDOUT after a timeout, COLL_EREMOTE otherwise).
 *
 * Invariants: coll__settle() asks each question at most once (every step it returns moves a
 * field of the evidence out of COLL__UNASKED, or sets `published`, once answered), so the
 * driver's loop ends after at most four questions; it never reads progress_of unless progress
 * is COLL__PRESENT.
 */
#include "coll_internal.h"

#include <errno.h>
#include <stddef.h>

/*
 * The lowest rank other than this one whose progress after the grace is missing or short of
 * k: it did not reach the operation. `guess` when every rank reached it. Ranks whose progress
 * could not be read (COLL__PROGRESS_UNREAD) are given the benefit of the doubt.
 */
static int blame_by_progress(const coll__evidence *ev)
{
    for (int r = 0; r < ev->world; r++) {
        int64_t p = ev->progress_of[r];
        if (r == ev->rank || p == COLL__PROGRESS_UNREAD)
            continue;
        if (p == COLL__PROGRESS_ABSENT || (uint64_t)p < ev->k)
            return r;
    }
    return ev->guess;
}

static coll__settle_step done(coll__verdict *out, int culprit, int code)
{
    out->culprit = culprit;
    out->code = code;
    out->wait_ms = 0;
    return COLL__SETTLE_DONE;
}

coll__settle_step coll__settle(const coll__evidence *ev, coll__verdict *out)
{
    if (ev->rc == -ECANCELED && ev->aborted)
        return done(out, ev->rank, ev->rc);
    if (ev->rc != -ETIMEDOUT && ev->rc != COLL_EREMOTE)
        return done(out, ev->guess, ev->rc);

    if (ev->collective && !ev->published) {
        out->wait_ms = 0;
        return COLL__SETTLE_PUBLISH;
    }

    /* What someone else recorded: not looked for when a rank of this host died. */
    if (ev->kind != COLL__EV_DEAD) {
        if (ev->record == COLL__UNASKED) {
            out->wait_ms = ev->kind == COLL__EV_ABORTED  ? 3 * COLL__BLAME_GRACE_MS
                           : ev->kind == COLL__EV_CLOSED ? COLL__BLAME_GRACE_MS
                                                         : 0;
            return COLL__SETTLE_READ_RECORD;
        }
        if (ev->record == COLL__UNREACHABLE)
            return done(out, ev->kind == COLL__EV_ABORTED ? ev->segment_culprit : ev->guess,
                        ev->kind == COLL__EV_TIMEOUT ? -ETIMEDOUT : COLL_EREMOTE);
        if (ev->record == COLL__PRESENT)
            return done(out, ev->found.rank, ev->found.code);
    }

    /* No record: this rank's own verdict, to be recorded. */
    int culprit, code;
    if (ev->kind == COLL__EV_DEAD || (ev->kind == COLL__EV_CLOSED && ev->guess >= 0)) {
        culprit = ev->guess;
        code = COLL_EREMOTE;
    } else {
        code = -ETIMEDOUT;
        culprit = ev->guess;
        if (ev->collective) {
            if (ev->progress == COLL__UNASKED) {
                out->wait_ms = COLL__BLAME_GRACE_MS;
                return COLL__SETTLE_READ_PROGRESS;
            }
            if (ev->progress == COLL__PRESENT)
                culprit = blame_by_progress(ev);
        }
    }
    if (ev->written == COLL__UNASKED) {
        out->culprit = culprit;
        out->code = code;
        out->wait_ms = 0;
        return COLL__SETTLE_WRITE_RECORD;
    }
    if (ev->written == COLL__PRESENT)
        return done(out, ev->held.rank, ev->held.code);
    return done(out, culprit, code);
}

const char *coll__settle_step_name(coll__settle_step step)
{
    switch (step) {
    case COLL__SETTLE_DONE:
        return "done";
    case COLL__SETTLE_PUBLISH:
        return "publish progress";
    case COLL__SETTLE_READ_RECORD:
        return "read the failure record";
    case COLL__SETTLE_READ_PROGRESS:
        return "read every rank's progress";
    case COLL__SETTLE_WRITE_RECORD:
        return "write the failure record";
    }
    return "?";
}

const char *coll__evkind_name(coll__evkind kind)
{
    switch (kind) {
    case COLL__EV_TIMEOUT:
        return "timeout";
    case COLL__EV_DEAD:
        return "dead";
    case COLL__EV_CLOSED:
        return "closed";
    case COLL__EV_ABORTED:
        return "aborted";
    }
    return "?";
}
