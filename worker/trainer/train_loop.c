/*
 * train_loop.c: ddp-train's training loop and evaluation, the same for every model, device and
 * ZeRO stage. Each micro-step is one call of the model's compute between ddp_micro_begin() and
 * ddp_micro_end(); each step is ddp_step() at the schedule's learning rate; reports allreduce
 * the loss; an evaluation after each epoch runs the test set, each rank a shard.
 *
 * On a GPU the loop stays asynchronous: the host waits for the device only when it takes the
 * model's sums (a report, an evaluation) or a step's info (a report).
 *
 * With --checkpoint-dir the run saves a checkpoint after its last step (unless that step's
 * periodic save made it already), and SIGTERM (a launcher's graceful stop) ends it early: the
 * handler only sets a flag, the ranks agree after every step whether any of them had it a step
 * earlier (one 4-byte max-allreduce on the host communicator that runs behind the next step's
 * compute), and all stop after the same step, save it and leave by the signal (stop_exit()).
 * Without --checkpoint-dir SIGTERM keeps its default action.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "monoclock.h"
#include "trainer.h"

/* ------------------------------------------------------------------------------------------ */
/* Evaluation                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/*
 * Test loss and accuracy over the whole test set, per prediction (a row's, or for text each of
 * its tokens'): rank r takes the contiguous shard [r * ceil(n / W), ...), in chunks of
 * t->eval_chunk rows, and the sums are allreduced. Every rank
 * runs the same number of forward passes (a short shard ends with empty ones) because each
 * pass gathers the units at ZeRO-3, which is collective. Every rank. Returns 0 or EXIT_FAIL
 * (printed, naming `step`).
 */
static int evaluate(trainer *t, int64_t step, double *loss, double *accuracy)
{
    const data_set *ds = &t->test;
    int per = (ds->n + t->world - 1) / t->world;
    int lo = t->rank * per < ds->n ? t->rank * per : ds->n;
    int hi = lo + per < ds->n ? lo + per : ds->n;
    int chunk = t->eval_chunk, chunks = (per + chunk - 1) / chunk;
    /* The training passes' loss not reported yet waits for the next report. */
    model_stats st;
    t->hook_failed = 0;
    int rc = t->compute->take(t->model, &st);
    if (rc < 0)
        return failed_compute(t, "evaluation", step, rc);
    t->carry_loss += st.loss_sum;
    double sums[3] = {0, 0, 0}; /* loss, correct, predictions */
    for (int c = 0; c < chunks; c++) {
        int start = lo + c * chunk;
        int count = hi - start < chunk ? hi - start : chunk;
        if (count <= 0) { /* an empty pass: its gathers only */
            count = 0;
            start = lo;
        }
        if ((rc = t->compute->eval(t->model, start, count)) < 0 ||
            (rc = t->compute->take(t->model, &st)) < 0)
            return failed_compute(t, "evaluation", step, rc);
        sums[0] += st.loss_sum;
        sums[1] += st.correct;
        sums[2] += st.tokens > 0 ? st.tokens : (double)count * t->preds_per_row;
    }
    if ((rc = coll_allreduce(t->hcomm, sums, sums, 3, COLL_F64, COLL_SUM)) < 0)
        return failed_by(t, "evaluation", step, rc, BY_COMM);
    *loss = sums[0] / sums[2];
    *accuracy = sums[1] / sums[2];
    return 0;
}

/*
 * DDP_TRAIN_TEST_KILL=RANK:STEP[:STOP], for tests that need a rank to die at a known point
 * rather than at a time: on the job's first attempt (TORCHELASTIC_RESTART_COUNT unset or 0),
 * rank RANK (* : any rank that reads it) raises SIGKILL, or SIGSTOP with :STOP, right after
 * step STEP and its checkpoint save. A save is complete only once every rank's writer is
 * known to be done, which takes a collective after the save returns, so a rank killed right
 * after a save leaves that checkpoint torn (no manifest), and the one before it complete (a
 * save first waits for the previous one to complete). Not in --help: not for users.
 */
void test_kill_read(trainer *t)
{
    const char *spec = getenv("DDP_TRAIN_TEST_KILL");
    const char *attempt = getenv("TORCHELASTIC_RESTART_COUNT");
    char rank[16] = "", sig[8] = "KILL";
    t->kill_rank = -1;
    if (!spec || (attempt && strcmp(attempt, "0")) ||
        sscanf(spec, "%15[^:]:%" SCNd64 ":%7s", rank, &t->kill_step, sig) < 2)
        return;
    t->kill_rank = !strcmp(rank, "*") ? -2 : atoi(rank);
    t->kill_sig = !strcmp(sig, "STOP") ? SIGSTOP : SIGKILL;
}

