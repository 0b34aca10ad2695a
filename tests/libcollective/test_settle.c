/*
 * Unit tests of libcollective's failure settlement (settle.c): the pure decision, driven over
 * fake store answers, with no store, sockets or processes.
 *
 * A fake store holds what the real one would: a failure record or none, each rank's progress,
 * and whether it can be reached at all (separately for reads and for the set-once write, so
 * that a store lost between two questions is covered). A driver plays comm.c's part: it calls
 * coll__settle(), answers each question from the fake store, and logs the questions in order,
 * so every case checks both the verdict and the exact conversation (which questions, with
 * which waits, and what would have been written). Every branch of coll__settle() is reached:
 * the aborted and pass-through codes; each evidence kind with a record present, absent or
 * unreachable; blame by progress (missing, behind, unreadable, all present, own slot ignored,
 * progress unavailable); first writer wins; and a sweep over every combination checks that no
 * question is asked twice and the conversation ends.
 */
#include <check.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "coll_internal.h"
#include "check_main.h"

#define MAXW 16

/* What the store holds and how it answers. */
typedef struct fake_store {
    bool down;              /* every question fails: UNREACHABLE */
    bool write_down;        /* the set-once write fails (reads still work) */
    bool has_record;        /* "<prefix>/failed" exists before settling */
    coll__failure record;   /* ... its value */
    int record_after_ms;    /* > 0: the record appears only to a read waiting this long */
    bool progress_nomem;    /* the driver cannot allocate the progress array */
    int64_t progress[MAXW]; /* each rank's published progress, or COLL__PROGRESS_* */
} fake_store;

/* The conversation: the questions asked, with their waits and what would be written. */
typedef struct transcript {
    int n;
    coll__settle_step steps[8];
    int waits[8];
    coll__failure written; /* the verdict WRITE_RECORD proposed */
    bool published;
} transcript;

/* Plays comm.c's settle(): answers each question from the fake store until DONE. */
static coll__verdict drive(coll__evidence *ev, fake_store *st, transcript *t)
{
    coll__verdict v;
    coll__settle_step step;
    int64_t progress[MAXW];
    memset(t, 0, sizeof *t);
    while ((step = coll__settle(ev, &v)) != COLL__SETTLE_DONE) {
        ck_assert_msg(t->n < 8, "settling does not end");
        for (int i = 0; i < t->n; i++)
            ck_assert_msg(t->steps[i] != step, "asked \"%s\" twice", coll__settle_step_name(step));
        t->steps[t->n] = step;
        t->waits[t->n++] = v.wait_ms;
        switch (step) {
        case COLL__SETTLE_PUBLISH:
            if (!st->down)
                st->progress[ev->rank] = (int64_t)ev->k;
            t->published = true;
            ev->published = true;
            break;
        case COLL__SETTLE_READ_RECORD:
            if (st->down)
                ev->record = COLL__UNREACHABLE;
            else if (st->has_record && v.wait_ms >= st->record_after_ms)
                ev->record = COLL__PRESENT, ev->found = st->record;
            else
                ev->record = COLL__ABSENT;
            break;
        case COLL__SETTLE_READ_PROGRESS:
            if (st->down || st->progress_nomem) {
                ev->progress = COLL__UNREACHABLE;
                break;
            }
            memcpy(progress, st->progress, sizeof progress);
            ev->progress = COLL__PRESENT;
            ev->progress_of = progress;
            break;
        case COLL__SETTLE_WRITE_RECORD:
            t->written = (coll__failure){v.culprit, v.code};
            if (st->down || st->write_down) {
                ev->written = COLL__UNREACHABLE;
            } else {
                if (!st->has_record) {
                    st->has_record = true;
                    st->record = t->written;
                    st->record_after_ms = 0;
                }
                ev->written = COLL__PRESENT;
                ev->held = st->record;
            }
            break;
        case COLL__SETTLE_DONE:
            break;
        }
    }
    ev->progress_of = NULL; /* the driver's array goes out of scope */
    return v;
}

/* A store where every rank of `world` reached collective k. */
static void store_all_reached(fake_store *st, int world, uint64_t k)
{
    memset(st, 0, sizeof *st);
    for (int r = 0; r < MAXW; r++)
        st->progress[r] = r < world ? (int64_t)k : COLL__PROGRESS_ABSENT;
}

