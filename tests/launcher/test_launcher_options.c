/*
 * Unit tests of ddprun's option parsing (launcher/options.c) and Slurm host-list expansion
 * (launcher/slurm.c): torchrun's defaults, both spellings, --opt=value, PET_<NAME> defaults and
 * their precedence, Slurm defaults, every error naming its flag, and the value grammars; and
 * where the job's token comes from (launcher/jobtoken.c).
 *
 * Each case runs in its own process (Check's fork mode, the default; CK_FORK=no is for debugging
 * one case, chosen with CK_RUN_CASE), so cases set environment variables freely; the fixture
 * first clears every variable the parser reads, so the tests do not depend on where they run
 * (under srun, say).
 */
#include "jobtoken.h"
#include "options.h"
#include "rdzv.h"
#include "slurm.h"
#include "check_main.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern const char *ddprun__dev_dir; /* options.c: where /dev/nvidiaN are counted */
extern char **environ;

static ddprun_config cfg;
static char err[512];
static char devdir[64];

static void setup(void)
{
    /* Drop every PET_, SLURM_ and torch variable the parser reads. */
    for (;;) {
        char name[256] = "";
        for (char **e = environ; *e; e++)
            if (strncmp(*e, "PET_", 4) == 0 || strncmp(*e, "SLURM_", 6) == 0 ||
                strncmp(*e, "TORCH", 5) == 0 || strncmp(*e, "CUDA_VISIBLE_DEVICES=", 21) == 0 ||
                strncmp(*e, "HIP_VISIBLE_DEVICES=", 20) == 0) {
                snprintf(name, sizeof name, "%.*s", (int)strcspn(*e, "="), *e);
                break;
            }
        if (!name[0])
            break;
        unsetenv(name);
    }
    /* An empty device directory: no GPUs unless a case makes some. */
    snprintf(devdir, sizeof devdir, "/tmp/ddprun-test-dev-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(devdir));
    ddprun__dev_dir = devdir;
    memset(&cfg, 0, sizeof cfg);
    err[0] = '\0';
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", devdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", devdir);
}

static void fake_gpus(int n)
{
    char path[128];
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/nvidia%d", devdir, i);
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fclose(f);
    }
    /* Nodes that are not GPUs. */
    const char *others[] = {"nvidiactl", "nvidia-uvm", "nvidia-caps", "nvidia0x"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", devdir, others[i]);
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fclose(f);
    }
}

/* Parses "ddprun" followed by the given arguments (NULL-terminated) into cfg. */
static int parse(const char *first, ...)
{
    static char *argv[64];
    int argc = 0;
    va_list ap;
    argv[argc++] = "ddprun";
    va_start(ap, first);
    for (const char *a = first; a; a = va_arg(ap, const char *)) {
        ck_assert_int_lt(argc, 63);
        argv[argc++] = (char *)a;
    }
    va_end(ap);
    argv[argc] = NULL;
    return ddprun_config_parse(argc, argv, &cfg, err, sizeof err);
}

#define PARSE_OK(...)                                                                              \
    do {                                                                                           \
        ddprun_config_free(&cfg);                                                                  \
        int rc_ = parse(__VA_ARGS__, NULL);                                                        \
        ck_assert_msg(rc_ == 0, "parse failed (%d): %s", rc_, err);                                \
    } while (0)

/* Expects -EINVAL and every given fragment in the message. */
#define PARSE_ERR(frag, ...)                                                                       \
    do {                                                                                           \
        ddprun_config_free(&cfg);                                                                  \
        int rc_ = parse(__VA_ARGS__, NULL);                                                        \
        ck_assert_msg(rc_ == -EINVAL, "expected -EINVAL, got %d (%s)", rc_, err);                  \
        ck_assert_msg(strncmp(err, "ddprun: ", 8) == 0, "no 'ddprun: ' in '%s'", err);             \
        ck_assert_msg(strstr(err, frag), "'%s' not in '%s'", frag, err);                           \
    } while (0)

static void assert_uuid(const char *s)
{
    ck_assert_uint_eq(strlen(s), 36);
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23)
            ck_assert_int_eq(s[i], '-');
        else
            ck_assert_msg(strchr("0123456789abcdef", s[i]), "bad uuid %s", s);
    }
    ck_assert_int_eq(s[14], '4');
}

/* ------------------------------------------------------------------------------------------ */