/* ------------------------------------------------------------------------------------------ */
/* Graceful stop                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* The stop signal received (SIGTERM), or 0. Set by the handler only. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
    stop_signal = sig;
}

/* From here on SIGTERM asks for a stop instead of ending the process. Returns 0 or -errno. */
static int stop_catch(void)
{
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    return sigaction(SIGTERM, &sa, NULL) < 0 ? -errno : 0;
}

/*
 * After step `step`: does any rank have a stop signal? The answer is a max-allreduce of a flag
 * over the host communicator, pipelined so that training never waits for it: the one issued
 * after step `step - 1` is waited for here (it ran behind the step's compute) and gives every
 * rank the same answer after the same step; if it says go on, the next one is issued with this
 * rank's flag now (none after the last step). A stop is thus agreed one step after the signal.
 * A rank that died fails it (at once when its connections close, else within --timeout-ms):
 * EXIT_FAIL, printed. Every rank (a world of one only reads its flag). Returns 0 with *stop set,
 * or EXIT_FAIL.
 */
static int stop_agree(trainer *t, int64_t step, int *stop)
{
    if (t->world == 1) {
        *stop = stop_signal != 0;
        return 0;
    }
    int rc = 0;
    if (t->stop_req) {
        rc = coll_wait(t->stop_req);
        t->stop_req = NULL;
        if (rc < 0)
            return failed_by(t, "agreeing whether to stop", step - 1, rc, BY_COMM);
    }
    *stop = t->stop_flags != 0;
    if (!*stop && step < t->total_steps) {
        t->stop_flags = stop_signal != 0;
        rc = coll_iallreduce(t->hcomm, &t->stop_flags, &t->stop_flags, 1, COLL_I32, COLL_MAX,
                             &t->stop_req);
        if (rc < 0)
            return failed_by(t, "agreeing whether to stop", step, rc, BY_COMM);
    }
    return 0;
}

int stop_exit(int sig)
{
    signal(sig, SIG_DFL);
    raise(sig);
    return 128 + sig; /* not reached: the default action of SIGTERM ends the process */
}

/* ------------------------------------------------------------------------------------------ */
/* Training                                                                                    */
/* ------------------------------------------------------------------------------------------ */

