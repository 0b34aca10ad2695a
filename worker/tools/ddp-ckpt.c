/*
 * ddp-ckpt: libddp's checkpoints from the shell (worker/libddp/ckpt.h gives the format):
 *
 *     ddp-ckpt inspect DIR [--json]             the manifest, summarised
 *     ddp-ckpt verify DIR [--all]               every shard's size and CRC32C
 *     ddp-ckpt export DIR -o FILE [--optimizer] consolidated fp32 tensors as safetensors
 *     ddp-ckpt import FILE -o ROOT [--step N]   a safetensors file as a checkpoint
 *
 * Both of the last two take --names (torch: nn.Sequential's indices for ddp-train's MLP names)
 * and --rename OLD=NEW,... (ckpt_names.h). Export copies the metadata a checkpoint's user state
 * holds (ddp-train's: the model and the input normalisation) into the file. Import checks that
 * the names make a model ddp-train builds, unless --names any.
 *
 * DIR is a checkpoint (a step-* directory) or a root holding them, which stands for its newest
 * complete checkpoint (ddp_checkpoint_latest()). The manifest is read by the library's own
 * parser and shards are checked by ddp__ckpt_verify_shard(), so that this program and the
 * library agree on what a good checkpoint is; export verifies every shard before it reads one.
 * Import writes through the library itself (a model of one rank, ddp_checkpoint_save()), so
 * libddp stays the one writer of the format; only --step then changes the manifest's step.
 *
 * Not here: other export formats, dtypes other than float32, and changing a checkpoint in
 * place (a reshard happens at load time, in the library).
 *
 * Exit status (ddp-ckpt(1)): 0 success; 1 the checkpoint or file is bad or an operation failed;
 * 2 usage error.
 */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "ckpt.h"
#include "ckpt_names.h"
#include "cli.h"
#include "coll.h"
#include "ddp.h"
#include "rdzv.h"
#include "safetensors.h"
#include "version.h"

#define PROG "ddp-ckpt"

enum { EXIT_OK = 0, EXIT_BAD = 1, EXIT_USAGE = 2 };

enum cmd { CMD_INSPECT, CMD_VERIFY, CMD_EXPORT, CMD_IMPORT, CMD_COUNT };
#define ON(c) (1 << (c))
#define ON_ALL (ON(CMD_INSPECT) | ON(CMD_VERIFY) | ON(CMD_EXPORT) | ON(CMD_IMPORT))

static const struct {
    const char *name, *args, *help;
} commands[CMD_COUNT] = {
    [CMD_INSPECT] = {"inspect", "DIR", "summarise a checkpoint's manifest"},
    [CMD_VERIFY] = {"verify", "DIR", "check every shard file's size and CRC32C"},
    [CMD_EXPORT] = {"export", "DIR -o FILE", "write the consolidated fp32 tensors to FILE"},
    [CMD_IMPORT] = {"import", "FILE -o ROOT", "make a checkpoint of a safetensors FILE"},
};

enum {
    OPT_JSON = 256,
    OPT_ALL,
    OPT_QUIET,
    OPT_FORMAT,
    OPT_OPTIMIZER,
    OPT_STEP,
    OPT_FORCE,
    OPT_VERSION,
    OPT_NAMES,
    OPT_RENAME,
};

/* --names: whose tensor names the file has. */
enum { NAMES_DDP_TRAIN, NAMES_TORCH, NAMES_ANY };
static const char *const names_words[] = {"ddp-train", "torch", "any", NULL};

/* ddp-train's MLP (model_mlp.c): linear layers at most (--layers 64, plus the output), and the
 * classes of its data sets. */
#define MLP_MAX_LINEAR 65
#define MLP_CLASSES 10
/* ddp-train's GPT (model_gpt.c): byte-level. */
#define GPT_VOCAB 256

/* The one option table: getopt_long's tables and --help are made from it; tag: the commands. */
static const cli_option opt_table[] = {
    {OPT_JSON, {"--json"}, NULL, NULL, ON(CMD_INSPECT), "inspect: print JSON instead of text."},
    {OPT_ALL,
     {"--all"},
     NULL,
     NULL,
     ON(CMD_VERIFY),
     "verify: every complete checkpoint under the root DIR, not only the newest."},
    {OPT_QUIET,
     {"--quiet"},
     NULL,
     NULL,
     ON(CMD_VERIFY),
     "verify: print only what is wrong (nothing when every file is intact)."},
    {'o',
     {"-o", "--output"},
     "PATH",
     NULL,
     ON(CMD_EXPORT) | ON(CMD_IMPORT),
     "export: the file to write; import: the checkpoint root to write into (required)."},
    {OPT_FORMAT,
     {"--format"},
     "FMT",
     "safetensors",
     ON(CMD_EXPORT),
     "export: the output format; safetensors is the one there is."},
    {OPT_OPTIMIZER,
     {"--optimizer"},
     NULL,
     NULL,
     ON(CMD_EXPORT),
     "export: also the optimizer's state arrays, as NAME.STATE for each STATE that inspect "
     "lists after param (PyTorch's names: NAME.exp_avg, ...)."},
    {OPT_STEP,
     {"--step"},
     "N",
     "0",
     ON(CMD_IMPORT),
     "import: the step the checkpoint is saved as (ROOT/step-N)."},
    {OPT_FORCE,
     {"--force"},
     NULL,
     NULL,
     ON(CMD_EXPORT) | ON(CMD_IMPORT),
     "Replace an existing output file (export) or checkpoint of the same step (import)."},
    {OPT_NAMES,
     {"--names"},
     "ddp-train|torch|any",
     "ddp-train",
     ON(CMD_EXPORT) | ON(CMD_IMPORT),
     "The file's tensor names: ddp-train's (fc1.weight, ...); torch, nn.Sequential's indices "
     "(fcK becomes module 2K-2: 0.weight, 0.bias, 2.weight, ...); any (import: as they are, "
     "unchecked, for another libddp program). Import refuses names that make no model "
     "ddp-train builds."},
    {OPT_RENAME,
     {"--rename"},
     "OLD=NEW,...",
     NULL,
     ON(CMD_EXPORT) | ON(CMD_IMPORT),
     "Rename tensors on the file's side: a name equal to OLD, or beginning with OLD and a dot, "
     "gets NEW instead of OLD (an empty NEW drops OLD and its dot: module=). Applied after "
     "--names on export, before it on import."},
    {'h', {"-h", "--help"}, NULL, NULL, ON_ALL, "Show this help and exit."},
    {OPT_VERSION, {"--version"}, NULL, NULL, ON_ALL, "Show the version and exit."},
};
#define NOPTS (sizeof(opt_table) / sizeof(opt_table[0]))