START_TEST(defaults_are_torchrun_defaults)
{
    PARSE_OK("train.py");
    ck_assert_int_eq(cfg.nnodes_min, 1);
    ck_assert_int_eq(cfg.nnodes_max, 1);
    ck_assert_int_eq(cfg.nproc_per_node, 1);
    ck_assert_int_eq(cfg.node_rank, 0);
    ck_assert_str_eq(cfg.master_addr, "127.0.0.1");
    ck_assert_int_eq(cfg.master_port, 29500);
    ck_assert_ptr_null(cfg.local_addr);
    /* One node, no --master-port: torchrun >= 2 turns that into c10d on a free port. */
    ck_assert_int_eq(cfg.rdzv_backend, DDPRUN_BACKEND_C10D);
    ck_assert_str_eq(cfg.rdzv_host, "127.0.0.1");
    ck_assert_int_eq(cfg.rdzv_port, 0);
    assert_uuid(cfg.rdzv_id);
    ck_assert(cfg.is_host);
    ck_assert(!cfg.standalone);
    ck_assert_double_eq(cfg.join_timeout_s, 600);
    ck_assert_double_eq(cfg.last_call_timeout_s, 30);
    ck_assert_double_eq(cfg.close_timeout_s, 30);
    ck_assert_double_eq(cfg.read_timeout_s, 60);
    ck_assert_double_eq(cfg.timeout_s, 900);
    ck_assert_double_eq(cfg.keep_alive_interval_s, 5);
    ck_assert_int_eq(cfg.keep_alive_max_attempt, 3);
    ck_assert_double_eq(cfg.heartbeat_timeout_s, 0);
    ck_assert_int_eq(cfg.max_restarts, 0);
    ck_assert_double_eq_tol(cfg.monitor_interval_s, 0.1, 1e-12);
    ck_assert_double_eq(cfg.shutdown_timeout_s, 30);
    ck_assert_str_eq(cfg.role, "default");
    ck_assert_str_eq(cfg.start_method, "spawn");
    ck_assert(!cfg.module && !cfg.no_python && !cfg.run_path);
    ck_assert_ptr_null(cfg.log_dir);
    for (int i = 0; i < DDPRUN_MAX_LOCAL; i++) {
        ck_assert_int_eq(cfg.redirects[i], DDPRUN_STD_NONE);
        ck_assert_int_eq(cfg.tee[i], DDPRUN_STD_NONE);
        ck_assert(cfg.show_rank[i]);
    }
    ck_assert(!cfg.local_ranks_filter_set);
    ck_assert(cfg.prefix_output);
    ck_assert_ptr_null(cfg.log_line_prefix_template);
    ck_assert(!cfg.from_slurm);
    ck_assert_str_eq(cfg.event_log_handler, "null");
    ck_assert_str_eq(cfg.signals_to_handle, "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
    ck_assert_ptr_null(cfg.logs_specs);
    ck_assert_ptr_null(cfg.numa_binding);
    ck_assert(!cfg.virtual_local_rank);
    ck_assert_int_eq(cfg.argc, 1);
    ck_assert_str_eq(cfg.argv[0], "train.py");

    /* Several nodes: the static backend on master_addr:master_port, id "none". */
    PARSE_OK("--nnodes", "2", "train.py");
    ck_assert_int_eq(cfg.rdzv_backend, DDPRUN_BACKEND_STATIC);
    ck_assert_str_eq(cfg.rdzv_endpoint, "");
    ck_assert_str_eq(cfg.rdzv_host, "127.0.0.1");
    ck_assert_int_eq(cfg.rdzv_port, 29500);
    ck_assert_str_eq(cfg.rdzv_id, "none");
    ck_assert_int_eq(cfg.is_host_given, 0);

    /* A given master port keeps a one-node job static, as torchrun. */
    PARSE_OK("--master-port", "1234", "train.py");
    ck_assert_int_eq(cfg.rdzv_backend, DDPRUN_BACKEND_STATIC);
    ck_assert_int_eq(cfg.rdzv_port, 1234);
    ck_assert_str_eq(cfg.rdzv_id, "none");
    ddprun_config_free(&cfg);
}
END_TEST

/* Every option in both spellings, with a value that shows up in cfg. */
START_TEST(both_spellings)
{
    static const char *pairs[][2] = {
        {"--nproc-per-node", "--nproc_per_node"},
        {"--rdzv-backend", "--rdzv_backend"},
        {"--rdzv-endpoint", "--rdzv_endpoint"},
        {"--rdzv-id", "--rdzv_id"},
        {"--rdzv-conf", "--rdzv_conf"},
        {"--max-restarts", "--max_restarts"},
        {"--monitor-interval", "--monitor_interval"},
        {"--start-method", "--start_method"},
        {"--event-log-handler", "--event_log_handler"},
        {"--no-python", "--no_python"},
        {"--run-path", "--run_path"},
        {"--log-dir", "--log_dir"},
        {"--log-line-prefix-template", "--log_line_prefix_template"},
        {"--local-ranks-filter", "--local_ranks_filter"},
        {"--duplicate-stdout-filters", "--duplicate_stdout_filters"},
        {"--duplicate-stderr-filters", "--duplicate_stderr_filters"},
        {"--node-rank", "--node_rank"},
        {"--master-addr", "--master_addr"},
        {"--master-port", "--master_port"},
        {"--local-addr", "--local_addr"},
        {"--logs-specs", "--logs_specs"},
        {"--numa-binding", "--numa_binding"},
        {"--signals-to-handle", "--signals_to_handle"},
        {"--shutdown-timeout", "--shutdown_timeout"},
        {"--virtual-local-rank", "--virtual_local_rank"},
        {"-m", "--module"},
        {"-r", "--redirects"},
        {"-t", "--tee"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        for (int k = 0; k < 2; k++) {
            const char *o = pairs[i][0] + 2;
            if (pairs[i][0][1] != '-')
                o = pairs[i][1] + 2; /* short form: look at the long one */
            const char *sp = pairs[i][k];
            if (!strcmp(o, "nproc-per-node")) {
                PARSE_OK(sp, "3", "t.py");
                ck_assert_int_eq(cfg.nproc_per_node, 3);
            } else if (!strcmp(o, "rdzv-backend")) {
                PARSE_OK("--nnodes", "2", sp, "c10d", "t.py");
                ck_assert_int_eq(cfg.rdzv_backend, DDPRUN_BACKEND_C10D);
            } else if (!strcmp(o, "rdzv-endpoint")) {
                PARSE_OK("--nnodes", "2", "--rdzv-backend", "c10d", sp, "h7:99", "t.py");
                ck_assert_str_eq(cfg.rdzv_host, "h7");
                ck_assert_int_eq(cfg.rdzv_port, 99);
            } else if (!strcmp(o, "rdzv-id")) {
                PARSE_OK("--nnodes", "2", sp, "job1", "t.py");
                ck_assert_str_eq(cfg.rdzv_id, "job1");
            } else if (!strcmp(o, "rdzv-conf")) {
                PARSE_OK(sp, "join_timeout=7", "t.py");
                ck_assert_double_eq(cfg.join_timeout_s, 7);
            } else if (!strcmp(o, "max-restarts")) {
                PARSE_OK(sp, "4", "t.py");
                ck_assert_int_eq(cfg.max_restarts, 4);
            } else if (!strcmp(o, "monitor-interval")) {
                PARSE_OK(sp, "2.5", "t.py");
                ck_assert_double_eq(cfg.monitor_interval_s, 2.5);
            } else if (!strcmp(o, "start-method")) {
                PARSE_OK(sp, "fork", "t.py");
                ck_assert_str_eq(cfg.start_method, "fork");
            } else if (!strcmp(o, "event-log-handler")) {
                PARSE_OK(sp, "console", "t.py");
                ck_assert_str_eq(cfg.event_log_handler, "console");
            } else if (!strcmp(o, "no-python")) {
                PARSE_OK(sp, "t.py");
                ck_assert(cfg.no_python);
            } else if (!strcmp(o, "run-path")) {
                PARSE_OK(sp, "/t.py");
                ck_assert(cfg.run_path);
            } else if (!strcmp(o, "log-dir")) {
                PARSE_OK(sp, "/tmp/l", "t.py");
                ck_assert_str_eq(cfg.log_dir, "/tmp/l");
            } else if (!strcmp(o, "log-line-prefix-template")) {
                PARSE_OK(sp, "${hostname}:${rank}: ", "t.py");
                ck_assert_str_eq(cfg.log_line_prefix_template, "${hostname}:${rank}: ");
            } else if (!strcmp(o, "local-ranks-filter")) {
                PARSE_OK("--nproc-per-node", "2", sp, "1", "t.py");
                ck_assert(cfg.local_ranks_filter_set && cfg.show_rank[1] && !cfg.show_rank[0]);
            } else if (!strcmp(o, "duplicate-stdout-filters")) {
                PARSE_OK(sp, "a,b", "t.py");
                ck_assert_str_eq(cfg.duplicate_stdout_filters, "a,b");
            } else if (!strcmp(o, "duplicate-stderr-filters")) {
                PARSE_OK(sp, "c", "t.py");
                ck_assert_str_eq(cfg.duplicate_stderr_filters, "c");
            } else if (!strcmp(o, "node-rank")) {
                PARSE_OK("--nnodes", "3", sp, "2", "t.py");
                ck_assert_int_eq(cfg.node_rank, 2);
            } else if (!strcmp(o, "master-addr")) {
                PARSE_OK("--nnodes", "2", sp, "10.1.2.3", "t.py");
                ck_assert_str_eq(cfg.master_addr, "10.1.2.3");
                ck_assert_str_eq(cfg.rdzv_host, "10.1.2.3");
            } else if (!strcmp(o, "master-port")) {
                PARSE_OK(sp, "4321", "t.py");
                ck_assert_int_eq(cfg.master_port, 4321);
            } else if (!strcmp(o, "local-addr")) {
                PARSE_OK(sp, "10.9.9.9", "t.py");
                ck_assert_str_eq(cfg.local_addr, "10.9.9.9");
            } else if (!strcmp(o, "logs-specs")) {
                PARSE_OK(sp, "mine", "t.py");
                ck_assert_str_eq(cfg.logs_specs, "mine");
            } else if (!strcmp(o, "numa-binding")) {
                PARSE_OK(sp, "core-complex", "t.py");
                ck_assert_str_eq(cfg.numa_binding, "core-complex");
            } else if (!strcmp(o, "signals-to-handle")) {
                PARSE_OK(sp, "SIGTERM,SIGUSR1", "t.py");
                ck_assert_str_eq(cfg.signals_to_handle, "SIGTERM,SIGUSR1");
            } else if (!strcmp(o, "shutdown-timeout")) {
                PARSE_OK(sp, "5", "t.py");
                ck_assert_double_eq(cfg.shutdown_timeout_s, 5);
            } else if (!strcmp(o, "virtual-local-rank")) {
                PARSE_OK(sp, "t.py");
                ck_assert(cfg.virtual_local_rank);
            } else if (!strcmp(o, "module")) {
                PARSE_OK(sp, "pkg.train");
                ck_assert(cfg.module);
            } else if (!strcmp(o, "redirects")) {
                PARSE_OK(sp, "2", "t.py");
                ck_assert_int_eq(cfg.redirects[5], DDPRUN_STD_ERR);
            } else if (!strcmp(o, "tee")) {
                PARSE_OK(sp, "1", "t.py");
                ck_assert_int_eq(cfg.tee[0], DDPRUN_STD_OUT);
            } else {
                ck_abort_msg("no check for %s", sp);
            }
        }
    }
    PARSE_OK("--nnodes", "1:3", "--role", "trainer", "--standalone", "--no-prefix", "t.py");
    ck_assert_str_eq(cfg.role, "trainer");
    ck_assert(cfg.standalone);
    ck_assert(!cfg.prefix_output);
    ddprun_config_free(&cfg);
}
END_TEST

START_TEST(equals_form_and_abbreviations)
{
    PARSE_OK("--nproc-per-node=3", "--nnodes=2", "--node_rank=1", "--master_addr=h", "t.py");
    ck_assert_int_eq(cfg.nproc_per_node, 3);
    ck_assert_int_eq(cfg.nnodes_max, 2);
    ck_assert_int_eq(cfg.node_rank, 1);
    ck_assert_str_eq(cfg.master_addr, "h");
    /* The value may hold '=' itself. */
    PARSE_OK("--nnodes=2", "--rdzv-conf=join_timeout=9,is_host=no", "t.py");
    ck_assert_double_eq(cfg.join_timeout_s, 9);
    ck_assert(!cfg.is_host && cfg.is_host_given);
    /* Short options: -r VALUE, -r=VALUE, -rVALUE. */
    PARSE_OK("-r=1", "-t2", "t.py");
    ck_assert_int_eq(cfg.redirects[0], 1);
    ck_assert_int_eq(cfg.tee[0], 2);
    /* Empty value through '='. */
    PARSE_OK("--rdzv-conf=", "t.py");
    /* etcd, and torchrun's etcd-v2 as its alias: the member list kept whole; timeout is the
     * join timeout there; torchrun's spellings of the TLS files (both backends') accepted. */
    PARSE_OK("--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "e1:2379,e2", "--nnodes", "1:4",
             "--rdzv-conf",
             "protocol=https,ca_cert=/dev/null,ssl_cert=/dev/null,"
             "ssl_cert_key=/dev/null,timeout=42",
             "t.py");
    ck_assert_int_eq(cfg.rdzv_backend, DDPRUN_BACKEND_ETCD);
    ck_assert_str_eq(cfg.rdzv_endpoint, "e1:2379,e2");
    ck_assert(cfg.etcd_https);
    ck_assert_str_eq(cfg.etcd_cacert, "/dev/null");
    ck_assert_str_eq(cfg.etcd_cert, "/dev/null");
    ck_assert_str_eq(cfg.etcd_key, "/dev/null");
    ck_assert(cfg.join_timeout_s == 42);
    PARSE_OK("--rdzv-backend", "etcd", "--rdzv-endpoint", "e", "--rdzv-conf",
             "cacert=/dev/null,cert=/dev/null,key=/dev/null,protocol=HTTP", "t.py");
    ck_assert(!cfg.etcd_https && cfg.etcd_key && cfg.etcd_cert && cfg.etcd_cacert);
    ck_assert(cfg.join_timeout_s == 600);
    /* argparse's unambiguous prefixes; both spellings of one option are not ambiguous. */
    PARSE_OK("--nproc", "2", "--max-r", "3", "t.py");
    ck_assert_int_eq(cfg.nproc_per_node, 2);
    ck_assert_int_eq(cfg.max_restarts, 3);
    PARSE_ERR("ambiguous option '--ma'", "--ma", "3", "t.py");
    /* The last occurrence wins. */
    PARSE_OK("--nproc-per-node", "2", "--nproc_per_node", "5", "t.py");
    ck_assert_int_eq(cfg.nproc_per_node, 5);
    ddprun_config_free(&cfg);
}
END_TEST

START_TEST(script_and_its_arguments)
{
    PARSE_OK("--nproc-per-node", "2", "train.py", "--nproc-per-node", "7", "--lr=1", "-m");
    ck_assert_int_eq(cfg.nproc_per_node, 2);
    ck_assert(!cfg.module);
    ck_assert_int_eq(cfg.argc, 5);
    ck_assert_str_eq(cfg.argv[0], "train.py");
    ck_assert_str_eq(cfg.argv[1], "--nproc-per-node");
    ck_assert_str_eq(cfg.argv[4], "-m");
    ck_assert_ptr_null(cfg.argv[5]);
    /* "--" ends the options, so the script may start with a dash. */
    PARSE_OK("--", "--weird-script", "x");
    ck_assert_int_eq(cfg.argc, 2);
    ck_assert_str_eq(cfg.argv[0], "--weird-script");
    /* "-" is a positional. */
    PARSE_OK("-", "a");
    ck_assert_str_eq(cfg.argv[0], "-");
    PARSE_ERR("missing the training script", "--nnodes", "1");
    PARSE_ERR("missing the training script", "--");
    ck_assert_int_eq(parse(NULL), -EINVAL);
    ck_assert(strstr(err, "training script"));
    ddprun_config_free(&cfg);
}
END_TEST

START_TEST(pet_defaults_and_precedence)
{
    setenv("PET_NPROC_PER_NODE", "3", 1);
    setenv("PET_NNODES", "1:4", 1);
    setenv("PET_RDZV_BACKEND", "c10d", 1);
    setenv("PET_RDZV_ENDPOINT", "hostx", 1);
    setenv("PET_RDZV_ID", "j9", 1);
    setenv("PET_MAX_RESTARTS", "2", 1);
    setenv("PET_ROLE", "r", 1);
    setenv("PET_LOG_DIR", "/tmp/pl", 1);
    setenv("PET_TEE", "3", 1);
    setenv("PET_MODULE", "1", 1);
    setenv("PET_LOG_LINE_PREFIX_TEMPLATE", "P", 1);
    PARSE_OK("t");
    ck_assert_int_eq(cfg.nproc_per_node, 3);
    ck_assert_int_eq(cfg.nnodes_min, 1);
    ck_assert_int_eq(cfg.nnodes_max, 4);
    ck_assert_int_eq(cfg.rdzv_backend, DDPRUN_BACKEND_C10D);
    ck_assert_str_eq(cfg.rdzv_host, "hostx");
    ck_assert_int_eq(cfg.rdzv_port, 29400);
    ck_assert_str_eq(cfg.rdzv_id, "j9");
    ck_assert_int_eq(cfg.max_restarts, 2);
    ck_assert_str_eq(cfg.role, "r");
    ck_assert_str_eq(cfg.log_dir, "/tmp/pl");
    ck_assert_int_eq(cfg.tee[3], 3);
    ck_assert(cfg.module);
    ck_assert_str_eq(cfg.log_line_prefix_template, "P");

    /* The command line beats the environment. */
    PARSE_OK("--nproc_per_node", "2", "--nnodes", "2", "--rdzv-id", "cli", "--tee", "0", "t");
    ck_assert_int_eq(cfg.nproc_per_node, 2);
    ck_assert_int_eq(cfg.nnodes_min, 2);
    ck_assert_str_eq(cfg.rdzv_id, "cli");
    ck_assert_int_eq(cfg.tee[3], 0);

    /* An environment value the command line overrides is never checked (argparse). */
    setenv("PET_MAX_RESTARTS", "bad", 1);
    PARSE_OK("--max-restarts", "1", "t");
    ck_assert_int_eq(cfg.max_restarts, 1);
    /* One it does not override is, and the error names both. */
    PARSE_ERR("--max-restarts (from PET_MAX_RESTARTS): expected an integer", "t");

    /* Flags, as check_env: an integer, non-zero meaning set; the flag beats PET_X=0. */
    setenv("PET_MAX_RESTARTS", "0", 1);
    setenv("PET_MODULE", "0", 1);
    PARSE_OK("t");
    ck_assert(!cfg.module);
    PARSE_OK("-m", "t");
    ck_assert(cfg.module);
    setenv("PET_MODULE", "yes", 1);
    PARSE_ERR("--module (from PET_MODULE): expected 0 or 1, got 'yes'", "t");
    unsetenv("PET_MODULE");
    setenv("PET_STANDALONE", "1", 1);
    PARSE_OK("t");
    ck_assert(cfg.standalone);
    ck_assert_int_eq(cfg.rdzv_port, 0);
    unsetenv("PET_STANDALONE");

    /* Options torchrun gives no env action do not read PET_. */
    setenv("PET_LOGS_SPECS", "x", 1);
    setenv("PET_NUMA_BINDING", "bogus", 1);
    PARSE_OK("t");
    ck_assert_ptr_null(cfg.logs_specs);
    ck_assert_ptr_null(cfg.numa_binding);

    /* A PET master port counts as given: the one-node job stays static. */
    unsetenv("PET_NNODES");
    unsetenv("PET_RDZV_BACKEND");
    unsetenv("PET_RDZV_ENDPOINT");
    setenv("PET_MASTER_PORT", "2222", 1);
    setenv("PET_MASTER_ADDR", "m1", 1);
    PARSE_OK("t");
    ck_assert_int_eq(cfg.rdzv_backend, DDPRUN_BACKEND_STATIC);
    ck_assert_str_eq(cfg.master_addr, "m1");
    ck_assert_int_eq(cfg.master_port, 2222);
    ddprun_config_free(&cfg);
}
END_TEST

START_TEST(shutdown_timeout_sources)
{
    setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "7", 1);
    PARSE_OK("t");
    ck_assert_double_eq(cfg.shutdown_timeout_s, 7);
    setenv("PET_SHUTDOWN_TIMEOUT", "8", 1);
    PARSE_OK("t");
    ck_assert_double_eq(cfg.shutdown_timeout_s, 8);
    PARSE_OK("--shutdown-timeout", "0", "t");
    ck_assert_double_eq(cfg.shutdown_timeout_s, 0);
    unsetenv("PET_SHUTDOWN_TIMEOUT");
    setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "x", 1);
    PARSE_ERR("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "t");
    ck_assert(strstr(err, "--shutdown-timeout"));
    PARSE_ERR("--shutdown-timeout: expected a number of seconds from 0 to 2147483, got '-1'",
              "--shutdown-timeout", "-1", "t");
    unsetenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
    /* torchrun's other fallback for the prefix template. */
    setenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "T:", 1);
    PARSE_OK("t");
    ck_assert_str_eq(cfg.log_line_prefix_template, "T:");
    PARSE_OK("--log-line-prefix-template", "C:", "t");
    ck_assert_str_eq(cfg.log_line_prefix_template, "C:");
    ddprun_config_free(&cfg);
}
END_TEST

