/*
 * train_job.c: ddp-train joining its job. The store (the launcher's, or one of its own when it
 * runs alone), this rank's device, the backend every rank agrees on, and the communicators:
 * a cpu one for the trainer's own sums, and libddp's (the same one, or an nccl one beside it).
 * Also the failure reports that name the call, the step and the culprit rank, and the teardown.
 *
 * Not here: what a model computes (model.h) or when (train_loop.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "mlp_cuda.h"
#include "trainer.h"

/*
 * libddp's and libcollective's log hook: warnings only. Their errors come back as return codes
 * with ddp_last_error()'s account, which the program prints once, naming the call and step.
 */
void train_log(void *arg, int level, const char *msg)
{
    if (level == COLL_LOG_WARN)
        warn("rank %d: %s", *(const int *)arg, msg);
}

/* ------------------------------------------------------------------------------------------ */
/* Set-up                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/*
 * This rank's device (ddp-train(1), GPUS): --device cpu, or auto without a GPU or with a model
 * that has no device path, is the host; otherwise GPU LOCAL_RANK modulo the GPUs this process sees,
 * made current with a compute stream of its own. Writes this rank's report for the backend decision
 * into *me. Returns 0 or EXIT_USAGE/EXIT_FAIL (printed).
 */
static int setup_device(trainer *t, const rdzv_env *env, train_gpu_ident *me)
{
    const train_args *a = &t->a;
    memset(me, 0, sizeof *me);
    me->has_nccl = coll_have_nccl();
    t->device = -1;
    if (a->device == DEV_CUDA && !a->model->device) {
        train_err("--device cuda: --model %s computes on the host only", a->model->name);
        return EXIT_USAGE;
    }
    int ndev = a->device == DEV_CPU || !a->model->device ? 0 : mlp_cuda_device_count();
    if (a->device == DEV_CUDA && ndev == 0) {
        train_err("--device cuda: %s", mlp_cuda_built()
                                           ? "no CUDA device is visible to this process"
                                           : "ddp-train was built without CUDA");
        return EXIT_USAGE;
    }
    if (ndev == 0)
        return 0;
    t->device = env->local_rank % ndev;
    if (mlp_cuda_open(t->device, &t->stream, t->gpu_name, sizeof t->gpu_name) < 0 ||
        mlp_cuda_device_uuid(t->device, me->uuid) < 0) {
        train_err("rank %d: GPU %d: %s", t->rank, t->device, mlp_cuda_last_error());
        return EXIT_FAIL;
    }
    me->has_gpu = 1;
    return 0;
}

/*
 * The backend of libddp's communicator, decided alike on every rank: the ranks allgather their
 * reports over the cpu communicator and each applies train_backend_decide() to all of them.
 * Returns 0 or EXIT_USAGE/EXIT_FAIL (printed; --backend nccl where it cannot run fails on every
 * rank, rank 0 saying why).
 */
static int agree_backend(trainer *t, const train_gpu_ident *me)
{
    train_gpu_ident *all = calloc((size_t)t->world, sizeof *all);
    if (!all) {
        train_err("rank %d: out of memory", t->rank);
        return EXIT_FAIL;
    }
    int status = 0;
    int rc = coll_allgather(t->hcomm, me, all, sizeof *me, COLL_U8);
    if (rc < 0) {
        train_err("rank %d: exchanging the GPUs' identities: %s: %s", t->rank, coll_strerror(rc),
                  coll_last_error(t->hcomm));
        status = EXIT_FAIL;
    } else if (train_backend_decide(t->a.backend, all, t->world, &t->backend, t->backend_why,
                                    sizeof t->backend_why) < 0) {
        if (t->rank == 0)
            train_err("--backend nccl: %s; use --backend auto or cpu", t->backend_why);
        status = EXIT_USAGE;
    }
    free(all);
    return status;
}

/*
 * The store, the device and the communicators: the cpu one first (hcomm), through which the
 * ranks agree on the backend, then libddp's (comm): the same one, or an nccl one beside it.
 * Returns 0, EXIT_USAGE or EXIT_FAIL (printed).
 */
