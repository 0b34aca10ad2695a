/*
 * The option table shared by options.c (the parser) and options_table.c (the table, --help and
 * --print-completion). Internal to the launcher.
 */
#ifndef DDPRUN_OPTIONS_TABLE_H
#define DDPRUN_OPTIONS_TABLE_H

#include <stddef.h>

#include "cli.h"

/* The options' ids: the `id` of each row of ddprun__options, and the index of its value. */
enum opt_id {
    O_NNODES,
    O_NPROC_PER_NODE,
    O_RDZV_BACKEND,
    O_RDZV_ENDPOINT,
    O_RDZV_ID,
    O_RDZV_CONF,
    O_STANDALONE,
    O_MAX_RESTARTS,
    O_MONITOR_INTERVAL,
    O_START_METHOD,
    O_EVENT_LOG_HANDLER,
    O_ROLE,
    O_MODULE,
    O_NO_PYTHON,
    O_RUN_PATH,
    O_LOG_DIR,
    O_REDIRECTS,
    O_TEE,
    O_LOG_LINE_PREFIX_TEMPLATE,
    O_LOCAL_RANKS_FILTER,
    O_DUPLICATE_STDOUT_FILTERS,
    O_DUPLICATE_STDERR_FILTERS,
    O_NODE_RANK,
    O_MASTER_ADDR,
    O_MASTER_PORT,
    O_LOCAL_ADDR,
    O_LOGS_SPECS,
    O_NUMA_BINDING,
    O_SIGNALS_TO_HANDLE,
    O_SHUTDOWN_TIMEOUT,
    O_VIRTUAL_LOCAL_RANK,
    O_PRINT_COMPLETION,
    O_NO_PREFIX,
    O_HUNG_TIMEOUT,
    O_TOKEN_FILE,
    O_ALLOW,
    O_NO_PID_NAMESPACE,
    O_STORE_PROXY,
    O_TTY,
    O_HELP,
    O_VERSION,
    O_COUNT
};

extern const cli_option ddprun__options[]; /* ddprun__noptions rows, in --help's order */
extern const size_t ddprun__noptions;

/* Writes PET_<NAME> of option `o` into buf (len bytes, truncated). */
void ddprun__pet_name(const cli_option *o, char *buf, size_t len);

/* --print-completion: writes the completion script for `shell` (bash, zsh, tcsh) to stdout. */
void ddprun__print_completion(const char *shell);

#endif /* DDPRUN_OPTIONS_TABLE_H */