/* --hung-timeout: off (0) by default, seconds from the command line or PET_HUNG_TIMEOUT. */
START_TEST(hung_timeout)
{
    PARSE_OK("t");
    ck_assert_double_eq(cfg.hung_timeout_s, 0);
    PARSE_OK("--hung-timeout", "2.5", "t");
    ck_assert_double_eq(cfg.hung_timeout_s, 2.5);
    PARSE_OK("--hung_timeout=1", "t");
    ck_assert_double_eq(cfg.hung_timeout_s, 1);
    setenv("PET_HUNG_TIMEOUT", "4", 1);
    PARSE_OK("t");
    ck_assert_double_eq(cfg.hung_timeout_s, 4);
    PARSE_OK("--hung-timeout", "0", "t");
    ck_assert_double_eq(cfg.hung_timeout_s, 0);
    setenv("PET_HUNG_TIMEOUT", "soon", 1);
    PARSE_ERR("--hung-timeout (from PET_HUNG_TIMEOUT)", "t");
    unsetenv("PET_HUNG_TIMEOUT");
    PARSE_ERR("--hung-timeout: expected a number of seconds from 0", "--hung-timeout", "-1", "t");
    ddprun_config_free(&cfg);
}
END_TEST

/* --store-proxy: off by default, on|off from the command line or PET_STORE_PROXY. */
START_TEST(store_proxy)
{
    PARSE_OK("t");
    ck_assert(!cfg.store_proxy);
    PARSE_OK("--store-proxy", "on", "t");
    ck_assert(cfg.store_proxy);
    PARSE_OK("--store_proxy=off", "t");
    ck_assert(!cfg.store_proxy);
    setenv("PET_STORE_PROXY", "on", 1);
    PARSE_OK("t");
    ck_assert(cfg.store_proxy);
    PARSE_OK("--store-proxy", "off", "t");
    ck_assert(!cfg.store_proxy);
    unsetenv("PET_STORE_PROXY");
    PARSE_ERR("--store-proxy: expected 'on' or 'off', got 'yes'", "--store-proxy", "yes", "t");
    ddprun_config_free(&cfg);
}
END_TEST

/* --tty auto|on|off, PET_TTY, and its error. */
START_TEST(tty_choice)
{
    PARSE_OK("t");
    ck_assert_int_eq(cfg.tty, DDPRUN_TTY_AUTO);
    PARSE_OK("--tty", "on", "t");
    ck_assert_int_eq(cfg.tty, DDPRUN_TTY_ON);
    PARSE_OK("--tty=off", "t");
    ck_assert_int_eq(cfg.tty, DDPRUN_TTY_OFF);
    setenv("PET_TTY", "off", 1);
    PARSE_OK("t");
    ck_assert_int_eq(cfg.tty, DDPRUN_TTY_OFF);
    PARSE_OK("--tty", "auto", "t");
    ck_assert_int_eq(cfg.tty, DDPRUN_TTY_AUTO);
    unsetenv("PET_TTY");
    PARSE_ERR("--tty: expected 'auto', 'on' or 'off', got 'yes'", "--tty", "yes", "t");
    ddprun_config_free(&cfg);
}
END_TEST

/*
 * Every duration has a range, named in the error: at most 2147483 s (INT_MAX ms), so that none
 * overflows when the agent turns it into milliseconds ("--shutdown-timeout 1e18" was accepted and
 * sent SIGKILL at once); node liveness has floors (keep_alive_interval=1e-9 was accepted and
 * declared a two-node job's nodes dead at once).
 */