int connect_job(trainer *t)
{
    coll_env_options eo;
    coll_env_options_init(&eo);
    eo.name = "ddp-train";
    eo.store_only = true;
    eo.standalone = true;
    coll_env job;
    int rc = coll_comm_init_env(&eo, &job);
    if (rc < 0) {
        train_err("%s", coll_last_error(NULL));
        return rc == -EINVAL || rc == -ENOSPC ? EXIT_USAGE : EXIT_FAIL;
    }
    t->rank = job.env.rank;
    t->world = job.env.world_size;
    t->attempt = job.env.restart_count;
    t->store = job.store; /* trainer_free() releases both */
    t->own_store = job.server;
    char prefix[sizeof job.prefix + 8];
    snprintf(prefix, sizeof prefix, "%s", job.prefix);
    coll_options opts;
    coll_options_init(&opts);
    opts.timeout_ms = t->a.timeout_ms;
    opts.log = train_log;
    opts.log_arg = &t->rank;
    const char *which = "cpu";
    rc =
        coll_comm_init(t->store, prefix, t->rank, t->world, COLL_BACKEND_CPU, -1, &opts, &t->hcomm);
    if (rc == 0) {
        t->comm = t->hcomm;
        train_gpu_ident me;
        int status = setup_device(t, &job.env, &me);
        if (status == 0)
            status = agree_backend(t, &me);
        if (status != 0 || t->backend != COLL_BACKEND_NCCL)
            return status;
        /* NCCL reduces device buffers only: the trainer's own sums stay on the cpu one. */
        which = "nccl";
        size_t len = strlen(prefix);
        snprintf(prefix + len, sizeof prefix - len, "/nccl");
        rc = coll_comm_init(t->store, prefix, t->rank, t->world, COLL_BACKEND_NCCL, t->device,
                            &opts, &t->comm);
    }
    if (rc < 0) {
        train_err("rank %d: cannot create the %s communicator: %s: %s", t->rank, which,
                  coll_strerror(rc), coll_last_error(NULL));
        return EXIT_FAIL;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Failures and teardown                                                                       */
/* ------------------------------------------------------------------------------------------ */

int failed_by(trainer *t, const char *what, int64_t step, int rc, int by)
{
    int culprit = coll_comm_failed_rank(t->comm);
    if (culprit < 0)
        culprit = coll_comm_failed_rank(t->hcomm);
    char who[48] = "";
    if (culprit >= 0 && culprit != t->rank)
        snprintf(who, sizeof who, " (rank %d failed)", culprit);
    train_err("rank %d: %s at step %" PRId64 " failed%s: %s: %s", t->rank, what, step + 1, who,
              ddp_strerror(rc),
              by == BY_COMM      ? coll_last_error(t->hcomm)
              : by == BY_COMPUTE ? t->a.model->last_error(t->model)
                                 : ddp_last_error(t->m));
    return EXIT_FAIL;
}

int failed(trainer *t, const char *what, int64_t step, int rc)
{
    return failed_by(t, what, step, rc, BY_LIBDDP);
}

int failed_compute(trainer *t, const char *what, int64_t step, int rc)
{
    return failed_by(t, what, step, rc, t->hook_failed ? BY_LIBDDP : BY_COMPUTE);
}

int train_to_host(trainer *t, void *dst, const void *src, size_t nbytes)
{
    if (t->device >= 0)
        return mlp_cuda_to_host(dst, src, nbytes, t->stream);
    memcpy(dst, src, nbytes);
    return 0;
}

const char *train_device_error(void)
{
    return mlp_cuda_last_error();
}

void trainer_free(trainer *t)
{
    data_loader_free(t->loader);
    ddp_model_free(t->m);
    if (t->stop_req) /* after a failure: the communicator is aborted, so this returns */
        (void)coll_wait(t->stop_req);
    if (t->hcomm != t->comm)
        coll_comm_close(t->hcomm);
    coll_comm_close(t->comm);
    rdzv_client_close(t->store);
    rdzv_server_close(t->own_store);
    if (t->a.model)
        t->a.model->free(t->model);
    free(t->a.model_cfg);
    data_sampler_free(&t->sampler);
    data_sampler_free(&t->dump.global);
    data_set_free(&t->train);
    data_set_free(&t->test);
    for (int i = 0; t->names && i < t->nparams; i++)
        free(t->names[i]);
    free(t->names);
    free(t->first_param);
    free(t->dump.index);
    free(t->dump.y);
    free(t->dump.x);
    free(t->dump.tok);
    free(t->dump.lr);
    if (t->metrics)
        fclose(t->metrics);
    (void)ddp_summary_close(t->tb); /* every event is in the file already */
    mlp_cuda_close(t->stream);
}