typedef struct args {
    int cmd;
    const char *arg; /* DIR or FILE */
    const char *output;
    int json, all, quiet, optimizer, force;
    long step;
    int names;          /* --names: NAMES_* */
    const char *rename; /* --rename, or NULL */
} args;

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " COMMAND [OPTIONS] ARG\n\n");
    cli_print_wrapped(f,
                      "Inspects, verifies, exports and imports libddp's sharded checkpoints. DIR "
                      "is a checkpoint (a step-* directory) or a root holding them, which stands "
                      "for its newest complete checkpoint.",
                      0);
    fprintf(f, "\ncommands:\n");
    for (int c = 0; c < CMD_COUNT; c++) {
        char left[64];
        snprintf(left, sizeof left, "%s %s", commands[c].name, commands[c].args);
        fprintf(f, "  %-24s %s\n", left, commands[c].help);
    }
    fprintf(f, "\noptions:\n");
    cli_print_options(f, opt_table, NOPTS, 0, CLI_HELP_WIDTH);
    fprintf(f, "\nexit status: 0 success; 1 the checkpoint or file is bad, or the operation "
               "failed;\n2 usage error. See ddp-ckpt(1).\n");
}

/* "ddp-ckpt: <message>" on stderr. */
#define err(...) cli_msg(stderr, PROG, __VA_ARGS__)