START_TEST(duration_ranges)
{
    static const char *const flags[] = {"--shutdown-timeout", "--hung-timeout",
                                        "--monitor-interval"};
    static const char *const huge[] = {"1e18", "1e308", "2147484"};
    char want[160];
    for (size_t i = 0; i < 3; i++) {
        for (size_t k = 0; k < 3; k++) {
            snprintf(want, sizeof want,
                     "%s: expected a number of seconds from 0 to 2147483, got '%s'", flags[i],
                     huge[k]);
            PARSE_ERR(want, flags[i], huge[k], "t");
        }
        PARSE_OK(flags[i], "2147483", "t");
    }
    ck_assert_double_eq(cfg.monitor_interval_s, 2147483);
    setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "1e308", 1);
    PARSE_ERR("--shutdown-timeout (from TORCH_ELASTIC_SHUTDOWN_TIMEOUT): expected a number of "
              "seconds from 0 to 2147483",
              "t");
    unsetenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");

    static const char *const keys[] = {
        "join_timeout", "last_call_timeout",       "close_timeout",     "read_timeout",
        "timeout",      "cas_backoff_max_seconds", "heartbeat_timeout", "keep_alive_interval"};
    char conf[96];
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        snprintf(conf, sizeof conf, "%s=1e18", keys[i]);
        snprintf(want, sizeof want, "--rdzv-conf: %s: expected a number of seconds", keys[i]);
        PARSE_ERR(want, "--rdzv-conf", conf, "t");
        ck_assert_msg(strstr(err, "2147483, got '1e18'"), "no range in '%s'", err);
        snprintf(conf, sizeof conf, "%s=2147483", keys[i]);
        PARSE_OK("--rdzv-conf", conf, "t");
    }
    ck_assert_double_eq(cfg.keep_alive_interval_s, 2147483);

    PARSE_ERR("--rdzv-conf: keep_alive_interval: expected a number of seconds from 0.1 to 2147483, "
              "got '1e-9'",
              "--nnodes", "2", "--rdzv-conf", "keep_alive_interval=1e-9", "t");
    PARSE_ERR("--rdzv-conf: heartbeat_timeout: expected a number of seconds from 1 to 2147483, "
              "got '0.5'",
              "--rdzv-conf", "heartbeat_timeout=0.5", "t");
    /* Without heartbeat_timeout, a node is dead after interval x attempts: at least 1 s too. */
    PARSE_ERR("--rdzv-conf: keep_alive_interval x keep_alive_max_attempt is 0.3 s", "--rdzv-conf",
              "keep_alive_interval=0.1", "t");
    PARSE_ERR("less than 1 s without a heartbeat", "--rdzv-conf",
              "keep_alive_interval=0.5,keep_alive_max_attempt=1", "t");
    PARSE_OK("--rdzv-conf", "keep_alive_interval=0.1,keep_alive_max_attempt=10", "t");
    PARSE_OK("--rdzv-conf", "keep_alive_interval=0.1,heartbeat_timeout=1", "t");
    double beat, dead;
    ddprun_liveness(&cfg, &beat, &dead);
    ck_assert_double_eq_tol(beat, 0.1, 1e-12);
    ck_assert_double_eq_tol(dead, 1, 1e-12);
    ddprun_config_free(&cfg);
}
END_TEST