int train(trainer *t, double *final_acc, double *train_s)
{
    train_args *a = &t->a;
    /* libddp averages gradients over the ranks, so each rank scales by its own share of the
     * global batch's predictions (a row's, or each token's of a text row): the result is the
     * gradient of the mean loss per prediction over the global batch. */
    const float loss_scale = (float)t->world / ((float)a->global_batch * (float)t->preds_per_row);
    int64_t step = t->start_step;     /* steps taken, by this run and the one it resumes */
    const int async = t->device >= 0; /* ddp_step() is not asked for its info: that would wait */
    int rc = step < t->total_steps
                 ? data_loader_create(&t->train, &t->sampler, (int)(step / t->steps_per_epoch),
                                      (int)(step % t->steps_per_epoch), a->epochs,
                                      (int64_t)t->total_steps, &t->loader)
                 : 0;
    if (rc < 0) {
        train_err("rank %d: %s", t->rank, data_last_error());
        return EXIT_FAIL;
    }
    /* SIGTERM saves and stops (see the top). */
    const int stoppable = a->ckpt_dir != NULL;
    if (stoppable && (rc = stop_catch()) < 0)
        warn("SIGTERM: cannot catch it (%s): it ends the run without a checkpoint", strerror(-rc));

    int64_t interval_steps = 0;
    double t_train = 0;           /* seconds in training steps, evaluation excluded */
    double t_mark = mono_now_s(); /* start of the current stretch of training */
    double t_report = t_train;
    double acc = NAN;
    const data_batch *b;
    while (t->loader && data_loader_next(t->loader, &b) == 0) {
        int last = b->micro == a->grad_accum - 1;
        if ((rc = ddp_micro_begin(t->m, last)) < 0)
            return failed(t, "ddp_micro_begin", step, rc);
        t->hook_failed = 0;
        rc = t->compute->micro(t->model, b, loss_scale);
        int end = ddp_micro_end(t->m); /* surfaces the library's account of a hook's failure */
        if (rc < 0)
            return failed_compute(t, "the forward or backward pass", step, end < 0 ? end : rc);
        if (end < 0)
            return failed(t, "ddp_micro_end", step, end);
        if (!last)
            continue;

        /* On the device the step stays asynchronous: its info is read when reported. */
        float lr = ddp_schedule_lr(&t->sched, step);
        ddp_step_info info = {0};
        if ((rc = ddp_step(t->m, lr, async ? NULL : &info)) < 0)
            return failed(t, "ddp_step", step, rc);
        if (t->dump.lr)
            dump_record(t, b, step, lr);
        step++;
        interval_steps++;
        int epoch_end = b->step == t->steps_per_epoch - 1;
        int report = step % a->log_every == 0 || epoch_end || step == t->total_steps;
        if (report && async && (rc = ddp_step_info_get(t->m, &info)) < 0)
            return failed(t, "ddp_step", step - 1, rc);
        if (info.skipped && t->rank == 0)
            warn("%sstep %" PRId64 " skipped: the gradient norm is %g", t->tty ? "\r\033[K" : "",
                 step, info.grad_norm);

        if (report) {
            model_stats st;
            if ((rc = t->compute->take(t->model, &st)) < 0)
                return failed_compute(t, "the loss", step, rc);
            double now = mono_now_s(); /* after take(), which waits for the device */
            t_train += now - t_mark;
            double sum = st.loss_sum + t->carry_loss;
            t->carry_loss = 0;
            if ((rc = coll_allreduce(t->hcomm, &sum, &sum, 1, COLL_F64, COLL_SUM)) < 0)
                return failed_by(t, "the loss allreduce", step, rc, BY_COMM);
            double loss = sum / ((double)interval_steps * a->global_batch * t->preds_per_row);
            double rate = (double)interval_steps * a->global_batch / (t_train - t_report);
            double eta = (t->total_steps - step) * (t_train / (double)(step - t->start_step));
            if (t->rank == 0)
                report_step(t, step, b->epoch, loss, lr, info.grad_norm, rate, eta);
            interval_steps = 0;
            t_report = t_train;
            t_mark = mono_now_s();
        }
        if (epoch_end || step == t->total_steps) {
            t_train += mono_now_s() - t_mark;
            double test_loss;
            if ((rc = evaluate(t, step, &test_loss, &acc)) != 0)
                return rc;
            if (t->rank == 0)
                report_epoch(t, step, b->epoch, test_loss, acc);
            t_mark = mono_now_s();
        }
        int stop = 0;
        if (stoppable && (rc = stop_agree(t, step, &stop)) != 0)
            return rc;
        /* The periodic saves, the last step's and a stop's (one save per step at most). */
        if (a->ckpt_dir &&
            ((a->ckpt_every && step % a->ckpt_every == 0) || step == t->total_steps || stop)) {
            if ((rc = save_checkpoint(t, step)) != 0)
                return rc;
        }
        if (step == t->kill_step && (t->rank == t->kill_rank || t->kill_rank == -2))
            raise(t->kill_sig);
        if (stop && step < t->total_steps) {
            t->stopped = SIGTERM;
            break;
        }
    }
    if (isnan(acc) && !t->stopped) { /* resumed at or past the last step: still report */
        double test_loss;
        if ((rc = evaluate(t, step, &test_loss, &acc)) != 0)
            return rc;
        if (t->rank == 0)
            report_epoch(t, step, (int)((step - 1) / t->steps_per_epoch), test_loss, acc);
    }
    /* The last save completes (its manifest is written) before the run ends. A failed save
     * does not stop training (libddp logged it, on every rank, and the next one tries again);
     * the last one's failure is the run's, once it has done the rest. */
    if (a->ckpt_dir && (rc = ddp_checkpoint_wait(t->m)) < 0) {
        if (ddp_model_broken(t->m))
            return failed(t, "the last checkpoint", step, rc);
        char newest[PATH_MAX];
        int found = ddp_checkpoint_latest(a->ckpt_dir, newest, sizeof newest, NULL, NULL);
        train_err("rank %d: %s, but the last save failed: %s; %s%s", t->rank,
                  t->stopped ? "stopped by SIGTERM" : "trained", ddp_last_error(t->m),
                  found == 1 ? "the newest complete checkpoint is "
                             : "no complete checkpoint remains",
                  found == 1 ? newest : "");
        t->last_save_failed = 1;
    } else if (t->stopped && t->rank == 0) {
        char saved[PATH_MAX];
        if (ddp_checkpoint_latest(a->ckpt_dir, saved, sizeof saved, NULL, NULL) != 1)
            snprintf(saved, sizeof saved, "under %s", a->ckpt_dir);
        fprintf(stderr,
                "%sddp-train: SIG%s: all ranks stopped after step %" PRId64 " of %" PRId64
                "; checkpoint %s saved (--resume auto continues from it)\n",
                t->tty ? "\r\033[K" : "", sigabbrev_np(t->stopped), step, t->total_steps, saved);
    }
    *final_acc = acc;
    *train_s = t_train;
    return EXIT_OK;
}