/* Evidence of rank `rank` of `world` failing collective k with rc, seen as `kind`. */
static coll__evidence evidence(int rank, int world, uint64_t k, int rc, coll__evkind kind,
                               int guess)
{
    return (coll__evidence){
        .rank = rank,
        .world = world,
        .k = k,
        .collective = true,
        .rc = rc,
        .kind = kind,
        .guess = guess,
        .segment_culprit = -1,
    };
}

#define ASSERT_STEPS(t, ...)                                                                       \
    do {                                                                                           \
        coll__settle_step want_[] = {__VA_ARGS__};                                                 \
        int nwant_ = (int)(sizeof want_ / sizeof want_[0]);                                        \
        ck_assert_int_eq((t).n, nwant_);                                                           \
        for (int i_ = 0; i_ < nwant_; i_++)                                                        \
            ck_assert_msg((t).steps[i_] == want_[i_], "step %d: asked \"%s\", expected \"%s\"",    \
                          i_, coll__settle_step_name((t).steps[i_]),                               \
                          coll__settle_step_name(want_[i_]));                                      \
    } while (0)

#define ASSERT_VERDICT(v, want_rank, want_code)                                                    \
    do {                                                                                           \
        ck_assert_int_eq((v).culprit, (want_rank));                                                \
        ck_assert_int_eq((v).code, (want_code));                                                   \
    } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Codes settled without the store                                                             */
/* ------------------------------------------------------------------------------------------ */

/* coll_comm_abort() on this communicator: -ECANCELED naming this rank, nothing asked. */
START_TEST(aborted_here_blames_self)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 4, 3);
    coll__evidence ev = evidence(2, 4, 3, -ECANCELED, COLL__EV_TIMEOUT, 1);
    ev.aborted = true;
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 2, -ECANCELED);
    ck_assert_int_eq(t.n, 0);
}
END_TEST

/* Failures that are not a peer's (or a cancel without an abort) keep their code and guess. */
START_TEST(other_codes_pass_through)
{
    const int codes[] = {-ECANCELED, -EMSGSIZE, -ECONNREFUSED, -ENOMEM, COLL_ENCCL, COLL_ECUDA};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        for (int kind = COLL__EV_TIMEOUT; kind <= COLL__EV_ABORTED; kind++) {
            fake_store st;
            transcript t;
            store_all_reached(&st, 3, 0);
            coll__evidence ev = evidence(0, 3, 0, codes[i], (coll__evkind)kind, 2);
            coll__verdict v = drive(&ev, &st, &t);
            ASSERT_VERDICT(v, 2, codes[i]);
            ck_assert_int_eq(t.n, 0);
        }
    }
    /* -EMSGSIZE on an aborted communicator is still -EMSGSIZE. */
    fake_store st;
    transcript t;
    store_all_reached(&st, 2, 0);
    coll__evidence ev = evidence(0, 2, 0, -EMSGSIZE, COLL__EV_TIMEOUT, 1);
    ev.aborted = true;
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 1, -EMSGSIZE);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Timeouts: blame by progress                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* The skipper never published: every waiting rank blames it (coll-check's timeout case). */
START_TEST(timeout_blames_the_skipper)
{
    for (int self = 0; self < 4; self++) {
        if (self == 1)
            continue;
        fake_store st;
        transcript t;
        store_all_reached(&st, 4, 7);
        st.progress[1] = COLL__PROGRESS_ABSENT;
        st.progress[self] = COLL__PROGRESS_ABSENT; /* not yet: publishing is asked for */
        /* The wait that timed out watched a neighbour that was itself waiting. */
        coll__evidence ev = evidence(self, 4, 7, -ETIMEDOUT, COLL__EV_TIMEOUT, (self + 1) % 4);
        coll__verdict v = drive(&ev, &st, &t);
        ASSERT_VERDICT(v, 1, -ETIMEDOUT);
        ASSERT_STEPS(t, COLL__SETTLE_PUBLISH, COLL__SETTLE_READ_RECORD, COLL__SETTLE_READ_PROGRESS,
                     COLL__SETTLE_WRITE_RECORD);
        ck_assert_int_eq(t.waits[1], 0);                    /* a plain check of the record */
        ck_assert_int_eq(t.waits[2], COLL__BLAME_GRACE_MS); /* a grace for the progress */
        ck_assert_int_eq(t.written.rank, 1);
        ck_assert_int_eq(t.written.code, -ETIMEDOUT);
        ck_assert_int_eq(st.progress[self], 7);
    }
}
END_TEST

/* A rank that published an earlier collective's index did not reach this one. */
START_TEST(timeout_blames_lowest_behind_or_missing)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 6, 10);
    st.progress[4] = 9;                     /* failed in an earlier collective */
    st.progress[5] = COLL__PROGRESS_ABSENT; /* silent */
    coll__evidence ev = evidence(0, 6, 10, -ETIMEDOUT, COLL__EV_TIMEOUT, 3);
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 4, -ETIMEDOUT);

    store_all_reached(&st, 6, 10);
    st.progress[2] = COLL__PROGRESS_ABSENT;
    st.progress[4] = 0;
    ev = evidence(5, 6, 10, -ETIMEDOUT, COLL__EV_TIMEOUT, 3);
    v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 2, -ETIMEDOUT);

    /* A later index (a rank that went on) is not behind. */
    store_all_reached(&st, 3, 10);
    st.progress[1] = 11;
    st.progress[2] = COLL__PROGRESS_ABSENT;
    ev = evidence(0, 3, 10, -ETIMEDOUT, COLL__EV_TIMEOUT, 1);
    v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 2, -ETIMEDOUT);
}
END_TEST

