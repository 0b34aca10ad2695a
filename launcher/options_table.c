/*
 * ddprun's options, spelled once: the table every option's spellings, argument, default, help
 * text and PET_<NAME> default live in, and what is printed from it alone (--help,
 * --print-completion). options.c parses with it; through tests/test_help_man.sh the man page is
 * checked against the --help it prints. No parsing here, and nothing read but the table.
 */
#include "options.h"
#include "options_table.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/*
 * The options, as cli_option rows: {id, spellings, the argument's name in --help (NULL for a
 * flag), the default (as --help shows it and as parsing starts; NULL: none), whether PET_<NAME>
 * supplies the default as torchrun's env/check_env do (the tag column), help}. The first
 * spelling that starts with "--" names PET_<NAME>. The order is torchrun's --help order, then
 * ddprun's own options.
 */
const cli_option ddprun__options[] = {
    {O_NNODES,
     {"--nnodes"},
     "N|MIN:MAX",
     "1:1",
     true,
     "Number of nodes, or the range MIN:MAX of an elastic job."},
    {O_NPROC_PER_NODE,
     {"--nproc-per-node", "--nproc_per_node"},
     "N|auto|cpu|gpu",
     "1",
     true,
     "Workers per node: a positive integer; 'gpu' for one per visible GPU; 'cpu' for one per "
     "usable CPU; 'auto' for 'gpu' when there are GPUs, else 'cpu'."},
    {O_RDZV_BACKEND,
     {"--rdzv-backend", "--rdzv_backend"},
     "static|c10d|etcd|etcd-v2",
     "static",
     true,
     "Rendezvous backend: static (node ranks given, node 0 serves the store), c10d (elastic; "
     "the endpoint's host serves the store, and the job ends with it) or etcd (elastic, in an "
     "etcd cluster; each round's first node serves the store, so the job outlives any node; "
     "etcd-v2 is the same)."},
    {O_RDZV_ENDPOINT,
     {"--rdzv-endpoint", "--rdzv_endpoint"},
     "HOST[:PORT]",
     "",
     true,
     "Rendezvous endpoint. The c10d backend's port defaults to 29400; with the static backend it "
     "replaces --master-addr and --master-port; with etcd, any members of the cluster, "
     "HOST[:PORT][,HOST[:PORT]...] (port 2379)."},
    {O_RDZV_ID,
     {"--rdzv-id", "--rdzv_id"},
     "ID",
     "none",
     true,
     "Job id, the same on every node of a job."},
    {O_RDZV_CONF,
     {"--rdzv-conf", "--rdzv_conf"},
     "KEY=VALUE,...",
     "",
     true,
     "Rendezvous settings: join_timeout, last_call_timeout, close_timeout, read_timeout, "
     "timeout (seconds), is_host (true/false), cas_backoff_max_seconds, store_type (tcp); "
     "node liveness: a node beats every keep_alive_interval seconds (5, at least 0.1) and "
     "counts as dead after heartbeat_timeout seconds without a beat (at least 1; default "
     "keep_alive_interval x keep_alive_max_attempt (3), which must be at least 1 too); one "
     "whose connection to the store closes, at once. etcd: protocol (http/https), cacert, "
     "cert, key (PEM files; also ca_cert, ssl_cert, ssl_cert_key), timeout is the join "
     "timeout, and the liveness timeout is the TTL of each node's lease."},
    {O_STANDALONE,
     {"--standalone"},
     NULL,
     NULL,
     true,
     "Single node: the c10d backend on a free local port with a random --rdzv-id; "
     "--rdzv-backend, --rdzv-endpoint, --rdzv-id and --nnodes are ignored."},
    {O_MAX_RESTARTS,
     {"--max-restarts", "--max_restarts"},
     "N",
     "0",
     true,
     "Restarts of the worker group before the job fails."},
    {O_MONITOR_INTERVAL,
     {"--monitor-interval", "--monitor_interval"},
     "SECONDS",
     "0.1",
     true,
     "Accepted for torchrun compatibility; ddprun reacts to worker exits at once."},
    {O_START_METHOD,
     {"--start-method", "--start_method"},
     "spawn|fork|forkserver",
     "spawn",
     true,
     "Accepted for torchrun compatibility; every worker is a fresh exec."},
    {O_EVENT_LOG_HANDLER,
     {"--event-log-handler", "--event_log_handler"},
     "NAME",
     "null",
     true,
     "Accepted for torchrun compatibility; a name other than 'null' is warned of (no "
     "effect)."},
    {O_ROLE, {"--role"}, "ROLE", "default", true, "Role name of the workers (ROLE_NAME)."},
    {O_MODULE,
     {"-m", "--module"},
     NULL,
     NULL,
     true,
     "Run the training script as a Python module, like 'python -m'."},
    {O_NO_PYTHON,
     {"--no-python", "--no_python"},
     NULL,
     NULL,
     true,
     "Run the training script as a program, without 'python -u' in front. Without it, "
     "binaries and scripts whose '#!' line names no python also run as programs."},
    {O_RUN_PATH,
     {"--run-path", "--run_path"},
     NULL,
     NULL,
     true,
     "Run the training script with 'python -u' (torchrun runs it with runpy.run_path in its "
     "own interpreter); a relative path is taken from the working directory, as torchrun's "
     "workers do. Takes precedence over --no-python and -m."},
    {O_LOG_DIR,
     {"--log-dir", "--log_dir"},
     "DIR",
     NULL,
     true,
     "Base directory for the workers' log and error files; each run writes into a new "
     "<run id>_XXXXXX directory in it, named at start."},
    {O_REDIRECTS,
     {"-r", "--redirects"},
     "STD|MAP",
     "0",
     true,
     "Redirect workers' streams to files under --log-dir (else a new temporary directory): "
     "0 none, 1 stdout, 2 stderr, 3 both; or per local rank, e.g. 0:1,1:2."},
    {O_TEE,
     {"-t", "--tee"},
     "STD|MAP",
     "0",
     true,
     "Like --redirects, but also keep the streams on the console."},
    {O_LOG_LINE_PREFIX_TEMPLATE,
     {"--log-line-prefix-template", "--log_line_prefix_template"},
     "TEMPLATE",
     "[${rank}]:",
     true,
     "Prefix of console lines; ${role_name}, ${local_rank}, ${rank} and ${hostname} are "
     "replaced. TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE is also read."},
    {O_LOCAL_RANKS_FILTER,
     {"--local-ranks-filter", "--local_ranks_filter"},
     "RANK,...",
     "",
     true,
     "Only these local ranks reach the console; log files keep everything. Ranks this node "
     "does not run are warned of; a list of none it runs is a usage error."},
    {O_DUPLICATE_STDOUT_FILTERS,
     {"--duplicate-stdout-filters", "--duplicate_stdout_filters"},
     "TEXT,...",
     "",
     true,
     "Accepted for torchrun compatibility; warned of (no effect)."},
    {O_DUPLICATE_STDERR_FILTERS,
     {"--duplicate-stderr-filters", "--duplicate_stderr_filters"},
     "TEXT,...",
     "",
     true,
     "Accepted for torchrun compatibility; warned of (no effect)."},
    {O_NODE_RANK,
     {"--node-rank", "--node_rank"},
     "N",
     "0",
     true,
     "Rank of this node (static backend)."},
    {O_MASTER_ADDR,
     {"--master-addr", "--master_addr"},
     "ADDR",
     "127.0.0.1",
     true,
     "Address of node 0 (static backend); IPv6 as ::1 or [::1]."},
    {O_MASTER_PORT,
     {"--master-port", "--master_port"},
     "PORT",
     "29500",
     true,
     "Port on node 0 (static backend). A one-node job without it uses a free port, as "
     "torchrun does."},
    {O_LOCAL_ADDR,
     {"--local-addr", "--local_addr"},
     "ADDR",
     NULL,
     true,
     "This node's address for the others: with the etcd backend, where the workers' store is "
     "published in a round this node serves it (default: the address this node reaches etcd "
     "from). Other backends accept it and warn (workers reach the store at the rendezvous "
     "address)."},
    {O_LOGS_SPECS,
     {"--logs-specs", "--logs_specs"},
     "NAME",
     NULL,
     false,
     "Accepted for torchrun compatibility; warned of (no effect: ddprun has no plug-ins)."},
    {O_NUMA_BINDING,
     {"--numa-binding", "--numa_binding"},
     "node|socket|exclusive|core-complex",
     NULL,
     false,
     "Accepted for torchrun compatibility; warned of (no effect: no NUMA binding)."},
    {O_SIGNALS_TO_HANDLE,
     {"--signals-to-handle", "--signals_to_handle"},
     "SIG,...",
     "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
     true,
     "Checked; ddprun forwards SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the "
     "workers whatever this says, and warns of any other signal named."},
    {O_SHUTDOWN_TIMEOUT,
     {"--shutdown-timeout", "--shutdown_timeout"},
     "SECONDS",
     "30",
     true,
     "Grace between SIGTERM and SIGKILL when workers are stopped. "
     "TORCH_ELASTIC_SHUTDOWN_TIMEOUT, when set, replaces the default."},
    {O_VIRTUAL_LOCAL_RANK,
     {"--virtual-local-rank", "--virtual_local_rank"},
     NULL,
     NULL,
     true,
     "Every worker gets LOCAL_RANK 0 and sees only its own GPU: entry LOCAL_RANK of "
     "CUDA_VISIBLE_DEVICES (or HIP_VISIBLE_DEVICES), or GPU LOCAL_RANK when unset."},
    {O_PRINT_COMPLETION,
     {"--print-completion", "--print_completion"},
     "bash|zsh|tcsh",
     NULL,
     false,
     "Print a shell completion script for ddprun and exit."},
    {O_NO_PREFIX,
     {"--no-prefix"},
     NULL,
     NULL,
     false,
     "Do not prefix console lines with the worker's rank."},
    {O_HUNG_TIMEOUT,
     {"--hung-timeout", "--hung_timeout"},
     "SECONDS",
     "0",
     true,
     "Fail the node when every local worker has been stopped (SIGSTOP) or silent (no output) "
     "for SECONDS, as when a worker fails; 0 never."},
    {O_TOKEN_FILE,
     {"--token-file"},
     "PATH",
     NULL,
     false,
     "The job's secret, the same file on every node: agents and workers authenticate to the "
     "store with it. DDPRUN_TOKEN_FILE or DDPRUN_TOKEN may give it instead; a one-node job "
     "makes a random one. See SECURITY in ddprun(1)."},
    {O_ALLOW,
     {"--allow"},
     "CIDR",
     NULL,
     false,
     "Let the store serve peers in this network (e.g. 10.0.0.0/8) that did not authenticate; "
     "repeatable, or comma-separated. By default only this host and the job's nodes may."},
    {O_NO_PID_NAMESPACE,
     {"--no-pid-namespace"},
     NULL,
     NULL,
     false,
     "Start the workers in ddprun's own PID namespace and mounts even where ddprun may create "
     "some: then nothing cleans up when ddprun and its guards die at once. See PROCESS "
     "CONTAINMENT in ddprun(1)."},
    {O_STORE_PROXY,
     {"--store-proxy", "--store_proxy"},
     "on|off",
     "off",
     true,
     "Serve this node's workers from a store proxy in ddprun, which carries their connections "
     "to the store over one: MASTER_ADDR and MASTER_PORT name the proxy, and identical "
     "concurrent WAITs and GETs reach the store once. See STORE PROXY in ddprun(1)."},
    {O_TTY,
     {"--tty"},
     "auto|on|off",
     "auto",
     true,
     "Give each worker a pseudo-terminal for its standard output and one for its standard "
     "error (auto: for each of ddprun's that is a terminal), and render the workers' redrawn "
     "lines (progress bars) on a terminal as one live line per worker; off: pipes, as for a "
     "file. See OUTPUT in ddprun(1)."},
    {O_HELP, {"-h", "--help"}, NULL, NULL, false, "Show this help and exit."},
    {O_VERSION, {"--version"}, NULL, NULL, false, "Show ddprun's version and exit."},
};