START_TEST(errors_name_their_flag)
{
    PARSE_ERR("--nproc-per-node: expected a positive integer, 'auto', 'cpu' or 'gpu', got 'x'",
              "--nproc-per-node", "x", "t");
    PARSE_ERR("--nproc_per_node: expected a positive integer", "--nproc_per_node", "0", "t");
    PARSE_ERR("--nproc-per-node: at most", "--nproc-per-node", "100000", "t");
    PARSE_ERR("unknown option '--foo'", "--foo", "t");
    PARSE_ERR("unknown option '--foo'", "--foo=1", "t");
    PARSE_ERR("unknown option '-x'", "-x", "t");
    PARSE_ERR("--nnodes: expected N or MIN:MAX", "--nnodes", "0", "t");
    PARSE_ERR("--nnodes: expected N or MIN:MAX", "--nnodes", "3:2", "t");
    PARSE_ERR("--nnodes: expected N or MIN:MAX", "--nnodes", "1:2:3", "t");
    PARSE_ERR("--nnodes: expected N or MIN:MAX", "--nnodes", "a", "t");
    PARSE_ERR("--node-rank: expected an integer", "--node-rank", "x", "t");
    PARSE_ERR("--node-rank: 2 is not below the node count 2 of --nnodes", "--nnodes", "2",
              "--node-rank", "2", "t");
    PARSE_ERR("--master-port: expected an integer from 0 to 65535", "--master-port", "65536", "t");
    PARSE_ERR("--master_port: expected an integer", "--master_port", "p", "t");
    PARSE_ERR("--rdzv-backend: expected 'static', 'c10d', 'etcd' or 'etcd-v2', got 'zk'",
              "--rdzv-backend", "zk", "t");
    PARSE_ERR("--rdzv-endpoint: the etcd backend needs the etcd cluster's members",
              "--rdzv-backend", "etcd", "--nnodes", "1:2", "t");
    PARSE_ERR("--rdzv-conf: protocol: expected 'http' or 'https', got 'grpc'", "--rdzv-backend",
              "etcd", "--rdzv-endpoint", "e:2379", "--rdzv-conf", "protocol=grpc", "t");
    PARSE_ERR("--rdzv-conf: cacert: cannot read '/nonexistent/ca.pem'", "--rdzv-backend", "etcd",
              "--rdzv-endpoint", "e:2379", "--rdzv-conf", "cacert=/nonexistent/ca.pem", "t");
    PARSE_ERR("--rdzv-conf: key given without cert", "--rdzv-backend", "etcd", "--rdzv-endpoint",
              "e:2379", "--rdzv-conf", "key=/dev/null", "t");
    PARSE_ERR("--rdzv-endpoint: the static backend needs a port", "--nnodes", "2",
              "--rdzv-endpoint", "h", "t");
    PARSE_ERR("--rdzv-endpoint: the port of 'h:x' must be", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", "h:x", "t");
    PARSE_ERR("--rdzv-endpoint: the port of 'h:70000' must be", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", "h:70000", "t");
    PARSE_ERR("--rdzv-endpoint: the host of 'a b:1'", "--rdzv-backend", "c10d", "--rdzv-endpoint",
              "a b:1", "t");
    PARSE_ERR("--max-restarts: expected an integer of at least 0", "--max-restarts", "-1", "t");
    PARSE_ERR("--monitor-interval: expected a number of seconds from 0", "--monitor-interval", "x",
              "t");
    PARSE_ERR("--start-method: expected 'spawn', 'fork' or 'forkserver', got 'thread'",
              "--start-method", "thread", "t");
    PARSE_ERR("--numa-binding: expected 'node', 'socket', 'exclusive' or 'core-complex'",
              "--numa-binding", "all", "t");
    PARSE_ERR("--signals-to-handle: unknown signal 'SIGFOO'", "--signals-to-handle",
              "SIGTERM,SIGFOO", "t");
    PARSE_ERR("-r: expected 0, 1, 2 or 3", "-r", "4", "t");
    PARSE_ERR("--tee: expected 0, 1, 2 or 3", "--tee", "0:1,x", "t");
    PARSE_ERR("--local-ranks-filter: expected a comma-separated list", "--local-ranks-filter",
              "0,a", "t");
    PARSE_ERR("--rdzv-conf: unknown key 'foo'", "--rdzv-conf", "foo=1", "t");
    PARSE_ERR("--no-python: cannot be combined with --module", "--module", "--no-python", "t");
    PARSE_ERR("--standalone: takes no value", "--standalone=1", "t");
    PARSE_ERR("--log-dir: expected a value", "--log-dir");
    PARSE_ERR("--log-dir: expected a value", "--log-dir", "--tee", "1", "t");
    PARSE_ERR("--print-completion: expected 'bash', 'zsh' or 'tcsh', got 'fish'",
              "--print-completion", "fish");
    /* Negative numbers are values, not options (argparse). */
    PARSE_ERR("--node-rank: expected an integer of at least 0, got '-1'", "--node-rank", "-1", "t");
    ddprun_config_free(&cfg);
}
END_TEST

START_TEST(module_no_python_run_path)
{
    /* --run-path takes precedence, so torchrun does not object to the pair then. */
    PARSE_OK("-m", "--no-python", "--run-path", "/abs/t.py");
    ck_assert(cfg.run_path && cfg.module && cfg.no_python);
    PARSE_OK("--no-python", "/bin/echo", "hi");
    ck_assert(cfg.no_python);
    ck_assert_str_eq(cfg.argv[0], "/bin/echo");
    ddprun_config_free(&cfg);
}
END_TEST

/* Liveness: dead after heartbeat_timeout if given, else interval x attempts; the beat interval
 * shrinks so that keep_alive_max_attempt beats fit in the timeout. */
START_TEST(liveness_settings)
{
    double beat, dead;
    PARSE_OK("--nnodes", "2", "t");
    ddprun_liveness(&cfg, &beat, &dead);
    ck_assert_double_eq_tol(beat, 5, 1e-12);
    ck_assert_double_eq_tol(dead, 15, 1e-12);
    PARSE_OK("--nnodes", "2", "--rdzv-conf", "heartbeat_timeout=1", "t");
    ddprun_liveness(&cfg, &beat, &dead);
    ck_assert_double_eq_tol(beat, 1.0 / 3, 1e-12);
    ck_assert_double_eq_tol(dead, 1, 1e-12);
    PARSE_OK("--nnodes", "2", "--rdzv-conf", "keep_alive_interval=0.5,keep_alive_max_attempt=4",
             "t");
    ddprun_liveness(&cfg, &beat, &dead);
    ck_assert_double_eq_tol(beat, 0.5, 1e-12);
    ck_assert_double_eq_tol(dead, 2, 1e-12);
    /* A long heartbeat_timeout keeps the interval. */
    PARSE_OK("--nnodes", "2", "--rdzv-conf", "heartbeat_timeout=60,keep_alive_interval=2", "t");
    ddprun_liveness(&cfg, &beat, &dead);
    ck_assert_double_eq_tol(beat, 2, 1e-12);
    ck_assert_double_eq_tol(dead, 60, 1e-12);
}
END_TEST

/* The monitor's slice: 250 ms up to 1,000 nodes, then nnodes / 4 ms, capped by a quarter of the
 * liveness timeout and by the beat interval, at least 10 ms. */
START_TEST(monitor_slice)
{
    ck_assert_int_eq(ddprun_monitor_slice_ms(5, 15, 1), 250);
    ck_assert_int_eq(ddprun_monitor_slice_ms(5, 15, 1000), 250);
    ck_assert_int_eq(ddprun_monitor_slice_ms(5, 15, 4000), 1000);
    ck_assert_int_eq(ddprun_monitor_slice_ms(5, 15, 10000), 2500);
    ck_assert_int_eq(ddprun_monitor_slice_ms(5, 15, 100000), 3750); /* dead / 4 */
    ck_assert_int_eq(ddprun_monitor_slice_ms(2, 60, 100000), 2000); /* the beat */
    ck_assert_int_eq(ddprun_monitor_slice_ms(1.0 / 3, 1, 2), 250);
    ck_assert_int_eq(ddprun_monitor_slice_ms(0.1, 1, 2), 100);
    ck_assert_int_eq(ddprun_monitor_slice_ms(0.001, 1, 2), 10);
}
END_TEST

START_TEST(rdzv_conf_parsing)
{
    PARSE_OK("--rdzv-conf",
             " join_timeout = 11 , last_call_timeout=12,close_timeout=13,read_timeout=14,"
             "timeout=15,is_host=TRUE,heartbeat_timeout=3,keep_alive_interval=2,"
             "keep_alive_max_attempt=9,cas_backoff_max_seconds=0,store_type=tcp",
             "--rdzv-backend", "c10d", "--nnodes", "2", "t");
    ck_assert_double_eq(cfg.join_timeout_s, 11);
    ck_assert_double_eq(cfg.last_call_timeout_s, 12);
    ck_assert_double_eq(cfg.close_timeout_s, 13);
    ck_assert_double_eq(cfg.read_timeout_s, 14);
    ck_assert_double_eq(cfg.timeout_s, 15);
    ck_assert_double_eq(cfg.keep_alive_interval_s, 2);
    ck_assert_int_eq(cfg.keep_alive_max_attempt, 9);
    ck_assert_double_eq(cfg.heartbeat_timeout_s, 3);
    ck_assert(cfg.is_host);
    ck_assert_int_eq(cfg.is_host_given, 1);

    static const char *yes[] = {"1", "true", "T", "yes", "Y"},
                      *no[] = {"0", "False", "f", "NO", "n"};
    char buf[64];
    for (int i = 0; i < 5; i++) {
        snprintf(buf, sizeof buf, "is_host=%s", yes[i]);
        PARSE_OK("--rdzv-conf", buf, "t");
        ck_assert(cfg.is_host && cfg.is_host_given);
        snprintf(buf, sizeof buf, "is_host=%s", no[i]);
        PARSE_OK("--nnodes", "2", "--rdzv-conf", buf, "t");
        ck_assert(!cfg.is_host && cfg.is_host_given);
    }
    PARSE_OK("--rdzv-conf", "   ", "t");
    PARSE_ERR("--rdzv-conf: is_host: expected a boolean", "--rdzv-conf", "is_host=maybe", "t");
    PARSE_ERR("--rdzv-conf: join_timeout: expected a number of seconds greater than 0 and at "
              "most 2147483, got 'x'",
              "--rdzv-conf", "join_timeout=x", "t");
    PARSE_ERR("--rdzv-conf: read_timeout: expected a number of seconds greater than 0",
              "--rdzv-conf", "read_timeout=0", "t");
    PARSE_ERR("--rdzv-conf: timeout: a value is required", "--rdzv-conf", "timeout=", "t");
    PARSE_ERR("--rdzv-conf: timeout: a value is required", "--rdzv-conf", "timeout", "t");
    PARSE_ERR("--rdzv-conf: expected KEY=VALUE", "--rdzv-conf", "=5", "t");
    PARSE_ERR("--rdzv-conf: expected KEY=VALUE", "--rdzv-conf", "timeout=5,,x=1", "t");
    PARSE_ERR("--rdzv-conf: unknown key 'bogus'", "--rdzv-conf", "timeout=5,bogus=1", "t");
    PARSE_ERR("--rdzv-conf: store_type: only 'tcp'", "--rdzv-conf", "store_type=file", "t");
    PARSE_ERR("--rdzv-conf: keep_alive_max_attempt: expected a positive integer", "--rdzv-conf",
              "keep_alive_max_attempt=0", "t");
    setenv("PET_RDZV_CONF", "nope=1", 1);
    PARSE_ERR("--rdzv-conf (from PET_RDZV_CONF): unknown key 'nope'", "t");
    ddprun_config_free(&cfg);
}
END_TEST

START_TEST(redirects_and_tee)
{
    for (int v = 0; v <= 3; v++) {
        char s[2] = {(char)('0' + v), 0};
        PARSE_OK("-r", s, "--tee", s, "t");
        for (int i = 0; i < DDPRUN_MAX_LOCAL; i++) {
            ck_assert_int_eq(cfg.redirects[i], v);
            ck_assert_int_eq(cfg.tee[i], v);
        }
    }
    /* torchrun's example: 0:3,1:0,2:1,3:2; ranks not named get 0. */
    PARSE_OK("--redirects", "0:3,1:0,2:1,3:2", "-t", "1:2,12:1", "t");
    ck_assert_int_eq(cfg.redirects[0], DDPRUN_STD_ALL);
    ck_assert_int_eq(cfg.redirects[1], DDPRUN_STD_NONE);
    ck_assert_int_eq(cfg.redirects[2], DDPRUN_STD_OUT);
    ck_assert_int_eq(cfg.redirects[3], DDPRUN_STD_ERR);
    ck_assert_int_eq(cfg.redirects[4], DDPRUN_STD_NONE);
    ck_assert_int_eq(cfg.tee[0], 0);
    ck_assert_int_eq(cfg.tee[1], DDPRUN_STD_ERR);
    ck_assert_int_eq(cfg.tee[12], DDPRUN_STD_OUT);
    ck_assert_int_eq(cfg.tee[DDPRUN_MAX_LOCAL - 1], 0);
    const char *bad[] = {
        "4", "-1", "x", "", "0:4", "0:", ":1", "0:1,", "0:1,,1:2", "0-1", "1024:1", "0:1:2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        PARSE_ERR("--redirects: expected 0, 1, 2 or 3", "--redirects", bad[i], "t");
        PARSE_ERR("-t: expected 0, 1, 2 or 3", "-t", bad[i], "t");
    }
    ddprun_config_free(&cfg);
}
END_TEST

START_TEST(local_ranks_filter)
{
    PARSE_OK("--nproc-per-node", "6", "--local-ranks-filter", "0,2,5", "t");
    ck_assert(cfg.local_ranks_filter_set);
    for (int i = 0; i < 8; i++)
        ck_assert(cfg.show_rank[i] == (i == 0 || i == 2 || i == 5));
    ck_assert(!cfg.show_rank[DDPRUN_MAX_LOCAL - 1]);
    ck_assert_ptr_null(cfg.warnings);
    /* Ranks the node does not run: a warning naming them, or, when it runs none of them, a usage
     * error (torchrun shows nothing and says nothing). */
    PARSE_OK("--nproc-per-node", "2", "--local-ranks-filter", "1,5,7", "t");
    ck_assert(cfg.show_rank[1] && cfg.show_rank[5]);
    ck_assert_ptr_nonnull(cfg.warnings);
    ck_assert_msg(strstr(cfg.warnings, "warning: --local-ranks-filter: local ranks 5,7 do not run "
                                       "on this node (--nproc-per-node 2 runs 0 to 1)"),
                  "%s", cfg.warnings);
    PARSE_ERR("--local-ranks-filter: no local rank of '5' runs on this node (--nproc-per-node 2 "
              "runs local ranks 0 to 1), so no worker's output would reach the console",
              "--nproc-per-node", "2", "--local-ranks-filter", "5", "t");
    PARSE_ERR("--local-ranks-filter: no local rank of '1,2' runs on this node (--nproc-per-node 1",
              "--local-ranks-filter", "1,2", "t");
    /* Empty: no filter, as torchrun's `if args.local_ranks_filter`. */
    PARSE_OK("--local_ranks_filter=", "t");
    ck_assert(!cfg.local_ranks_filter_set);
    ck_assert(cfg.show_rank[7]);
    setenv("PET_LOCAL_RANKS_FILTER", "3", 1);
    PARSE_OK("--nproc-per-node", "4", "t");
    ck_assert(cfg.local_ranks_filter_set && cfg.show_rank[3] && !cfg.show_rank[0]);
    const char *bad[] = {"a", "0,", ",1", "-1", "1024", "0;1", "1 ,2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        PARSE_ERR("--local-ranks-filter: expected a comma-separated list", "--local-ranks-filter",
                  bad[i], "t");
    ddprun_config_free(&cfg);
}
END_TEST

START_TEST(standalone)
{
    PARSE_OK("--standalone", "--rdzv-backend", "static", "--rdzv-endpoint", "h:1", "--rdzv-id", "x",
             "--nnodes", "1:4", "--node-rank", "0", "t");
    ck_assert(cfg.standalone);
    ck_assert_int_eq(cfg.rdzv_backend, DDPRUN_BACKEND_C10D);
    ck_assert_str_eq(cfg.rdzv_endpoint, "127.0.0.1:0");
    ck_assert_str_eq(cfg.rdzv_host, "127.0.0.1");
    ck_assert_int_eq(cfg.rdzv_port, 0);
    ck_assert(cfg.is_host);
    assert_uuid(cfg.rdzv_id);
    ck_assert_int_eq(cfg.nnodes_min, 1);
    ck_assert_int_eq(cfg.nnodes_max, 1);
    char first[37];
    snprintf(first, sizeof first, "%s", cfg.rdzv_id);
    PARSE_OK("--standalone", "t");
    ck_assert_str_ne(cfg.rdzv_id, first);
    /* Slurm does not reach a standalone job. */
    setenv("SLURM_JOB_ID", "1", 1);
    setenv("SLURM_NNODES", "4", 1);
    setenv("SLURM_NODEID", "2", 1);
    setenv("SLURM_JOB_NODELIST", "n[1-4]", 1);
    PARSE_OK("--standalone", "t");
    ck_assert(!cfg.from_slurm);
    ck_assert_int_eq(cfg.nnodes_max, 1);
    ck_assert_int_eq(cfg.node_rank, 0);
    ddprun_config_free(&cfg);
}
END_TEST

/* --token-file and --allow (repeatable and comma-separated), and where the job's token comes
 * from (jobtoken.c): --token-file, then DDPRUN_TOKEN_FILE, then DDPRUN_TOKEN, then random. */
START_TEST(control_plane)
{
    PARSE_OK("t");
    ck_assert_ptr_null(cfg.token_file);
    ck_assert_int_eq(cfg.nallow, 0);
    PARSE_OK("--token-file", "/run/job.token", "--allow", "10.0.0.0/8",
             "--allow=192.168.1.5,fd00::/8", "t");
    ck_assert_str_eq(cfg.token_file, "/run/job.token");
    ck_assert_int_eq(cfg.nallow, 3);
    ck_assert_str_eq(cfg.allow[0], "10.0.0.0/8");
    ck_assert_str_eq(cfg.allow[1], "192.168.1.5");
    ck_assert_str_eq(cfg.allow[2], "fd00::/8");
    PARSE_ERR("--allow: expected an address or a network ADDR/BITS, got '10.0.0.0/33'", "--allow",
              "10.0.0.0/33", "t");
    PARSE_ERR("got 'node1'", "--allow", "10.0.0.1,node1", "t");
    ddprun_config_free(&cfg);

    char tok[RDZV_TOKEN_MAX_BYTES + 1], e[256], path[] = "/tmp/ddprun-token-XXXXXX";
    ddprun_token_source src;
    bool loose;
    unsetenv("DDPRUN_TOKEN");
    unsetenv("DDPRUN_TOKEN_FILE");
    ck_assert_int_eq(ddprun_job_token(NULL, false, tok, sizeof tok, &src, &loose, e, sizeof e), 0);
    ck_assert_int_eq(src, DDPRUN_TOKEN_NONE);
    ck_assert_str_eq(tok, "");
    ck_assert_int_eq(ddprun_job_token(NULL, true, tok, sizeof tok, &src, &loose, e, sizeof e), 0);
    ck_assert_int_eq(src, DDPRUN_TOKEN_GENERATED);
    ck_assert_uint_eq(strlen(tok), 64);
    setenv("DDPRUN_TOKEN", "env-token-0123456789", 1);
    ck_assert_int_eq(ddprun_job_token(NULL, true, tok, sizeof tok, &src, &loose, e, sizeof e), 0);
    ck_assert_int_eq(src, DDPRUN_TOKEN_ENV);
    ck_assert_str_eq(tok, "env-token-0123456789");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "file-token-0123456789\n", 22), 22);
    close(fd);
    ck_assert_int_eq(chmod(path, 0644), 0);
    setenv("DDPRUN_TOKEN_FILE", path, 1);
    ck_assert_int_eq(ddprun_job_token(NULL, true, tok, sizeof tok, &src, &loose, e, sizeof e), 0);
    ck_assert_int_eq(src, DDPRUN_TOKEN_ENV_FILE);
    ck_assert_str_eq(tok, "file-token-0123456789");
    ck_assert(loose); /* readable by others: used, and the caller warns */
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(ddprun_job_token(path, true, tok, sizeof tok, &src, &loose, e, sizeof e), 0);
    ck_assert_int_eq(src, DDPRUN_TOKEN_FILE);
    ck_assert(!loose);
    /* Bad sources fail, and the message never holds the token. */
    ck_assert_int_eq(ddprun_job_token("/nonexistent/job.token", true, tok, sizeof tok, &src, &loose,
                                      e, sizeof e),
                     -ENOENT);
    ck_assert_ptr_nonnull(strstr(e, "--token-file /nonexistent/job.token"));
    unsetenv("DDPRUN_TOKEN_FILE");
    setenv("DDPRUN_TOKEN", "short secret", 1);
    ck_assert_int_eq(ddprun_job_token(NULL, true, tok, sizeof tok, &src, &loose, e, sizeof e),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(e, "DDPRUN_TOKEN"));
    ck_assert_ptr_null(strstr(e, "short secret"));
    ck_assert_str_eq(tok, "");
    unsetenv("DDPRUN_TOKEN");
    unlink(path);
}
END_TEST