/* Everyone got there (or could not be read): the failed wait's guess stands. */
START_TEST(timeout_all_reached_keeps_guess)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 4, 5);
    coll__evidence ev = evidence(0, 4, 5, -ETIMEDOUT, COLL__EV_TIMEOUT, 3);
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 3, -ETIMEDOUT);

    store_all_reached(&st, 4, 5);
    st.progress[1] = COLL__PROGRESS_UNREAD;
    st.progress[2] = COLL__PROGRESS_UNREAD;
    ev = evidence(0, 4, 5, -ETIMEDOUT, COLL__EV_TIMEOUT, -1);
    v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, -1, -ETIMEDOUT);
    ck_assert_int_eq(t.written.rank, -1);
}
END_TEST

/* Its own slot is never blamed, even when the store lost it. */
START_TEST(timeout_ignores_own_slot)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 3, 4);
    st.down = false;
    coll__evidence ev = evidence(1, 3, 4, -ETIMEDOUT, COLL__EV_TIMEOUT, 2);
    ev.published = true; /* published earlier; the store answers it is missing */
    st.progress[1] = COLL__PROGRESS_ABSENT;
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 2, -ETIMEDOUT);
    ASSERT_STEPS(t, COLL__SETTLE_READ_RECORD, COLL__SETTLE_READ_PROGRESS,
                 COLL__SETTLE_WRITE_RECORD);

    /* Rank 0 of 1 cannot blame anyone but its guess. */
    store_all_reached(&st, 1, 0);
    ev = evidence(0, 1, 0, -ETIMEDOUT, COLL__EV_TIMEOUT, -1);
    v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, -1, -ETIMEDOUT);
}
END_TEST

/* Index comparisons are unsigned and 64-bit. */
START_TEST(timeout_large_indices)
{
    fake_store st;
    transcript t;
    uint64_t k = (uint64_t)1 << 40;
    store_all_reached(&st, 3, k);
    st.progress[2] = (int64_t)(k - 1);
    coll__evidence ev = evidence(0, 3, k, -ETIMEDOUT, COLL__EV_TIMEOUT, 1);
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 2, -ETIMEDOUT);
}
END_TEST

/* No progress to compare (out of memory): the guess. */
START_TEST(timeout_progress_unavailable)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 4, 2);
    st.progress[3] = COLL__PROGRESS_ABSENT;
    st.progress_nomem = true;
    coll__evidence ev = evidence(0, 4, 2, -ETIMEDOUT, COLL__EV_TIMEOUT, 1);
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 1, -ETIMEDOUT);
    ASSERT_STEPS(t, COLL__SETTLE_PUBLISH, COLL__SETTLE_READ_RECORD, COLL__SETTLE_READ_PROGRESS,
                 COLL__SETTLE_WRITE_RECORD);
}
END_TEST

/* Send and receive publish no progress and compare none: their guess is recorded. */
START_TEST(timeout_p2p_records_guess)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 4, 3);
    st.progress[1] = COLL__PROGRESS_ABSENT;
    coll__evidence ev = evidence(0, 4, 3, -ETIMEDOUT, COLL__EV_TIMEOUT, 2);
    ev.collective = false;
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 2, -ETIMEDOUT);
    ASSERT_STEPS(t, COLL__SETTLE_READ_RECORD, COLL__SETTLE_WRITE_RECORD);
    ck_assert(!t.published);
}
END_TEST

