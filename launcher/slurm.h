/*
 * Slurm host lists ("gpu[01-04,07],login1") expanded into host names. Internal to the launcher;
 * pure string work, no I/O.
 */
#ifndef DDPRUN_SLURM_H
#define DDPRUN_SLURM_H

#include <stddef.h>

/* Most host names one list may expand to; longer lists are refused as malformed. */
#define DDPRUN_SLURM_MAX_HOSTS 65536

/*
 * Expands a Slurm host list as SLURM_STEP_NODELIST carries it: comma-separated items, each of
 * literal text and bracket groups of numbers and ranges (`node[1-3,7]`, `rack[1-2]-n[01-02]`,
 * `x[1,3-4]y`). A range keeps the width of its lower bound, so `gpu[08-11]` gives gpu08 ... gpu11.
 * Several bracket groups in one item expand as their product, the leftmost varying slowest.
 *
 * list is borrowed. On success *hosts is a new array of *n new strings, in list order, to be
 * released with ddprun_slurm_free(); on failure neither is written.
 * Returns 0, -EINVAL for an empty or malformed list (unbalanced or nested brackets, an empty item
 * or range, a range whose end is below its start, numbers of more than 9 digits, more than
 * DDPRUN_SLURM_MAX_HOSTS hosts), or -ENOMEM.
 * Thread-safe.
 */
int ddprun_slurm_expand(const char *list, char ***hosts, size_t *n);

/* Frees what ddprun_slurm_expand() returned; accepts NULL. */
void ddprun_slurm_free(char **hosts, size_t n);

#endif /* DDPRUN_SLURM_H */