/* Returns -1 to exit with EXIT_OK (--help, --version), 0 to run, or EXIT_USAGE. */
static int parse_args(int argc, char **argv, args *a)
{
    *a = (args){.cmd = -1};
    cli_getopt_tables g;
    int built = cli_getopt_build(&g, opt_table, NOPTS);
    assert(built == 0); /* the table above is well-formed */
    (void)built;
    bool seen[NOPTS] = {0};
    const char *format = "safetensors";
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, g.shorts, g.longopts, NULL)) != -1) {
        const cli_option *o = cli_by_id(opt_table, NOPTS, c);
        const char *flag = o ? cli_long_name(o) : "?";
        if (o)
            seen[o - opt_table] = true;
        switch (c) {
        case OPT_JSON:
            a->json = 1;
            break;
        case OPT_ALL:
            a->all = 1;
            break;
        case OPT_QUIET:
            a->quiet = 1;
            break;
        case 'o':
            a->output = optarg;
            break;
        case OPT_FORMAT:
            format = optarg;
            break;
        case OPT_OPTIMIZER:
            a->optimizer = 1;
            break;
        case OPT_STEP:
            if (cli_report(stderr, PROG, cli_parse_long(flag, optarg, 0, INT64_MAX / 2, &a->step)) <
                0)
                return EXIT_USAGE;
            break;
        case OPT_FORCE:
            a->force = 1;
            break;
        case OPT_NAMES:
            if (cli_report(stderr, PROG,
                           cli_parse_choice(flag, optarg, "naming", names_words, &a->names)) < 0)
                return EXIT_USAGE;
            break;
        case OPT_RENAME: {
            char e[512];
            if (names_rename_check(optarg, e, sizeof e) < 0) {
                err("%s", e);
                return EXIT_USAGE;
            }
            a->rename = optarg;
            break;
        }
        case 'h':
            usage(stdout);
            return -1;
        case OPT_VERSION:
            printf(PROG " %s\n", DDPRUN_VERSION);
            return -1;
        case ':':
            err("%s needs a value", argv[optind - 1]);
            return EXIT_USAGE;
        default:
            err("unknown option '%s' (see --help)", argv[optind - 1]);
            return EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        err("no command (inspect, verify, export, import; see --help)");
        return EXIT_USAGE;
    }
    for (int k = 0; k < CMD_COUNT; k++)
        if (!strcmp(argv[optind], commands[k].name))
            a->cmd = k;
    if (a->cmd < 0) {
        err("unknown command '%s' (inspect, verify, export, import)", argv[optind]);
        return EXIT_USAGE;
    }
    const char *name = commands[a->cmd].name;
    if (argc - optind != 2) {
        err("%s: expected %s, got %d argument%s", name, commands[a->cmd].args, argc - optind - 1,
            argc - optind - 1 == 1 ? "" : "s");
        return EXIT_USAGE;
    }
    a->arg = argv[optind + 1];
    for (size_t k = 0; k < NOPTS; k++) {
        if (seen[k] && !(opt_table[k].tag & ON(a->cmd))) {
            err("%s does not apply to '%s'", cli_long_name(&opt_table[k]), name);
            return EXIT_USAGE;
        }
    }
    if ((a->cmd == CMD_EXPORT || a->cmd == CMD_IMPORT) && !a->output) {
        err("%s needs -o %s", name, a->cmd == CMD_EXPORT ? "FILE" : "ROOT");
        return EXIT_USAGE;
    }
    if (strcmp(format, "safetensors") != 0) {
        err("--format: unknown format '%s' (safetensors)", format);
        return EXIT_USAGE;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Finding the checkpoint                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* What ddp_checkpoint_latest() skipped: its warning lines, kept for the report. */
typedef struct skipped {
    char **lines;
    int n;
} skipped;

static void collect(void *arg, int level, const char *msg)
{
    skipped *s = arg;
    char **p = realloc(s->lines, (size_t)(s->n + 1) * sizeof *p);
    if (!p)
        return;
    s->lines = p;
    if ((s->lines[s->n] = strdup(msg)))
        s->n++;
    (void)level;
}

static void skipped_free(skipped *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->lines[i]);
    free(s->lines);
}

static bool has_manifest(const char *dir)
{
    char p[PATH_MAX];
    struct stat st;
    return snprintf(p, sizeof p, "%s/%s", dir, DDP__CKPT_MANIFEST) < (int)sizeof p &&
           stat(p, &st) == 0;
}

static bool is_step_dir_name(const char *dir)
{
    const char *base = strrchr(dir, '/');
    base = base && base[1] ? base + 1 : dir;
    return !strncmp(base, "step-", 5);
}

/*
 * Reads the manifest DIR stands for into *mf: DIR's own, else (DIR a root) its newest complete
 * checkpoint's, with the skipped torn ones in *sk. Prints the failure; returns 0 or EXIT_BAD.
 */
static int open_checkpoint(const char *dir, ddp__ckpt_manifest *mf, skipped *sk)
{
    char path[PATH_MAX], e[1024];
    snprintf(path, sizeof path, "%s", dir);
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        path[--n] = '\0';
    struct stat st;
    int serr = stat(path, &st) < 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    if (serr) {
        err("%s: %s", path, strerror(serr));
        return EXIT_BAD;
    }
    if (!has_manifest(path) && !is_step_dir_name(path)) {
        int rc = ddp_checkpoint_latest(dir, path, sizeof path, collect, sk);
        for (int i = 0; i < sk->n; i++)
            err("%s", sk->lines[i]);
        if (rc == 0) {
            err("%s: no complete checkpoint (no step-* directory with a %s)", dir,
                DDP__CKPT_MANIFEST);
            return EXIT_BAD;
        }
        if (rc < 0) {
            err("%s: %s", dir, strerror(-rc));
            return EXIT_BAD;
        }
    }
    int rc = ddp__ckpt_manifest_read(path, mf, e, sizeof e);
    if (rc == -ENOENT && !has_manifest(path)) {
        err("%s: no %s: the checkpoint is incomplete (a save that crashed or is still being "
            "written)",
            path, DDP__CKPT_MANIFEST);
        return EXIT_BAD;
    }
    if (rc < 0) {
        err("%s", e);
        return EXIT_BAD;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* inspect                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static uint64_t shard_bytes(const ddp__ckpt_manifest *mf)
{
    uint64_t b = 0;
    for (int r = 0; r < mf->world; r++)
        b += mf->shards[r].bytes;
    return b;
}

static size_t param_elements(const ddp__ckpt_manifest *mf)
{
    size_t n = 0;
    for (int i = 0; i < mf->nparams; i++)
        n += mf->params[i].count;
    return n;
}

/* The hyper-parameters of the manifest's optimizer (its row of libddp's table), and then
 * weight_decay and clip_norm, every optimizer's: each(arg, name, value, is_bool). */
static void each_hparam(const ddp__ckpt_manifest *mf,
                        void (*each)(void *arg, const char *name, double value, bool is_bool),
                        void *arg)
{
    ddp_options o;
    ddp__ckpt_manifest_options(mf, &o);
    const ddp__optimizer_def *def = ddp__optimizer(mf->optimizer);
    for (int k = 0; k < DDP__OPT_MAX_HPARAMS && def->hparams[k].name; k++) {
        const ddp__hparam *h = &def->hparams[k];
        const char *at = (const char *)&o + h->offset;
        each(arg, h->name, h->is_bool ? *(const bool *)at : *(const float *)at, h->is_bool);
    }
    each(arg, "weight_decay", o.weight_decay, false);
    each(arg, "clip_norm", o.clip_norm, false);
}

static void hparam_json(void *arg, const char *name, double value, bool is_bool)
{
    json_object_set_new(arg, name, is_bool ? json_boolean(value != 0) : json_real(value));
}

/* "beta1 0.9, beta2 0.999, eps 1e-08, weight decay 0, clip norm 0"; a true flag as
 * " (nesterov)", a false one not at all. */
static void hparam_print(void *arg, const char *name, double value, bool is_bool)
{
    int *first = arg;
    if (is_bool) {
        if (value != 0)
            printf(" (%s)", name);
        return;
    }
    printf("%s", *first ? " " : ", ");
    for (const char *c = name; *c; c++)
        putchar(*c == '_' ? ' ' : *c);
    printf(" %g", value);
    *first = 0;
}

static json_t *inspect_json(const ddp__ckpt_manifest *mf, const skipped *sk)
{
    json_t *o = json_pack("{s:s, s:I, s:I, s:{s:I, s:I, s:I}, s:i, s:i}", "path", mf->dir, "step",
                          (json_int_t)mf->step, "attempted", (json_int_t)mf->attempted, "progress",
                          "epoch", (json_int_t)mf->progress.epoch, "position",
                          (json_int_t)mf->progress.position, "seed", (json_int_t)mf->progress.seed,
                          "world_size", mf->world, "zero_stage", mf->stage);
    json_t *opt = json_pack("{s:s}", "kind", ddp_optimizer_name(mf->optimizer));
    each_hparam(mf, hparam_json, opt);
    json_object_set_new(o, "optimizer", opt);
    json_t *st = json_array(), *ts = json_array(), *sh = json_array();
    for (int s = 0; s < mf->nstate; s++)
        json_array_append_new(st, json_string(mf->state[s]));
    json_object_set_new(o, "state", st);
    for (int i = 0; i < mf->nparams; i++) {
        const ddp__ckpt_param *p = &mf->params[i];
        json_t *shape = json_array();
        for (int d = 0; d < p->ndim; d++)
            json_array_append_new(shape, json_integer(p->shape[d]));
        json_array_append_new(ts, json_pack("{s:s, s:s, s:o, s:s, s:I}", "name", p->name, "unit",
                                            mf->units[p->unit], "shape", shape, "dtype", "float32",
                                            "elements", (json_int_t)p->count));
    }
    json_object_set_new(o, "tensors", ts);
    json_object_set_new(o, "elements", json_integer((json_int_t)param_elements(mf)));
    json_object_set_new(o, "padded_elements", json_integer((json_int_t)mf->total));
    json_object_set_new(o, "groups", json_integer(mf->ngroups));
    for (int r = 0; r < mf->world; r++)
        json_array_append_new(sh, json_pack("{s:s, s:I, s:I}", "file", mf->shards[r].file, "bytes",
                                            (json_int_t)mf->shards[r].bytes, "crc32c",
                                            (json_int_t)mf->shards[r].crc32c));
    json_object_set_new(o, "shards", sh);
    json_object_set_new(o, "bytes", json_integer((json_int_t)shard_bytes(mf)));
    json_t *user = mf->user_json ? json_loads(mf->user_json, 0, NULL) : NULL;
    json_object_set_new(o, "user", user ? user : json_null());
    json_t *sk_a = json_array();
    for (int i = 0; i < sk->n; i++)
        json_array_append_new(sk_a, json_string(sk->lines[i]));
    json_object_set_new(o, "skipped", sk_a);
    return o;
}

static int cmd_inspect(const args *a)
{
    ddp__ckpt_manifest mf = {0};
    skipped sk = {0};
    int rc = open_checkpoint(a->arg, &mf, &sk);
    if (rc)
        goto out;
    if (a->json) {
        json_t *o = inspect_json(&mf, &sk);
        if (!o || json_dumpf(o, stdout,
                             JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) < 0) {
            err("out of memory");
            rc = EXIT_BAD;
        }
        putchar('\n');
        json_decref(o);
        goto out;
    }
    char sbuf[200];
    printf("checkpoint   %s\n", mf.dir);
    printf("step         %" PRId64 " (%" PRId64 " attempted)\n", mf.step, mf.attempted);
    printf("progress     epoch %" PRId64 ", position %" PRId64 ", seed %" PRIu64 "\n",
           mf.progress.epoch, mf.progress.position, mf.progress.seed);
    printf("world size   %d\n", mf.world);
    printf("zero stage   %d\n", mf.stage);
    int first = 1;
    printf("optimizer    %s:", ddp_optimizer_name(mf.optimizer));
    each_hparam(&mf, hparam_print, &first);
    printf("\n");
    printf("state        ");
    for (int s = 0; s < mf.nstate; s++)
        printf("%s%s", s ? ", " : "", mf.state[s]);
    size_t elems = param_elements(&mf);
    printf("\ntensors      %d in %d units: %zu elements (%.1f MiB per state array, fp32)\n",
           mf.nparams, mf.nunits, elems, (double)elems * 4 / 1048576);
    int w = 4;
    for (int i = 0; i < mf.nparams; i++)
        if ((int)strlen(mf.params[i].name) > w)
            w = (int)strlen(mf.params[i].name);
    for (int i = 0; i < mf.nparams; i++) {
        const ddp__ckpt_param *p = &mf.params[i];
        printf("  %-*s  float32  %-20s %zu\n", w, p->name,
               st_shape_str(sbuf, sizeof sbuf, p->ndim, p->shape), p->count);
    }
    printf("layout       %d group%s, %zu elements padded, %zu per shard and state array\n",
           mf.ngroups, mf.ngroups == 1 ? "" : "s", mf.total, mf.shard_total);
    uint64_t bytes = shard_bytes(&mf);
    printf("shards       %d file%s, %" PRIu64 " bytes (%.1f MiB)\n", mf.world,
           mf.world == 1 ? "" : "s", bytes, (double)bytes / 1048576);
    for (int r = 0; r < mf.world; r++)
        printf("  %s  %" PRIu64 " bytes  crc32c %08" PRIx32 "\n", mf.shards[r].file,
               mf.shards[r].bytes, mf.shards[r].crc32c);
    if (mf.user_json)
        printf("user state   %s\n", mf.user_json);
out:
    skipped_free(&sk);
    ddp__ckpt_manifest_free(&mf);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* verify                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Checks every shard of the checkpoint at dir; prints one line per bad file. */
static int verify_one(const char *dir, const args *a)
{
    ddp__ckpt_manifest mf = {0};
    skipped sk = {0};
    int rc = open_checkpoint(dir, &mf, &sk);
    if (rc)
        goto out;
    int bad = 0;
    for (int r = 0; r < mf.world; r++) {
        char e[1024];
        if (ddp__ckpt_verify_shard(&mf, r, e, sizeof e) < 0) {
            printf("%s\n", e);
            bad++;
        }
    }
    if (bad)
        rc = EXIT_BAD;
    if (bad || !a->quiet)
        printf("%s: step %" PRId64 ", %d shard file%s, %" PRIu64 " bytes: %s\n", mf.dir, mf.step,
               mf.world, mf.world == 1 ? "" : "s", shard_bytes(&mf), bad ? "DAMAGED" : "intact");
out:
    skipped_free(&sk);
    ddp__ckpt_manifest_free(&mf);
    return rc;
}

static int by_name(const void *x, const void *y)
{
    return strcmp(*(char *const *)x, *(char *const *)y);
}

/* --all: every step-* directory under the root, oldest first; the incomplete ones only told. */
static int verify_all(const args *a)
{
    DIR *d = opendir(a->arg);
    if (!d) {
        err("%s: %s", a->arg, strerror(errno));
        return EXIT_BAD;
    }
    char **names = NULL;
    int n = 0, rc = EXIT_OK, complete = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, "step-", 5) != 0)
            continue;
        char **p = realloc(names, (size_t)(n + 1) * sizeof *p);
        if (!p || !(p[n] = strdup(de->d_name))) {
            names = p ? p : names;
            err("out of memory");
            rc = EXIT_BAD;
            break;
        }
        names = p;
        n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name);
    for (int i = 0; i < n; i++) {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/%s", a->arg, names[i]);
        if (!has_manifest(dir)) {
            if (!a->quiet)
                printf("%s: incomplete (no %s): ignored by readers\n", dir, DDP__CKPT_MANIFEST);
            continue;
        }
        complete++;
        if (verify_one(dir, a) != EXIT_OK)
            rc = EXIT_BAD;
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (complete == 0 && rc == EXIT_OK) {
        err("%s: no complete checkpoint", a->arg);
        rc = EXIT_BAD;
    }
    return rc;
}

static int cmd_verify(const args *a)
{
    return a->all ? verify_all(a) : verify_one(a->arg, a);
}

/* ------------------------------------------------------------------------------------------ */
/* export                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Reads exactly n bytes at off; 0 or -errno (-EIO when the file ends first). */
static int pread_full(int fd, void *buf, size_t n, off_t off)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = pread(fd, p, n, off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -EIO;
        p += k;
        n -= (size_t)k;
        off += k;
    }
    return 0;
}

/*
 * State array s of parameter p, consolidated into out[count]: element i of the arena (group g
 * from g.offset) is part r = (i - g.offset) / g.shard, element j = (i - g.offset) % g.shard of
 * it, stored in shard file r at element s * shard_total + g.shard_offset + j.
 */
static int gather(const ddp__ckpt_manifest *mf, const int *fds, int p, int s, float *out)
{
    const ddp__ckpt_param *pa = &mf->params[p];
    const ddp__ckpt_group *g = &mf->groups[pa->group];
    size_t i = pa->offset, end = pa->offset + pa->count;
    while (i < end) {
        size_t rel = i - g->offset, r = rel / g->shard, j = rel % g->shard;
        size_t n = g->shard - j < end - i ? g->shard - j : end - i;
        off_t off = (off_t)(((size_t)s * mf->shard_total + g->shard_offset + j) * sizeof(float));
        int rc = pread_full(fds[r], out + (i - pa->offset), n * sizeof(float), off);
        if (rc < 0) {
            err("%s/%s: cannot read: %s", mf->dir, mf->shards[r].file, strerror(-rc));
            return rc;
        }
        i += n;
    }
    return 0;
}

/*
 * The export's metadata into meta[cap] (NULL-ended): own[] (pairs, NULL-ended), then the string
 * members of the user state's "metadata" object (ddp-train's: the model and its inputs) whose
 * keys own[] does not have. The strings are borrowed from own[] and from *user, a jansson value
 * the caller releases. Returns the number of strings.
 */
static int export_meta(const char *const *own, const char *user_json, json_t **user,
                       const char **meta, int cap)
{
    int k = 0;
    for (; own[k] && k + 2 < cap; k += 2) {
        meta[k] = own[k];
        meta[k + 1] = own[k + 1];
    }
    *user = user_json ? json_loads(user_json, 0, NULL) : NULL;
    json_t *m = json_object_get(*user, "metadata");
    const char *key;
    json_t *v;
    json_object_foreach(m, key, v)
    {
        int clash = 0;
        for (int i = 0; own[i]; i += 2)
            clash |= !strcmp(own[i], key);
        if (json_is_string(v) && !clash && k + 2 < cap) {
            meta[k++] = key;
            meta[k++] = json_string_value(v);
        }
    }
    meta[k] = NULL;
    return k;
}

/* Applies --names and --rename (export: the checkpoint's names to the file's) to names[0..n),
 * pointing ts[] at the results. Prints the failure; returns 0 or EXIT_BAD. */
static int export_names(const args *a, char **names, st_tensor *ts, int n)
{
    char e[512];
    if ((a->names == NAMES_TORCH && names_to_torch(names, n, e, sizeof e) < 0) ||
        (a->rename && names_rename(names, n, a->rename, e, sizeof e) < 0)) {
        err("%s", e);
        return EXIT_BAD;
    }
    for (int i = 0; i < n; i++)
        ts[i].name = names[i];
    return 0;
}

static int cmd_export(const args *a)
{
    ddp__ckpt_manifest mf = {0};
    skipped sk = {0};
    int *fds = NULL, nt = 0;
    st_tensor *ts = NULL;
    char **names = NULL, tmp[PATH_MAX];
    json_t *user = NULL; /* the checkpoint's user state, whose metadata the file's borrows */
    tmp[0] = '\0';
    int rc = open_checkpoint(a->arg, &mf, &sk);
    if (rc)
        goto out;
    rc = EXIT_BAD;
    struct stat st;
    if (!a->force && stat(a->output, &st) == 0) {
        err("%s exists (--force replaces it)", a->output);
        goto out;
    }
    /* Every shard whole first: an export never carries a damaged value silently. */
    int bad = 0;
    for (int r = 0; r < mf.world; r++) {
        char e[1024];
        if (ddp__ckpt_verify_shard(&mf, r, e, sizeof e) < 0) {
            err("%s", e);
            bad = 1;
        }
    }
    if (bad)
        goto out;
    int nstate = a->optimizer ? mf.nstate : 1;
    size_t cap = (size_t)mf.nparams * (size_t)nstate;
    if (!(fds = malloc(sizeof(int) * (size_t)mf.world)) || !(ts = calloc(cap, sizeof *ts)) ||
        !(names = calloc(cap, sizeof *names))) {
        err("out of memory");
        goto out;
    }
    for (int r = 0; r < mf.world; r++)
        fds[r] = -1;
    for (int r = 0; r < mf.world; r++) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", mf.dir, mf.shards[r].file);
        if ((fds[r] = open(p, O_RDONLY | O_CLOEXEC)) < 0) {
            err("%s: cannot open: %s", p, strerror(errno));
            goto out;
        }
    }
    for (int p = 0; p < mf.nparams; p++) {
        const ddp__ckpt_param *pa = &mf.params[p];
        for (int s = 0; s < nstate; s++, nt++) {
            float *data = malloc(pa->count * sizeof(float) + 1);
            size_t len = strlen(pa->name) + strlen(mf.state[s]) + 2;
            if (!data || !(names[nt] = malloc(len))) {
                free(data);
                err("out of memory for %s", pa->name);
                goto out;
            }
            if (s == 0)
                snprintf(names[nt], len, "%s", pa->name);
            else
                snprintf(names[nt], len, "%s.%s", pa->name, mf.state[s]);
            ts[nt] = (st_tensor){.name = names[nt],
                                 .dtype = "F32",
                                 .ndim = pa->ndim,
                                 .data = data,
                                 .nbytes = pa->count * sizeof(float)};
            memcpy(ts[nt].shape, pa->shape, sizeof(int64_t) * (size_t)pa->ndim);
            if (gather(&mf, fds, p, s, data) < 0) {
                nt++;
                goto out;
            }
        }
    }
    if (export_names(a, names, ts, nt))
        goto out;
    char step[32], world[16], stage[16];
    snprintf(step, sizeof step, "%" PRId64, mf.step);
    snprintf(world, sizeof world, "%d", mf.world);
    snprintf(stage, sizeof stage, "%d", mf.stage);
    const char *own[] = {"format",     "ddp-ckpt export",
                         "source",     mf.dir,
                         "step",       step,
                         "world_size", world,
                         "zero_stage", stage,
                         "optimizer",  ddp_optimizer_name(mf.optimizer),
                         "names",      names_words[a->names == NAMES_TORCH],
                         NULL,         NULL, /* "rename" */
                         NULL};
    if (a->rename) {
        own[14] = "rename";
        own[15] = a->rename;
    }
    const char *meta[64];
    export_meta(own, mf.user_json, &user, meta, (int)(sizeof meta / sizeof meta[0]));
    /* Written beside the output and renamed: a failed export leaves no half file behind. */
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", a->output, (long)getpid());
    if (st_write(tmp, ts, nt, meta) < 0) {
        err("%s", st_last_error());
        unlink(tmp);
        goto out;
    }
    if (rename(tmp, a->output) < 0) {
        err("%s: cannot rename to %s: %s", tmp, a->output, strerror(errno));
        unlink(tmp);
        goto out;
    }
    printf("%s: %d tensors of %s, step %" PRId64 " (world %d, stage %d)\n", a->output, nt, mf.dir,
           mf.step, mf.world, mf.stage);
    rc = EXIT_OK;
out:
    for (int r = 0; fds && r < mf.world; r++)
        if (fds[r] >= 0)
            close(fds[r]);
    for (int i = 0; i < nt; i++) {
        free((void *)ts[i].data);
        free(names[i]);
    }
    free(fds);
    free(ts);
    free(names);
    json_decref(user);
    skipped_free(&sk);
    ddp__ckpt_manifest_free(&mf);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* import                                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* A world of one: its own store on loopback, a communicator, and a model. */
typedef struct solo {
    rdzv_server *server;
    rdzv_client *store;
    coll_comm *comm;
    ddp_model *m;
} solo;

static void solo_free(solo *s)
{
    ddp_model_free(s->m);
    coll_comm_close(s->comm);
    rdzv_client_close(s->store);
    rdzv_server_close(s->server);
}

static void import_log(void *arg, int level, const char *msg)
{
    (void)arg;
    if (level == COLL_LOG_WARN)
        err("%s", msg);
}

static int solo_start(solo *s)
{
    rdzv_server_options so;
    rdzv_server_options_init(&so);
    so.host = "127.0.0.1";
    so.port = 0;
    rdzv_client_options co;
    rdzv_client_options_init(&co);
    int rc = rdzv_server_start(&so, &s->server);
    if (rc == 0)
        rc = rdzv_client_connect("127.0.0.1", rdzv_server_port(s->server), &co, &s->store);
    if (rc < 0) {
        err("cannot start a store for the import: %s", rdzv_strerror(rc));
        return rc;
    }
    coll_options o;
    coll_options_init(&o);
    o.log = import_log;
    rc = coll_comm_init(s->store, "ddp-ckpt-import", 0, 1, COLL_BACKEND_CPU, -1, &o, &s->comm);
    if (rc < 0) {
        err("cannot create a communicator of one: %s: %s", coll_strerror(rc),
            coll_last_error(NULL));
        return rc;
    }
    ddp_options d;
    ddp_options_init(&d);
    d.zero_stage = 0;
    d.optimizer = DDP_SGD;
    d.momentum = 0; /* the state is the parameters alone: ["param"] */
    d.log = import_log;
    if ((rc = ddp_model_create(s->comm, &d, &s->m)) < 0)
        err("ddp_model_create: %s: %s", ddp_strerror(rc), ddp_last_error(NULL));
    return rc;
}

/* Commit's init: tensor `param`'s values, in registration order (order[] maps to the file). */
typedef struct import_init {
    const st_file *f;
    const int *order;
} import_init;

static int init_from_file(void *arg, int param, const char *name, void *data, size_t count)
{
    const import_init *in = arg;
    const st_tensor *t = &in->f->tensors[in->order[param]];
    (void)name;
    if (t->nbytes != count * sizeof(float))
        return -EINVAL;
    memcpy(data, t->data, t->nbytes);
    return 0;
}

/*
 * Checks the file's tensors for import (F32, at least one dimension, none zero, a UNIT.PARAM
 * name) and orders them by unit: units in the order their first tensor appears in the file,
 * each unit's tensors in file order. Fills order[ntensors]. Prints the problem; 0 or -EINVAL.
 */
static int import_plan(const char *path, const st_file *f, int *order)
{
    if (f->ntensors <= 0) {
        err("%s: no tensors", path);
        return -EINVAL;
    }
    for (int i = 0; i < f->ntensors; i++) {
        const st_tensor *t = &f->tensors[i];
        const char *dot = strrchr(t->name, '.');
        if (strcmp(t->dtype, "F32") != 0) {
            err("%s: tensor '%s' is %s; import takes F32 only (convert it to float32 first)", path,
                t->name, t->dtype);
            return -EINVAL;
        }
        if (t->ndim == 0) {
            err("%s: tensor '%s' is a scalar; a parameter needs at least one dimension", path,
                t->name);
            return -EINVAL;
        }
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] == 0) {
                err("%s: tensor '%s' has no elements (dimension %d is 0)", path, t->name, d);
                return -EINVAL;
            }
        if (!dot || dot == t->name || !dot[1]) {
            err("%s: tensor '%s': expected a name UNIT.PARAM (\"fc1.weight\"): the unit (layer) "
                "is what precedes the last '.'",
                path, t->name);
            return -EINVAL;
        }
    }
    int k = 0;
    bool *done = calloc((size_t)f->ntensors, sizeof(bool));
    if (!done) {
        err("out of memory");
        return -ENOMEM;
    }
    for (int i = 0; i < f->ntensors; i++) {
        if (done[i])
            continue;
        size_t ulen = (size_t)(strrchr(f->tensors[i].name, '.') - f->tensors[i].name);
        for (int j = i; j < f->ntensors; j++) {
            const char *n = f->tensors[j].name;
            if (!done[j] && (size_t)(strrchr(n, '.') - n) == ulen &&
                !strncmp(n, f->tensors[i].name, ulen)) {
                done[j] = true;
                order[k++] = j;
            }
        }
    }
    free(done);
    return 0;
}