/* A record already there (another rank settled first) is adopted as it stands. */
START_TEST(timeout_adopts_existing_record)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 4, 3);
    st.progress[2] = COLL__PROGRESS_ABSENT;
    st.has_record = true;
    st.record = (coll__failure){3, COLL_EREMOTE};
    coll__evidence ev = evidence(0, 4, 3, -ETIMEDOUT, COLL__EV_TIMEOUT, 1);
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 3, COLL_EREMOTE);
    ASSERT_STEPS(t, COLL__SETTLE_PUBLISH, COLL__SETTLE_READ_RECORD);
}
END_TEST

/* Two ranks settle at once: the one that writes second adopts the first's record. */
START_TEST(first_writer_wins)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 4, 3);
    st.progress[2] = COLL__PROGRESS_ABSENT;
    /* The other rank's record lands between our read and our write. */
    st.has_record = true;
    st.record = (coll__failure){1, COLL_EREMOTE};
    st.record_after_ms = 1 << 30; /* our read does not see it */
    coll__evidence ev = evidence(0, 4, 3, -ETIMEDOUT, COLL__EV_TIMEOUT, 1);
    coll__verdict v = drive(&ev, &st, &t);
    ck_assert_int_eq(t.written.rank, 2);
    ck_assert_int_eq(t.written.code, -ETIMEDOUT);
    ASSERT_VERDICT(v, 1, COLL_EREMOTE);

    /* The same for a death seen on this host. */
    store_all_reached(&st, 4, 3);
    st.has_record = true;
    st.record = (coll__failure){0, COLL_EREMOTE};
    ev = evidence(1, 4, 3, COLL_EREMOTE, COLL__EV_DEAD, 2);
    v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 0, COLL_EREMOTE);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Remote failures                                                                             */
/* ------------------------------------------------------------------------------------------ */

/* A rank of this host died: recorded at once naming it, no record read, no grace. */
START_TEST(dead_blames_the_victim)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 4, 6);
    st.progress[2] = COLL__PROGRESS_ABSENT;
    coll__evidence ev = evidence(0, 4, 6, COLL_EREMOTE, COLL__EV_DEAD, 2);
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 2, COLL_EREMOTE);
    ASSERT_STEPS(t, COLL__SETTLE_PUBLISH, COLL__SETTLE_WRITE_RECORD);
    ck_assert_int_eq(t.written.rank, 2);
    ck_assert_int_eq(t.written.code, COLL_EREMOTE);

    /* A send to it: nothing published. */
    store_all_reached(&st, 4, 6);
    ev = evidence(0, 4, 6, COLL_EREMOTE, COLL__EV_DEAD, 2);
    ev.collective = false;
    v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 2, COLL_EREMOTE);
    ASSERT_STEPS(t, COLL__SETTLE_WRITE_RECORD);

    /* The store went away: our own verdict stands. */
    store_all_reached(&st, 4, 6);
    st.down = true;
    ev = evidence(3, 4, 6, COLL_EREMOTE, COLL__EV_DEAD, 2);
    v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 2, COLL_EREMOTE);
}
END_TEST

/* A socket closed and nobody recorded why within a second: the peer died. */
START_TEST(closed_blames_the_peer)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 4, 1);
    coll__evidence ev = evidence(0, 4, 1, COLL_EREMOTE, COLL__EV_CLOSED, 2);
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 2, COLL_EREMOTE);
    ASSERT_STEPS(t, COLL__SETTLE_PUBLISH, COLL__SETTLE_READ_RECORD, COLL__SETTLE_WRITE_RECORD);
    ck_assert_int_eq(t.waits[1], COLL__BLAME_GRACE_MS);
}
END_TEST

/* A closed socket whose peer is unknown is settled like a timeout. */
START_TEST(closed_unknown_peer_is_a_timeout)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 4, 1);
    st.progress[3] = COLL__PROGRESS_ABSENT;
    coll__evidence ev = evidence(0, 4, 1, COLL_EREMOTE, COLL__EV_CLOSED, -1);
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 3, -ETIMEDOUT);
    ASSERT_STEPS(t, COLL__SETTLE_PUBLISH, COLL__SETTLE_READ_RECORD, COLL__SETTLE_READ_PROGRESS,
                 COLL__SETTLE_WRITE_RECORD);
    ck_assert_int_eq(t.waits[1], COLL__BLAME_GRACE_MS);
}
END_TEST