START_TEST(endpoints)
{
    PARSE_OK("--rdzv-backend", "c10d", "--nnodes", "1:4", "t");
    ck_assert_str_eq(cfg.rdzv_host, "localhost"); /* parse_rendezvous_endpoint("") */
    ck_assert_int_eq(cfg.rdzv_port, 29400);
    ck_assert(!cfg.is_host_given);
    PARSE_OK("--rdzv-backend", "c10d", "--rdzv-endpoint", "node1", "--nnodes", "2", "t");
    ck_assert_str_eq(cfg.rdzv_host, "node1");
    ck_assert_int_eq(cfg.rdzv_port, 29400);
    PARSE_OK("--rdzv-backend", "c10d", "--rdzv-endpoint", "node1:0", "t");
    ck_assert_int_eq(cfg.rdzv_port, 0);
    ck_assert(!cfg.is_host_given);
    PARSE_OK("--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1]:5000", "t");
    ck_assert_str_eq(cfg.rdzv_host, "::1");
    ck_assert_int_eq(cfg.rdzv_port, 5000);
    PARSE_OK("--rdzv-backend", "c10d", "--rdzv-endpoint", "[fe80::1]", "t");
    ck_assert_str_eq(cfg.rdzv_host, "fe80::1");
    ck_assert_int_eq(cfg.rdzv_port, 29400);
    ck_assert_str_eq(cfg.rdzv_endpoint, "[fe80::1]");
    /* Static with an endpoint: it is node 0's store, so it becomes the master address. */
    PARSE_OK("--nnodes", "2", "--master-addr", "ignored", "--master-port", "1", "--rdzv-endpoint",
             "10.0.0.5:7000", "t");
    ck_assert_int_eq(cfg.rdzv_backend, DDPRUN_BACKEND_STATIC);
    ck_assert_str_eq(cfg.master_addr, "10.0.0.5");
    ck_assert_int_eq(cfg.master_port, 7000);
    ck_assert_str_eq(cfg.rdzv_host, "10.0.0.5");
    ck_assert_int_eq(cfg.rdzv_port, 7000);
    /* A one-node static job with an endpoint stays static (torchrun checks the endpoint). */
    PARSE_OK("--rdzv-endpoint", "h:7001", "t");
    ck_assert_int_eq(cfg.rdzv_backend, DDPRUN_BACKEND_STATIC);
    ck_assert_int_eq(cfg.master_port, 7001);
    ddprun_config_free(&cfg);
}
END_TEST