/* Removes checkpoint directory `dir` and its files, the manifest first (the format's order). */
static int remove_checkpoint(const char *dir)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, DDP__CKPT_MANIFEST);
    if (unlink(p) < 0 && errno != ENOENT)
        return -errno;
    DIR *d = opendir(dir);
    if (!d)
        return -errno;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            unlinkat(dirfd(d), de->d_name, 0);
    closedir(d);
    return rmdir(dir) < 0 ? -errno : 0;
}

static int fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

/*
 * --step: the one change ddp-ckpt makes to a manifest the library wrote: "step" and
 * "attempted" become `step`, written as the format says (a temporary name, fsync, rename,
 * fsync of the directory).
 */
static int set_manifest_step(const char *dir, int64_t step)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    json_error_t je;
    json_t *root = NULL;
    int rc = -EPROTO;
    if (snprintf(path, sizeof path, "%s/%s", dir, DDP__CKPT_MANIFEST) >= (int)sizeof path ||
        snprintf(tmp, sizeof tmp, "%s/%s", dir, DDP__CKPT_MANIFEST_TMP) >= (int)sizeof tmp) {
        err("%s: path too long", dir);
        return -ENAMETOOLONG;
    }
    if (!(root = json_load_file(path, 0, &je))) {
        err("%s: %s", path, je.text);
        return rc;
    }
    json_object_set_new(root, "step", json_integer(step));
    json_object_set_new(root, "attempted", json_integer(step));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || json_dumpfd(root, fd, JSON_INDENT(1) | JSON_PRESERVE_ORDER) < 0 ||
        fsync(fd) < 0) {
        rc = -errno;
        err("%s: cannot write: %s", tmp, strerror(errno));
    } else if (rename(tmp, path) < 0 || fsync_path(dir) < 0) {
        rc = -errno;
        err("%s: cannot rename into place: %s", tmp, strerror(errno));
    } else {
        rc = 0;
    }
    if (fd >= 0)
        close(fd);
    json_decref(root);
    return rc;
}