/*
 * coll_comm_abort() on rank 3 recorded "3 COLL_EREMOTE" before shutting its sockets and marking
 * its segment: a rank of another host (socket closed) and one of its own host (segment marked)
 * both adopt it, even though each one's own wait named someone else.
 */
START_TEST(abort_blames_the_aborter)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 4, 2);
    st.has_record = true;
    st.record = (coll__failure){3, COLL_EREMOTE};
    st.record_after_ms = 200; /* recorded while the reader waited */
    coll__evidence ev = evidence(0, 4, 2, COLL_EREMOTE, COLL__EV_CLOSED, 1);
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 3, COLL_EREMOTE);
    ASSERT_STEPS(t, COLL__SETTLE_PUBLISH, COLL__SETTLE_READ_RECORD);

    store_all_reached(&st, 4, 2);
    st.has_record = true;
    st.record = (coll__failure){3, COLL_EREMOTE};
    st.record_after_ms = 2500; /* later than a closed socket waits, within an abort's wait */
    ev = evidence(2, 4, 2, COLL_EREMOTE, COLL__EV_ABORTED, 1);
    ev.segment_culprit = 3;
    v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 3, COLL_EREMOTE);
    ASSERT_STEPS(t, COLL__SETTLE_PUBLISH, COLL__SETTLE_READ_RECORD);
    ck_assert_int_eq(t.waits[1], 3 * COLL__BLAME_GRACE_MS);
}
END_TEST

/* A segment marked failed without a record (the marker could not record): a timeout. */
START_TEST(aborted_segment_without_record)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 4, 2);
    st.progress[1] = COLL__PROGRESS_ABSENT;
    coll__evidence ev = evidence(2, 4, 2, COLL_EREMOTE, COLL__EV_ABORTED, 3);
    ev.segment_culprit = 3;
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 1, -ETIMEDOUT);
    ASSERT_STEPS(t, COLL__SETTLE_PUBLISH, COLL__SETTLE_READ_RECORD, COLL__SETTLE_READ_PROGRESS,
                 COLL__SETTLE_WRITE_RECORD);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* No store                                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* Unreachable store: local knowledge and the code the evidence implies; nothing written. */
