/*
 * The C half of optim_torch.py: runs libddp's SGD, AdamW or Lion kernel for a few steps on data it
 * reads from stdin and writes every step's state to stdout, for the script to compare with
 * torch.optim. Not a unit test by itself.
 *
 *   optim-torch-driver [portable|avx2|avx512]      (no argument: the kernel set chosen at run time)
 *
 * stdin: one text line, "sgd N STEPS LR MOMENTUM NESTEROV WEIGHT_DECAY",
 * "adamw N STEPS LR BETA1 BETA2 EPS WEIGHT_DECAY" or "lion N STEPS LR BETA1 BETA2 WEIGHT_DECAY"
 * (numbers as C reads them, hexadecimal floats included), then native float32: the N initial
 * parameters, then STEPS gradients of N each. stdout, after each step: the N parameters, then
 * the optimizer state (SGD with momentum: the momentum buffer; AdamW: m, then v; Lion: m).
 * stderr: the kernel set used.
 *
 * Exit status: 0; 2 bad input or output; 3 the requested kernel set cannot run here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim.h"

static int read_floats(float *dst, size_t n)
{
    return fread(dst, sizeof *dst, n, stdin) == n ? 0 : -1;
}

static int write_floats(const float *src, size_t n)
{
    return fwrite(src, sizeof *src, n, stdout) == n ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        int isa = -1;
        for (int i = 0; i < DDP__ISA_COUNT; i++)
            if (strcmp(argv[1], ddp__optim_isa_name(i)) == 0)
                isa = i;
        if (isa < 0 || ddp__optim_use_isa(isa) != 0) {
            fprintf(stderr, "optim-torch-driver: kernel set %s cannot run here\n", argv[1]);
            return 3;
        }
    }
    fprintf(stderr, "optim-torch-driver: kernel set %s\n", ddp__optim_isa_name(ddp__optim_isa()));

    char line[512], kind[16];
    size_t n;
    int steps, nesterov = 0;
    float lr, a, b, eps = 0, wd;
    if (!fgets(line, sizeof line, stdin))
        return 2;
    int adamw = strncmp(line, "adamw ", 6) == 0, lion = strncmp(line, "lion ", 5) == 0;
    int got =
        adamw ? sscanf(line, "%15s %zu %d %g %g %g %g %g", kind, &n, &steps, &lr, &a, &b, &eps, &wd)
        : lion ? sscanf(line, "%15s %zu %d %g %g %g %g", kind, &n, &steps, &lr, &a, &b, &wd) + 1
               : sscanf(line, "%15s %zu %d %g %g %d %g", kind, &n, &steps, &lr, &a, &nesterov, &wd);
    if (got != (adamw || lion ? 8 : 7) || (!adamw && !lion && strcmp(kind, "sgd") != 0) ||
        steps < 1 || n == 0 || n > ((size_t)1 << 28)) {
        fprintf(stderr, "optim-torch-driver: bad header: %s", line);
        return 2;
    }

    float *p = malloc(n * sizeof *p), *g = malloc(n * sizeof *g);
    float *s1 = calloc(n, sizeof *s1), *s2 = calloc(n, sizeof *s2);
    int rc = 2;
    if (!p || !g || !s1 || !s2 || read_floats(p, n) != 0)
        goto out;
    for (int s = 0; s < steps; s++) {
        if (read_floats(g, n) != 0)
            goto out;
        if (adamw) {
            ddp__adamw_step(p, g, s1, s2, n, lr, a, b, eps, wd, s + 1);
        } else if (lion) {
            ddp__lion_step(p, g, s1, n, lr, a, b, wd);
        } else {
            ddp__sgd_step(p, g, a != 0.0f ? s1 : NULL, n, lr, a, nesterov, wd, s == 0);
        }
        if (write_floats(p, n) != 0 ||
            (adamw || lion || a != 0.0f ? write_floats(s1, n) : 0) != 0 ||
            (adamw ? write_floats(s2, n) : 0) != 0)
            goto out;
    }
    rc = fflush(stdout) == 0 ? 0 : 2;
out:
    free(p);
    free(g);
    free(s1);
    free(s2);
    return rc;
}
