/*
 * The worker guard and the init of the workers' PID namespace (guard.c): the ddp-guard program
 * (guard_main.c), started under one name or the other, hands over to shim_main() or init_main();
 * ddprun finds it beside itself or in libexecdir (spawn.c). The process-tree helpers are ddprun's too. Internal to
 * ddprun.
 */
#ifndef DDPRUN_GUARD_H
#define DDPRUN_GUARD_H

#include <signal.h>
#include <stdbool.h>
#include <sys/types.h>

/* ddprun's helper processes: the ddp-guard program started under these names (argv[0], and
 * the name ps and pgrep match, PR_SET_NAME), which do not contain "ddprun", so that `pkill
 * ddprun` or `pgrep -f ddprun` find the agent alone. */
#define GUARD_NAME "ddp-guard"
#define INIT_NAME "ddp-init"

/* The signal that asks a guard to kill its worker and everything below it at once: ddprun's
 * SIGKILL for a worker, and the guard's parent-death signal. A real-time signal, unused else. */
#define GUARD_KILL_SIG (SIGRTMIN + 2)

/* Where in the memfd it shares with ddprun (its fd 3) a guard writes the worker's wait status
 * (waitpid(2)'s, in decimal) once the worker has exited, for ddprun to tell whether a core was
 * dumped: the guard's own exit passes on the signal but cannot pass that on. Beyond the worker's
 * pid, which the guard writes at offset 0; the bytes between stay zero. */
#define GUARD_STATUS_OFFSET 64

/* Marks every descriptor above standard error close-on-exec (the agent, at startup). */
void cloexec_inherited_fds(void);

/* State (ps's letter) and parent of process `pid` from /proc; 0, or -1 if it is gone. */
int proc_stat(pid_t pid, char *state, long *ppid);

/* SIGKILLs every descendant of this process and reaps them (see guard.c). */
void kill_descendants(bool any_child, void (*on_reaped)(pid_t, int, void *), void *arg);

/* The guard's and the init's main(): argv as started (see guard.c). Return the exit code. */
int shim_main(int argc, char **argv);
int init_main(void);

#endif /* DDPRUN_GUARD_H */