START_TEST(nproc_auto_cpu_gpu)
{
    cpu_set_t set;
    ck_assert_int_eq(sched_getaffinity(0, sizeof set, &set), 0);
    int cpus = CPU_COUNT(&set);

    PARSE_OK("--nproc-per-node", "cpu", "t");
    ck_assert_int_eq(cfg.nproc_per_node, cpus);
    PARSE_OK("--nproc-per-node", "auto", "t"); /* no GPU: the CPUs */
    ck_assert_int_eq(cfg.nproc_per_node, cpus);
    PARSE_ERR("--nproc-per-node: 'gpu' given, but no GPU is visible", "--nproc-per-node", "gpu",
              "t");
    setenv("CUDA_VISIBLE_DEVICES", "0,1", 1); /* no devices behind it */
    PARSE_ERR("no GPU is visible", "--nproc-per-node", "gpu", "t");
    unsetenv("CUDA_VISIBLE_DEVICES");

    fake_gpus(4);
    PARSE_OK("--nproc-per-node", "gpu", "t");
    ck_assert_int_eq(cfg.nproc_per_node, 4);
    PARSE_OK("--nproc-per-node", "auto", "t");
    ck_assert_int_eq(cfg.nproc_per_node, 4);
    setenv("CUDA_VISIBLE_DEVICES", "2,3", 1);
    PARSE_OK("--nproc-per-node", "gpu", "t");
    ck_assert_int_eq(cfg.nproc_per_node, 2);
    setenv("CUDA_VISIBLE_DEVICES", "1,7,2", 1); /* CUDA stops at the first invalid index */
    PARSE_OK("--nproc-per-node", "gpu", "t");
    ck_assert_int_eq(cfg.nproc_per_node, 1);
    setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb,GPU-cccc", 1);
    PARSE_OK("--nproc-per-node", "gpu", "t");
    ck_assert_int_eq(cfg.nproc_per_node, 3);
    setenv("CUDA_VISIBLE_DEVICES", "", 1); /* nothing visible */
    PARSE_OK("--nproc-per-node", "auto", "t");
    ck_assert_int_eq(cfg.nproc_per_node, cpus);
    setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
    PARSE_ERR("no GPU is visible", "--nproc-per-node", "gpu", "t");
    setenv("PET_NPROC_PER_NODE", "auto", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    PARSE_OK("t");
    ck_assert_int_eq(cfg.nproc_per_node, 4);
    ddprun_config_free(&cfg);
}
END_TEST

/* A step of `srun --ntasks-per-node=1` on the whole allocation, as Slurm 22.05 sets it. */
static void slurm_env(const char *nodes, const char *id, const char *list)
{
    setenv("SLURM_JOB_ID", "4242", 1);
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_JOB_NUM_NODES", nodes, 1);
    setenv("SLURM_NNODES", nodes, 1);
    setenv("SLURM_STEP_NUM_NODES", nodes, 1);
    setenv("SLURM_STEP_NUM_TASKS", nodes, 1);
    setenv("SLURM_NODEID", id, 1);
    setenv("SLURM_PROCID", id, 1);
    setenv("SLURM_JOB_NODELIST", list, 1);
    setenv("SLURM_NODELIST", list, 1);
    setenv("SLURM_STEP_NODELIST", list, 1);
}

START_TEST(slurm_defaults)
{
    slurm_env("4", "2", "gpu[08-11]");
    PARSE_OK("t");
    ck_assert(cfg.from_slurm);
    ck_assert_int_eq(cfg.nnodes_min, 4);
    ck_assert_int_eq(cfg.nnodes_max, 4);
    ck_assert_int_eq(cfg.node_rank, 2);
    ck_assert_str_eq(cfg.master_addr, "gpu08");
    ck_assert_int_eq(cfg.rdzv_backend, DDPRUN_BACKEND_STATIC);
    ck_assert_str_eq(cfg.rdzv_host, "gpu08");
    ck_assert_int_eq(cfg.rdzv_port, 29500);

    /* The command line wins, per option. */
    PARSE_OK("--nnodes", "8", "--node-rank", "5", "--master-addr", "m", "t");
    ck_assert_int_eq(cfg.nnodes_max, 8);
    ck_assert_int_eq(cfg.node_rank, 5);
    ck_assert_str_eq(cfg.master_addr, "m");
    ck_assert(!cfg.from_slurm);
    PARSE_OK("--master_addr=m", "t");
    ck_assert(cfg.from_slurm);
    ck_assert_int_eq(cfg.nnodes_max, 4);
    ck_assert_str_eq(cfg.master_addr, "m");

    /* So does PET_<NAME>. */
    setenv("PET_NNODES", "6", 1);
    setenv("PET_MASTER_ADDR", "pm", 1);
    PARSE_OK("t");
    ck_assert_int_eq(cfg.nnodes_max, 6);
    ck_assert_int_eq(cfg.node_rank, 2);
    ck_assert_str_eq(cfg.master_addr, "pm");
    unsetenv("PET_NNODES");
    unsetenv("PET_MASTER_ADDR");

    /* One Slurm node: torchrun's one-node rule then applies. */
    slurm_env("1", "0", "solo");
    PARSE_OK("t");
    ck_assert_int_eq(cfg.nnodes_max, 1);
    ck_assert_int_eq(cfg.rdzv_port, 0);

    /* All the step's variables, or none is used. */
    slurm_env("4", "2", "a[1-4]");
    unsetenv("SLURM_JOB_ID");
    PARSE_OK("t");
    ck_assert(!cfg.from_slurm);
    ck_assert_int_eq(cfg.nnodes_max, 1);
    slurm_env("4", "2", "a[1-4]");
    unsetenv("SLURM_STEP_NODELIST");
    PARSE_OK("t");
    ck_assert(!cfg.from_slurm);
    ck_assert_ptr_null(cfg.warnings);

    /* Bad Slurm values name the variable and the option. */
    slurm_env("4", "2", "a[1-");
    PARSE_ERR("--master-addr (from SLURM_STEP_NODELIST): malformed host list 'a[1-'", "t");
    PARSE_OK("--master-addr", "ok", "t"); /* not looked at */
    slurm_env("x", "0", "a");
    PARSE_ERR("--nnodes (from SLURM_STEP_NUM_NODES)", "t");
    slurm_env("2", "2", "a,b");
    PARSE_ERR("--node-rank (from SLURM_NODEID): 2 is not below the node count 2", "t");
    slurm_env("2", "1", "a[1-2],b[3-4]");
    PARSE_OK("t");
    ck_assert_str_eq(cfg.master_addr, "a1");
    ddprun_config_free(&cfg);
}
END_TEST

/* `salloc -N2 srun -N1 -w node2 ddprun ...`: the step's node list and counts, not the job's (in
 * such a step SLURM_NODELIST is the job's list too). */
START_TEST(slurm_subset_step)
{
    slurm_env("1", "0", "node2");
    setenv("SLURM_JOB_NUM_NODES", "2", 1);
    setenv("SLURM_JOB_NODELIST", "node[1-2]", 1);
    setenv("SLURM_NODELIST", "node[1-2]", 1);
    PARSE_OK("--nnodes", "1", "--master-port", "29501", "t");
    ck_assert(cfg.from_slurm);
    ck_assert_str_eq(cfg.master_addr, "node2");
    ck_assert_int_eq(cfg.node_rank, 0);
    /* Two of three nodes, this one the second of the step. */
    slurm_env("2", "1", "n[2-3]");
    setenv("SLURM_JOB_NUM_NODES", "3", 1);
    setenv("SLURM_JOB_NODELIST", "n[1-3]", 1);
    setenv("SLURM_NODELIST", "n[1-3]", 1);
    PARSE_OK("t");
    ck_assert_int_eq(cfg.nnodes_max, 2);
    ck_assert_int_eq(cfg.node_rank, 1);
    ck_assert_str_eq(cfg.master_addr, "n2");
    ck_assert_ptr_null(cfg.warnings);
    ddprun_config_free(&cfg);
}
END_TEST

/* A batch script (or an salloc shell): SLURM_JOB_ID and the job's variables, no SLURM_STEP_ID.
 * ddprun is then a one-node job, and says so when the allocation has more nodes. */
START_TEST(slurm_batch_script)
{
    setenv("SLURM_JOB_ID", "77", 1);
    setenv("SLURM_JOB_NUM_NODES", "2", 1);
    setenv("SLURM_NNODES", "2", 1);
    setenv("SLURM_NODEID", "0", 1);
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_JOB_NODELIST", "b[1-2]", 1);
    setenv("SLURM_NODELIST", "b[1-2]", 1);
    PARSE_OK("t");
    ck_assert(!cfg.from_slurm);
    ck_assert_int_eq(cfg.nnodes_max, 1);
    ck_assert_int_eq(cfg.rdzv_port, 0); /* torchrun's one-node rule: a local store */
    ck_assert_ptr_nonnull(cfg.warnings);
    ck_assert_msg(strstr(cfg.warnings, "warning: Slurm job 77 has 2 nodes, but this is "
                                       "not a step of it") &&
                      strstr(cfg.warnings, "srun --ntasks-per-node=1"),
                  "%s", cfg.warnings);
    /* Told the node count, no warning. */
    PARSE_OK("--nnodes", "1", "t");
    ck_assert_ptr_null(cfg.warnings);
    /* A one-node allocation: nothing to say. */
    setenv("SLURM_JOB_NUM_NODES", "1", 1);
    PARSE_OK("t");
    ck_assert_ptr_null(cfg.warnings);
    ddprun_config_free(&cfg);
}
END_TEST

/* `srun -N2 -n4 ddprun ...`: two tasks per node. Each task is a node of the job, ranked by
 * SLURM_PROCID, and task 0 warns (once for the step). */
START_TEST(slurm_tasks_per_node)
{
    slurm_env("2", "1", "m[1-2]");
    setenv("SLURM_STEP_NUM_TASKS", "4", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2)", 1);
    setenv("SLURM_PROCID", "3", 1);
    PARSE_OK("t");
    ck_assert(cfg.from_slurm);
    ck_assert_int_eq(cfg.nnodes_max, 4);
    ck_assert_int_eq(cfg.node_rank, 3);
    ck_assert_str_eq(cfg.master_addr, "m1");
    ck_assert_ptr_null(cfg.warnings);
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NODEID", "0", 1);
    PARSE_OK("t");
    ck_assert_int_eq(cfg.node_rank, 0);
    ck_assert_ptr_nonnull(cfg.warnings);
    ck_assert_msg(strstr(cfg.warnings, "the Slurm step runs 4 tasks on 2 nodes "
                                       "(SLURM_STEP_TASKS_PER_NODE=2(x2))") &&
                      strstr(cfg.warnings, "one task per node"),
                  "%s", cfg.warnings);
    setenv("SLURM_PROCID", "5", 1);
    PARSE_ERR("--node-rank (from SLURM_PROCID): 5 is not below the node count 4", "t");
    ddprun_config_free(&cfg);
}
END_TEST

/* Writes a file of `mode` holding `text` under dir; returns its path (static buffer). */
static const char *make_file(const char *dir, const char *name, const char *text, mode_t mode)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    ck_assert_int_eq(chmod(path, mode), 0);
    return path;
}