const size_t ddprun__noptions = sizeof ddprun__options / sizeof ddprun__options[0];

/* PET_ + the first long spelling, upper-cased, '-' as '_' (argparse's dest). */
void ddprun__pet_name(const cli_option *o, char *buf, size_t len)
{
    const char *n = cli_long_name(o) + 2;
    size_t k = (size_t)snprintf(buf, len, "PET_");
    for (; *n && k + 1 < len; n++)
        buf[k++] = *n == '-' ? '_' : (char)toupper((unsigned char)*n);
    buf[k] = '\0';
}

/* ------------------------------------------------------------------------------------------ */
/* Help and shell completion.                                                                 */
/* ------------------------------------------------------------------------------------------ */

void ddprun_print_help(void)
{
    printf("usage: ddprun [OPTIONS] TRAINING_SCRIPT [SCRIPT_ARGS ...]\n\n");
    cli_print_wrapped(stdout,
                      "Starts --nproc-per-node workers of TRAINING_SCRIPT on this node as torchrun "
                      "does, with the same options and environment: '$PYTHON_EXEC -u "
                      "TRAINING_SCRIPT' (python3 by default), whatever the script's name, unless "
                      "--no-python is given or the script is a binary or a script whose '#!' line "
                      "names no python: those run as they are. Options end at the training "
                      "script or at '--'. A value may also follow an '=', as in --nnodes=2.",
                      0);
    printf("\noptions:\n");
    for (size_t i = 0; i < ddprun__noptions; i++) {
        const cli_option *o = &ddprun__options[i];
        char text[768];
        size_t k = (size_t)snprintf(text, sizeof text, "%s", o->help);
        char pet[64];
        ddprun__pet_name(o, pet, sizeof pet);
        if (o->def && *o->def && o->tag)
            snprintf(text + k, sizeof text - k, " (default: %s; env: %s)", o->def, pet);
        else if (o->def && *o->def)
            snprintf(text + k, sizeof text - k, " (default: %s)", o->def);
        else if (o->tag)
            snprintf(text + k, sizeof text - k, " (env: %s)", pet);
        cli_print_option(stdout, o, text, 0, CLI_HELP_WIDTH);
    }
    printf("\n");
    char text[160];
    snprintf(text, sizeof text,
             "Durations (SECONDS, and the times of --rdzv-conf) may be fractional and are at most "
             "%.0f s (over 24 days).",
             CLI_SECONDS_MAX);
    cli_print_wrapped(stdout, text, 0);
    printf("\n");
    cli_print_wrapped(stdout,
                      "Slurm: in a step (srun, one task per node), --nnodes, --node-rank and "
                      "--master-addr default to the step's node count, this node's index in the "
                      "step and the step's first host (SLURM_STEP_NUM_NODES, SLURM_NODEID, "
                      "SLURM_STEP_NODELIST). Outside a step (a batch script) ddprun runs on this "
                      "node alone. See ddprun(1).",
                      0);
}

void ddprun__print_completion(const char *shell)
{
    char words[2048] = "";
    size_t k = 0;
    for (size_t i = 0; i < ddprun__noptions; i++)
        for (int n = 0; n < 3 && ddprun__options[i].names[n]; n++)
            k += (size_t)snprintf(words + k, sizeof words - k, "%s%s", k ? " " : "",
                                  ddprun__options[i].names[n]);
    if (strcmp(shell, "bash") == 0) {
        printf("# bash completion for ddprun\ncomplete -o default -W '%s' ddprun\n", words);
    } else if (strcmp(shell, "zsh") == 0) {
        printf("#compdef ddprun\n_arguments '*:file:_files' \\\n");
        for (char *w = words; *w;) {
            size_t len = strcspn(w, " ");
            printf("  '%.*s' \\\n", (int)len, w);
            w += len + (w[len] == ' ');
        }
        printf("  && return 0\n");
    } else {
        printf("complete ddprun 'c/-/(");
        for (char *w = words; *w;) {
            size_t len = strcspn(w, " ");
            printf("%s%.*s", w == words ? "" : " ", (int)len - 1, w + 1);
            w += len + (w[len] == ' ');
        }
        printf(")/' 'p/*/f/'\n");
    }
}