START_TEST(unreachable_store_falls_back)
{
    struct {
        coll__evkind kind;
        int rc, guess, segment, want_rank, want_code;
    } cases[] = {
        {COLL__EV_TIMEOUT, -ETIMEDOUT, 1, -1, 1, -ETIMEDOUT},
        {COLL__EV_TIMEOUT, -ETIMEDOUT, -1, 2, -1, -ETIMEDOUT},
        {COLL__EV_CLOSED, COLL_EREMOTE, 2, -1, 2, COLL_EREMOTE},
        {COLL__EV_CLOSED, COLL_EREMOTE, -1, -1, -1, COLL_EREMOTE},
        {COLL__EV_ABORTED, COLL_EREMOTE, 1, 3, 3, COLL_EREMOTE},
        {COLL__EV_ABORTED, COLL_EREMOTE, 1, -1, -1, COLL_EREMOTE},
        /* A timeout seen as an abort in the segment (the code is the evidence's, not rc's). */
        {COLL__EV_ABORTED, -ETIMEDOUT, 1, 0, 0, COLL_EREMOTE},
        {COLL__EV_CLOSED, -ETIMEDOUT, 1, -1, 1, COLL_EREMOTE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fake_store st;
        transcript t;
        store_all_reached(&st, 4, 9);
        st.down = true;
        coll__evidence ev = evidence(0, 4, 9, cases[i].rc, cases[i].kind, cases[i].guess);
        ev.segment_culprit = cases[i].segment;
        coll__verdict v = drive(&ev, &st, &t);
        ck_assert_msg(v.culprit == cases[i].want_rank && v.code == cases[i].want_code,
                      "case %zu: got rank %d code %d", i, v.culprit, v.code);
        ASSERT_STEPS(t, COLL__SETTLE_PUBLISH, COLL__SETTLE_READ_RECORD);
    }
}
END_TEST

/* The record could be read (absent) but not written: our own verdict. */
START_TEST(unwritable_record_keeps_own_verdict)
{
    fake_store st;
    transcript t;
    store_all_reached(&st, 4, 9);
    st.progress[2] = COLL__PROGRESS_ABSENT;
    st.write_down = true;
    coll__evidence ev = evidence(0, 4, 9, -ETIMEDOUT, COLL__EV_TIMEOUT, 1);
    coll__verdict v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 2, -ETIMEDOUT);

    store_all_reached(&st, 4, 9);
    st.write_down = true;
    ev = evidence(0, 4, 9, COLL_EREMOTE, COLL__EV_CLOSED, 3);
    v = drive(&ev, &st, &t);
    ASSERT_VERDICT(v, 3, COLL_EREMOTE);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Every combination                                                                           */
/* ------------------------------------------------------------------------------------------ */

/*
 * Over every kind, code, abort flag, collective or not, guess, and store behaviour: the
 * conversation ends without asking a question twice (drive() checks), the verdict's code is
 * the operation's, a timeout, a remote failure or the record's, and a verdict that was written
 * is the one the store holds afterwards.
 */
START_TEST(every_combination_ends)
{
    const int codes[] = {-ETIMEDOUT, COLL_EREMOTE, -ECANCELED, -EMSGSIZE};
    int n = 0;
    for (int kind = COLL__EV_TIMEOUT; kind <= COLL__EV_ABORTED; kind++)
        for (size_t ci = 0; ci < sizeof codes / sizeof codes[0]; ci++)
            for (int flags = 0; flags < 1 << 8; flags++) {
                fake_store st;
                transcript t;
                store_all_reached(&st, 5, 4);
                bool aborted = flags & 1, coll = flags & 2;
                st.down = flags & 4;
                st.write_down = flags & 8;
                st.has_record = flags & 16;
                st.record = (coll__failure){4, COLL_EREMOTE};
                st.record_after_ms = flags & 32 ? 1 << 30 : 0;
                if (flags & 64)
                    st.progress[3] = COLL__PROGRESS_ABSENT;
                int guess = flags & 128 ? 1 : -1;
                coll__evidence ev = evidence(0, 5, 4, codes[ci], (coll__evkind)kind, guess);
                ev.aborted = aborted;
                ev.collective = coll;
                ev.segment_culprit = 2;
                coll__verdict v = drive(&ev, &st, &t);
                ck_assert(v.code == codes[ci] || v.code == -ETIMEDOUT || v.code == COLL_EREMOTE);
                ck_assert(v.culprit >= -1 && v.culprit < 5);
                if (ev.written == COLL__PRESENT)
                    ck_assert(v.culprit == st.record.rank && v.code == st.record.code);
                if (!coll)
                    ck_assert(!t.published);
                n++;
            }
    ck_assert_int_eq(n, 4 * 4 * 256);
}
END_TEST

START_TEST(names)
{
    for (int s = COLL__SETTLE_DONE; s <= COLL__SETTLE_WRITE_RECORD; s++)
        ck_assert_str_ne(coll__settle_step_name((coll__settle_step)s), "?");
    for (int k = COLL__EV_TIMEOUT; k <= COLL__EV_ABORTED; k++)
        ck_assert_str_ne(coll__evkind_name((coll__evkind)k), "?");
    ck_assert_str_eq(coll__evkind_name((coll__evkind)99), "?");
    ck_assert_str_eq(coll__settle_step_name((coll__settle_step)99), "?");
}
END_TEST

static Suite *settle_suite(void)
{
    Suite *s = suite_create("settle");
    check_tcase(s, "local", 10, aborted_here_blames_self, other_codes_pass_through, names);

    check_tcase(s, "timeout", 10, timeout_blames_the_skipper,
                timeout_blames_lowest_behind_or_missing, timeout_all_reached_keeps_guess,
                timeout_ignores_own_slot, timeout_large_indices, timeout_progress_unavailable,
                timeout_p2p_records_guess, timeout_adopts_existing_record, first_writer_wins);

    check_tcase(s, "remote", 10, dead_blames_the_victim, closed_blames_the_peer,
                closed_unknown_peer_is_a_timeout, abort_blames_the_aborter,
                aborted_segment_without_record);

    check_tcase(s, "no store", 30, unreachable_store_falls_back,
                unwritable_record_keeps_own_verdict, every_combination_ends);
    return s;
}

int main(void)
{
    return check_run(settle_suite());
}