/* What runs: torchrun's "python -u SCRIPT" for any name, except programs python cannot run. */
START_TEST(python_or_program)
{
    char dir[] = "/tmp/ddprun-test-prog-XXXXXX", path[300], cwd[4096];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    ck_assert_int_eq(chdir(dir), 0);

    /* A Python script named trainer, no .py: python, with or without the execute bit or a
     * python '#!' line, named with or without a directory. */
    make_file(dir, "trainer", "import os\nprint(os.environ['RANK'])\n", 0644);
    PARSE_OK("trainer", "--lr", "1");
    ck_assert(cfg.python);
    ck_assert_str_eq(cfg.argv[0], "trainer");
    make_file(dir, "trainer", "#!/usr/bin/env python3\nprint(1)\n", 0755);
    PARSE_OK("trainer");
    ck_assert(cfg.python);
    snprintf(path, sizeof path, "%s/trainer", dir);
    PARSE_OK(path);
    ck_assert(cfg.python);
    make_file(dir, "trainer", "print(1)\n", 0755);
    PARSE_OK("./trainer");
    ck_assert(cfg.python);
    /* A file that does not exist anywhere: python, which says so (as torchrun). */
    PARSE_OK("no-such-trainer");
    ck_assert(cfg.python);
    PARSE_OK("t.py");
    ck_assert(cfg.python);

    /* Programs: binaries, scripts with another interpreter; on PATH or in the directory. */
    make_file(dir, "run.sh", "#!/bin/sh\necho hi\n", 0755);
    PARSE_OK("./run.sh");
    ck_assert(!cfg.python);
    ck_assert_str_eq(cfg.program, "./run.sh");
    PARSE_OK("run.sh");
    ck_assert(!cfg.python);
    ck_assert_str_eq(cfg.program, "./run.sh"); /* exec would not look in the directory */
    PARSE_OK("/bin/false");
    ck_assert(!cfg.python);
    ck_assert_str_eq(cfg.program, "/bin/false");
    PARSE_OK("sh", "-c", "true");
    ck_assert(!cfg.python);
    ck_assert_str_eq(cfg.program, "sh");
    /* ...but not without the execute bit, and not .py, -m or --run-path. */
    make_file(dir, "run.sh", "#!/bin/sh\necho hi\n", 0644);
    PARSE_OK("./run.sh");
    ck_assert(cfg.python);
    make_file(dir, "x.py", "#!/bin/sh\necho hi\n", 0755);
    PARSE_OK("x.py");
    ck_assert(cfg.python);
    PARSE_OK("-m", "sh");
    ck_assert(cfg.python && cfg.module);

    /* --no-python: the program as named, looked up on PATH by exec. */
    PARSE_OK("--no-python", "trainer");
    ck_assert(!cfg.python);
    ck_assert_str_eq(cfg.program, "trainer");

    /* --run-path: python, on the path as given, relative ones too (torchrun's workers call
     * runpy.run_path() on it from the directory they inherit). */
    PARSE_OK("--run-path", "--no-python", path);
    ck_assert(cfg.python);
    PARSE_OK("--run-path", "trainer");
    ck_assert(cfg.python && cfg.run_path);
    ck_assert_str_eq(cfg.program, "trainer");
    setenv("PET_RUN_PATH", "1", 1);
    PARSE_OK("sub/t.py");
    ck_assert(cfg.python && cfg.run_path);
    ck_assert_str_eq(cfg.program, "sub/t.py");
    unsetenv("PET_RUN_PATH");

    ck_assert_int_eq(chdir(cwd), 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
    ddprun_config_free(&cfg);
}
END_TEST

/* --virtual-local-rank: torchrun's device choice, and a usage error when a rank has none. */
START_TEST(virtual_local_rank)
{
    char dev[16];
    ck_assert_int_eq(ddprun_virtual_device(NULL, 3, dev, sizeof dev), 0);
    ck_assert_str_eq(dev, "3");
    ck_assert_int_eq(ddprun_virtual_device("4,5, 6 ,GPU-ab", 2, dev, sizeof dev), 0);
    ck_assert_str_eq(dev, "6");
    ck_assert_int_eq(ddprun_virtual_device("4,5, 6 ,GPU-ab", 3, dev, sizeof dev), 0);
    ck_assert_str_eq(dev, "GPU-ab");
    ck_assert_int_eq(ddprun_virtual_device("4,5", 2, dev, sizeof dev), -ERANGE);
    ck_assert_int_eq(ddprun_virtual_device("4,5", 0, dev, 1), -ERANGE);

    PARSE_OK("--virtual-local-rank", "--nproc-per-node", "4", "t");
    ck_assert(cfg.virtual_local_rank);
    setenv("CUDA_VISIBLE_DEVICES", "1,3", 1);
    PARSE_OK("--virtual-local-rank", "--nproc-per-node", "2", "t");
    PARSE_ERR("--virtual-local-rank: local rank 2 has no device in CUDA_VISIBLE_DEVICES=1,3",
              "--virtual-local-rank", "--nproc-per-node", "3", "t");
    setenv("HIP_VISIBLE_DEVICES", "0", 1);
    PARSE_ERR("local rank 1 has no device in HIP_VISIBLE_DEVICES=0", "--virtual-local-rank",
              "--nproc-per-node", "2", "t");
    unsetenv("HIP_VISIBLE_DEVICES");
    ddprun_config_free(&cfg);
}
END_TEST

/* Options that change nothing in ddprun: accepted, with one warning line each. */
START_TEST(ignored_options_warn)
{
    PARSE_OK("--monitor-interval", "1", "--start-method", "fork", "t");
    ck_assert_ptr_null(cfg.warnings);
    PARSE_OK("--numa-binding", "node", "--logs-specs", "x", "--event-log-handler", "console",
             "--duplicate-stdout-filters", "a", "--duplicate-stderr-filters", "b", "--local-addr",
             "10.0.0.1", "--signals-to-handle", "SIGTERM,SIGUSR1, SIGALRM", "t");
    const char *want[] = {
        "warning: --numa-binding has no effect in ddprun",
        "warning: --logs-specs has no effect in ddprun",
        "warning: --event-log-handler has no effect in ddprun",
        "warning: --duplicate-stdout-filters has no effect in ddprun",
        "warning: --duplicate-stderr-filters has no effect in ddprun",
        "warning: --local-addr has no effect in ddprun",
        "warning: --signals-to-handle: ddprun does not forward SIGALRM ",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(cfg.warnings, want[i]), "'%s' not in '%s'", want[i], cfg.warnings);
    int lines = 0;
    for (const char *p = cfg.warnings; *p; p++)
        lines += *p == '\n';
    ck_assert_int_eq(lines, 7);
    setenv("PET_EVENT_LOG_HANDLER", "console", 1);
    PARSE_OK("t");
    ck_assert_str_eq(cfg.warnings, "warning: --event-log-handler (from "
                                   "PET_EVENT_LOG_HANDLER) has no effect in ddprun: it has no "
                                   "event log handlers\n");
    ddprun_config_free(&cfg);
}
END_TEST

START_TEST(help_and_version)
{
    /* Help goes to stdout; keep the test log clean, and give stdout back afterwards for the
     * runner's own report (it shares this process when run with CK_FORK=no). */
    fflush(stdout);
    int saved_stdout = dup(STDOUT_FILENO);
    ck_assert_int_ge(saved_stdout, 0);
    ck_assert_ptr_nonnull(freopen("/dev/null", "w", stdout));
    memset(&cfg, 0x5a, sizeof cfg);
    ck_assert_int_eq(parse("--help", NULL), 1);
    ck_assert_int_eq(parse("-h", NULL), 1);
    ck_assert_int_eq(parse("--nnodes", "2", "--version", NULL), 1);
    ck_assert_int_eq(parse("--print-completion", "bash", NULL), 1);
    ck_assert_int_eq(parse("--print_completion=zsh", NULL), 1);
    ck_assert_int_eq(parse("--print-completion", "tcsh", NULL), 1);
    /* cfg is written only on success. */
    ck_assert_int_eq(cfg.nproc_per_node, 0x5a5a5a5a);
    ck_assert_int_eq(parse("--bad", NULL), -EINVAL);
    ck_assert_int_eq(cfg.nproc_per_node, 0x5a5a5a5a);
    /* After the script, --help belongs to the script. */
    memset(&cfg, 0, sizeof cfg);
    PARSE_OK("t.py", "--help");
    ck_assert_str_eq(cfg.argv[1], "--help");
    ddprun_config_free(&cfg);
    ddprun_config_free(&cfg); /* twice, and on NULL */
    ddprun_config_free(NULL);
    fflush(stdout);
    ck_assert_int_eq(dup2(saved_stdout, STDOUT_FILENO), STDOUT_FILENO);
    close(saved_stdout);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Slurm host lists.                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* Expands `list` and compares with the space-separated `want`. */
static void expect_hosts(const char *list, const char *want)
{
    char **h = NULL;
    size_t n = 0;
    int rc = ddprun_slurm_expand(list, &h, &n);
    ck_assert_msg(rc == 0, "'%s': rc %d", list, rc);
    char got[1024] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%s", i ? " " : "", h[i]);
    ck_assert_msg(strcmp(got, want) == 0, "'%s' gave '%s', want '%s'", list, got, want);
    ddprun_slurm_free(h, n);
}

START_TEST(slurm_expand)
{
    expect_hosts("node7", "node7");
    expect_hosts("host1,host2", "host1 host2");
    expect_hosts("gpu[01-04,07]", "gpu01 gpu02 gpu03 gpu04 gpu07");
    expect_hosts("gpu[08-11]", "gpu08 gpu09 gpu10 gpu11");
    expect_hosts("n[8-11]", "n8 n9 n10 n11");
    expect_hosts("n[098-101]", "n098 n099 n100 n101");
    expect_hosts("a[1-2],b[3-4]", "a1 a2 b3 b4");
    expect_hosts("x[1,3-4]y", "x1y x3y x4y");
    expect_hosts("login,gpu[1-2],cpu[05]", "login gpu1 gpu2 cpu05");
    expect_hosts("r[1-2]-n[01-02]", "r1-n01 r1-n02 r2-n01 r2-n02");
    expect_hosts("[1-2]", "1 2");
    expect_hosts("a.example.com,b-1", "a.example.com b-1");
    expect_hosts("n[0]", "n0");

    char **h = (char **)0x1;
    size_t n = 77;
    const char *bad[] = {"",        "a[1-",     "a[3-1]",        "a[]",         "a]",
                         "a[[1]]",  "a[1-2",    "a[x]",          "a,,b",        ",a",
                         "a,",      "a[1-2]]",  "a[1,]",         "a[,1]",       "a[-1]",
                         "a[1--2]", "a[1-2-3]", "a[1234567890]", "a[0-999999]", "a[1-300]b[1-300]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = ddprun_slurm_expand(bad[i], &h, &n);
        ck_assert_msg(rc == -EINVAL, "'%s' gave %d", bad[i], rc);
        ck_assert_ptr_eq(h, (char **)0x1);
        ck_assert_uint_eq(n, 77);
    }
    ck_assert_int_eq(ddprun_slurm_expand(NULL, &h, &n), -EINVAL);
    ddprun_slurm_free(NULL, 0);

    /* The limit itself is fine. */
    ck_assert_int_eq(ddprun_slurm_expand("a[1-65536]", &h, &n), 0);
    ck_assert_uint_eq(n, DDPRUN_SLURM_MAX_HOSTS);
    ck_assert_str_eq(h[n - 1], "a65536");
    ddprun_slurm_free(h, n);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("launcher_options");
    TCase *tc =
        check_tcase(s, "options", 30, defaults_are_torchrun_defaults, both_spellings,
                    equals_form_and_abbreviations, script_and_its_arguments,
                    pet_defaults_and_precedence, shutdown_timeout_sources, hung_timeout,
                    store_proxy, errors_name_their_flag, duration_ranges, module_no_python_run_path,
                    rdzv_conf_parsing, liveness_settings, monitor_slice, redirects_and_tee,
                    local_ranks_filter, standalone, endpoints, control_plane, nproc_auto_cpu_gpu,
                    slurm_defaults, slurm_subset_step, slurm_batch_script, slurm_tasks_per_node,
                    python_or_program, virtual_local_rank, ignored_options_warn, help_and_version);
    tcase_add_test(tc, tty_choice);
    tcase_add_checked_fixture(tc, setup, teardown);

    check_tcase(s, "slurm_expand", 30, slurm_expand);

    return check_run(s);
}
