/*
 * ddp-train: the reference trainer of libddp. A model (--model, model.h: a multi-layer
 * perceptron by default, model_mlp.c) learns Fashion-MNIST (data.c) with data-parallel steps,
 * DDP or ZeRO-1/2/3, on the host (OpenBLAS) or a GPU (cuBLAS), over libcollective's cpu or
 * nccl backend:
 *
 *     ddprun --standalone --nproc-per-node 2 build/worker/trainer/ddp-train [--zero 2] [--epochs 10]
 *
 * One training loop serves every stage, as libddp is meant to be used (worker/libddp/ddp.h): the
 * model's units are libddp's, and its passes ask for a unit's parameters through hooks that
 * gather it (ZeRO-3), take its gradient buffers and mark them ready as soon as the unit's
 * backward is done, so that the reductions of late units overlap the backward of early ones.
 *
 * Each rank reads the torchrun environment (coll_comm_init_env()); without one it runs alone on a
 * store of its own. Every rank loads the whole data set and trains on its part of each global
 * batch (data.h explains the split), so the result does not depend on the number of ranks.
 * Test accuracy is measured after each epoch over the 10,000 test images, each rank a shard,
 * the sums allreduced. Rank 0 alone prints and writes files.
 *
 * This file is main(): the steps in order, and the exit status with its error record;
 * trainer.h lists the files that do the rest (train_options.c the options).
 *
 * Not here: any data set but IDX images with ten classes.
 *
 * Exit status: 0 trained; 1 bad usage, environment or data; 2 the job failed (store,
 * communicator, a peer, the library), with the culprit rank named when libddp knows it; 3
 * trained, but the last checkpoint save failed (a failed save does not stop training: libddp
 * logs it and the next one tries again). The first error line goes to TORCHELASTIC_ERROR_FILE
 * too, for the launcher's failure summary. Stopped by SIGTERM with --checkpoint-dir: the
 * checkpoint saved, the process ends by SIGTERM itself (train_loop.c).
 */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mlp.h"
#include "monoclock.h"
#include "trainer.h"

/* The first failure train_err() printed: the message of the error record main() leaves at exit. */
static char first_error[1024];

/* trainer.h's "ddp-train: <message>" for a failure; the first is kept in first_error. */
void train_err(const char *fmt, ...)
{
    char line[sizeof first_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    cli_msg(stderr, "ddp-train", "%s", line);
    if (!first_error[0])
        memcpy(first_error, line, sizeof line);
}

/* main()'s exit: after a failure, under a launcher, the first error also goes to its summary. */
static int leave(int status)
{
    if (status != EXIT_OK && first_error[0])
        (void)rdzv_env_record_error(first_error);
    return status;
}

int main(int argc, char **argv)
{
    (void)mlp_blas_select(argv); /* OpenBLAS's fast kernels where it does not know the CPU */
    trainer t = {.t_start = mono_now_s()};
    int status = parse_args(argc, argv, &t.a);
    if (status != 0) {
        free(t.a.model_cfg);
        return status < 0 ? EXIT_OK : leave(status);
    }
    openblas_set_num_threads(t.a.threads);

    test_kill_read(&t);
    if ((status = connect_job(&t)) != 0)
        goto out;
    /* Appended to: a restarted or resumed run keeps the records before it (report_open()). */
    if (t.rank == 0 && t.a.metrics && !(t.metrics = fopen(t.a.metrics, "a"))) {
        train_err("%s: cannot create: %s", t.a.metrics, strerror(errno));
        status = EXIT_USAGE;
        goto out;
    }
    t.tty = t.rank == 0 && isatty(STDERR_FILENO);
    if ((status = setup_data(&t)) != 0 || (status = setup_model(&t)) != 0)
        goto out;
    if (t.rank == 0)
        report_start(&t);
    if ((status = restore(&t)) != 0)
        goto out;
    if (t.a.generate) { /* every rank runs the passes (ZeRO-3 gathers), rank 0 prints */
        int rc = t.a.model->generate(t.model, t.a.generate, t.a.max_new, t.a.temperature,
                                     t.a.seed, t.rank == 0 ? stdout : NULL);
        if (rc < 0)
            status = failed_compute(&t, "generating text", t.start_step, rc);
        goto out;
    }
    if (t.rank == 0 && (status = report_open(&t)) != 0)
        goto out;
    if (t.a.dump_init &&
        (status = dump_params(&t, t.a.dump_init,
                              t.start_step || t.a.init_from ? "ddp-train loaded parameters"
                                                            : "ddp-train initial parameters")) != 0)
        goto out;

    double acc = NAN, train_s = 0;
    if ((status = train(&t, &acc, &train_s)) != 0)
        goto out;
    if (t.stopped) { /* SIGTERM: saved; no final dump or summary (train_loop.c) */
        status = t.last_save_failed ? EXIT_CKPT : EXIT_OK;
        goto out;
    }
    if (t.a.dump_final && (status = dump_params(&t, t.a.dump_final, "ddp-train final parameters")))
        goto out;
    if (t.rank == 0) {
        summary(&t, acc, train_s);
        if (t.a.dump_batches && dump_batches(&t) < 0)
            status = EXIT_FAIL;
    }
    if (status == EXIT_OK && t.last_save_failed)
        status = EXIT_CKPT;
out:
    leave(status); /* first: the teardown of a failed job may not wait for the rest */
    /* After a failure, do not wait for peers that may be gone: abort what is pending. */
    if (status == EXIT_FAIL && t.comm)
        coll_comm_abort(t.comm);
    if (status == EXIT_FAIL && t.hcomm && t.hcomm != t.comm)
        coll_comm_abort(t.hcomm);
    int stopped = t.stopped;
    trainer_free(&t);
    return status == EXIT_OK && stopped ? stop_exit(stopped) : status;
}