/* Does the file (names as renamed) make ddp-train's MLP or GPT? Prints why not. Returns 0 or
 * -EINVAL. */
static int import_fits(const char *path, const st_file *f, int names)
{
    names_tensor *nt = calloc((size_t)f->ntensors + 1, sizeof *nt);
    if (!nt) {
        err("out of memory");
        return -ENOMEM;
    }
    for (int i = 0; i < f->ntensors; i++)
        nt[i] = (names_tensor){f->tensors[i].name, f->tensors[i].ndim, f->tensors[i].shape};
    char why[1024], e[256];
    int in, hidden, layers;
    int rc = names_fit_mlp(nt, f->ntensors, MLP_MAX_LINEAR, MLP_CLASSES, &in, &hidden, &layers, why,
                           sizeof why);
    int seq;
    for (int i = 0; rc == -EINVAL && i < f->ntensors; i++) /* its GPT's names: judged as such */
        if (!strncmp(nt[i].name, "emb.", 4)) {
            rc = names_fit_gpt(nt, f->ntensors, GPT_VOCAB, &layers, &hidden, &seq, why, sizeof why);
            break;
        }
    if (rc == -EINVAL) {
        err("%s: the tensors make no model ddp-train builds: %s", path, why);
        /* Would nn.Sequential's names, mapped, fit? Then say so. */
        char **alt = calloc((size_t)f->ntensors + 1, sizeof *alt);
        int k = 0, fits = 0;
        while (alt && k < f->ntensors && (alt[k] = strdup(f->tensors[k].name)))
            k++;
        if (names == NAMES_DDP_TRAIN && k == f->ntensors &&
            names_from_torch(alt, k, e, sizeof e) == 0) {
            for (int i = 0; i < k; i++)
                nt[i].name = alt[i];
            fits = names_fit_mlp(nt, k, MLP_MAX_LINEAR, MLP_CLASSES, &in, &hidden, &layers, e,
                                 sizeof e) == 0;
        }
        if (fits)
            err("%s: these are nn.Sequential's names: --names torch maps them to ddp-train's "
                "(%s becomes %s, ...)",
                path, f->tensors[0].name, alt[0]);
        err("refused: nothing written (--names any imports the names as they are, for a "
            "program other than ddp-train)");
        for (int i = 0; i < k; i++)
            free(alt[i]);
        free(alt);
    }
    free(nt);
    return rc;
}

