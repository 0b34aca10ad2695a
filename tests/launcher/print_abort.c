/*
 * A worker that crashes after printing: two lines with printf(), neither flushed, to standard
 * output, then abort(). C's stdio keeps them in its buffer when standard output is a pipe (they
 * die with the process) and writes each at its newline on a terminal. For tests/launcher/tty.sh.
 */
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    printf("line 1 before abort\n");
    printf("line 2 before abort\n");
    abort();
}
