/*
 * ddp-guard: the program ddprun starts as each worker's guard ("ddp-guard") and as the init of
 * the workers' PID namespace ("ddp-init"), telling the two apart by argv[0] (guard.c has both).
 * A program of its own, linking nothing but libc, so that starting a worker costs one small exec
 * rather than loading ddprun's libraries again. Not meant to be run by hand.
 */
#include "guard.h"

#include <string.h>

int main(int argc, char **argv)
{
    if (argc > 0 && strcmp(argv[0], INIT_NAME) == 0)
        return init_main();
    return shim_main(argc, argv);
}