/*
 * The file's tensors under the names a checkpoint takes: --rename, then --names torch, into
 * names[] (malloc'ed, in the file's order) and view, a shallow copy of f whose tensors carry
 * them (its arrays are view_ts[]; f keeps owning the data). Prints the failure; returns 0 or
 * -1. A name may be anything here: import_plan() and import_fits() judge the result.
 */
static int import_names(const args *a, const st_file *f, char **names, st_tensor *view_ts,
                        st_file *view)
{
    char e[512];
    for (int i = 0; i < f->ntensors; i++)
        if (!(names[i] = strdup(f->tensors[i].name))) {
            err("out of memory");
            return -1;
        }
    if ((a->rename && names_rename(names, f->ntensors, a->rename, e, sizeof e) < 0) ||
        (a->names == NAMES_TORCH && names_from_torch(names, f->ntensors, e, sizeof e) < 0)) {
        err("%s: %s", a->arg, e);
        return -1;
    }
    *view = *f;
    view->tensors = view_ts;
    for (int i = 0; i < f->ntensors; i++) {
        view_ts[i] = f->tensors[i];
        view_ts[i].name = names[i];
    }
    return 0;
}

static int cmd_import(const args *a)
{
    st_file file = {0}, f;
    solo s = {0};
    int *order = NULL, rc = EXIT_BAD;
    char **names = NULL;
    st_tensor *view_ts = NULL;
    char stage[PATH_MAX], made[PATH_MAX], final[PATH_MAX];
    stage[0] = '\0';
    if (st_read(a->arg, &file) < 0) {
        err("%s", st_last_error());
        goto out;
    }
    size_t n1 = (size_t)file.ntensors + 1;
    if (!(order = calloc(n1, sizeof(int))) || !(names = calloc(n1, sizeof *names)) ||
        !(view_ts = calloc(n1, sizeof *view_ts))) {
        err("out of memory");
        goto out;
    }
    /* Renamed first; then each tensor's dtype, shape and UNIT.PARAM form; then the model. */
    if (import_names(a, &file, names, view_ts, &f) < 0 || import_plan(a->arg, &f, order) < 0 ||
        (a->names != NAMES_ANY && import_fits(a->arg, &f, a->names) < 0))
        goto out;
    snprintf(final, sizeof final, "%s/" DDP__CKPT_DIR_FMT, a->output, (int64_t)a->step);
    struct stat st;
    if (!a->force && stat(final, &st) == 0) {
        err("%s exists (--force replaces it)", final);
        goto out;
    }
    if (solo_start(&s) < 0)
        goto out;
    int u = -1, r = 0;
    size_t ulen = 0;
    for (int i = 0; i < f.ntensors; i++) {
        const st_tensor *t = &f.tensors[order[i]];
        const char *dot = strrchr(t->name, '.');
        if (u < 0 || (size_t)(dot - t->name) != ulen ||
            strncmp(t->name, f.tensors[order[i - 1]].name, ulen) != 0) {
            char unit[PATH_MAX];
            ulen = (size_t)(dot - t->name);
            snprintf(unit, sizeof unit, "%.*s", (int)ulen, t->name);
            if ((u = r = ddp_unit_add(s.m, unit)) < 0)
                break;
        }
        if ((r = ddp_param_add(s.m, u, dot + 1, t->ndim, t->shape, COLL_F32)) < 0)
            break;
    }
    import_init in = {&f, order};
    if (r < 0 || (r = ddp_model_commit(s.m, init_from_file, &in)) < 0) {
        err("%s: %s: %s", a->arg, ddp_strerror(r), ddp_last_error(s.m));
        goto out;
    }
    /* Saved under a private root first, so that ROOT never shows a step-* directory that is
       not yet the one asked for. */
    if (mkdir(a->output, 0755) < 0 && errno != EEXIST) {
        err("%s: cannot create: %s", a->output, strerror(errno));
        goto out;
    }
    snprintf(stage, sizeof stage, "%s/.import-%ld", a->output, (long)getpid());
    if ((r = ddp_checkpoint_save(s.m, stage, NULL, NULL, 0, DDP_CKPT_SYNC)) < 0) {
        err("ddp_checkpoint_save: %s: %s", ddp_strerror(r), ddp_last_error(s.m));
        goto out;
    }
    snprintf(made, sizeof made, "%s/" DDP__CKPT_DIR_FMT, stage, (int64_t)0);
    if (a->step != 0 && set_manifest_step(made, a->step) < 0)
        goto out;
    if (stat(final, &st) == 0 && (r = remove_checkpoint(final)) < 0) {
        err("%s: cannot replace: %s", final, strerror(-r));
        goto out;
    }
    if (rename(made, final) < 0 || fsync_path(a->output) < 0) {
        err("%s: cannot rename to %s: %s", made, final, strerror(errno));
        goto out;
    }
    printf("%s: %d tensors in %d units from %s\n", final, f.ntensors, ddp_num_units(s.m), a->arg);
    rc = EXIT_OK;
out:
    if (stage[0]) {
        snprintf(made, sizeof made, "%s/" DDP__CKPT_DIR_FMT, stage, (int64_t)0);
        if (access(made, F_OK) == 0)
            remove_checkpoint(made);
        rmdir(stage);
    }
    solo_free(&s);
    free(order);
    for (int i = 0; names && i < file.ntensors; i++)
        free(names[i]);
    free(names);
    free(view_ts);
    st_file_free(&file);
    return rc;
}

int main(int argc, char **argv)
{
    args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc < 0 ? EXIT_OK : rc;
    switch (a.cmd) {
    case CMD_INSPECT:
        return cmd_inspect(&a);
    case CMD_VERIFY:
        return cmd_verify(&a);
    case CMD_EXPORT:
        return cmd_export(&a);
    default:
        return cmd_import(&a);
    }
}
