/*
 * ddprun's command line: torchrun's options (PyTorch 1.13 and current, in both the dash and the
 * underscore spelling), their PET_<NAME> environment defaults, Slurm defaults, and --help.
 *
 * One table, ddprun__options (options_table.c), lists every option with its spellings,
 * argument, default, help text and whether PET_<NAME> may supply it; the parser here and
 * ddprun_print_help() there both walk it, so the help (and through tests/test_help_man.sh the
 * man page) cannot drift from the parser. The table's type, the abbreviation-aware lookup, the
 * integer and seconds parsers and the help layout are the programs' shared ones
 * (rendezvous/common/cli.h).
 *
 * Parsing happens in three steps, as torchrun's argparse does: every option starts from its
 * default, replaced by PET_<NAME> when that is set, replaced by the command line (the last
 * occurrence wins); only then is each final value converted and checked, so an environment
 * value the command line overrides is never looked at. Options end at the first argument that
 * is not one (the training script) or at `--`; the rest belongs to the script. Long options may
 * be abbreviated to an unambiguous prefix, as argparse allows.
 *
 * Not done here: anything with side effects beyond reading the environment, /dev, the CPU
 * affinity mask and the first bytes of the training script (whether it is a Python script). Nothing
 * is printed except by --help, --version and --print-completion; errors go to the caller's buffer,
 * warnings to cfg->warnings for ddprun to print. *cfg is written only on success.
 */
#include "options.h"
#include "options_table.h"
#include "slurm.h"
#include "cli.h"
#include "version.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define C10D_DEFAULT_PORT 29400 /* torchrun's c10d rendezvous default */
#define STATIC_DEFAULT_PORT 29500

/*
 * Where GPUs are counted: the directory holding nvidia0, nvidia1, ... Internal to the launcher;
 * tests point it at a directory of their own.
 */
const char *ddprun__dev_dir = "/dev";

/* Where an option's value came from, in rising precedence. */
enum source { SRC_DEFAULT, SRC_SLURM, SRC_ENV, SRC_CLI };

struct raw {
    const char *value[O_COUNT]; /* borrowed: table, environment or argv */
    enum source src[O_COUNT];
    char label[O_COUNT][96]; /* how errors name the option: "--nnodes (from PET_NNODES)" */
    char allow[4096];        /* every --allow value, comma-joined (the option repeats) */
};

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        int k = snprintf(err, errlen, "ddprun: ");
        if (k >= 0 && (size_t)k < errlen)
            vsnprintf(err + k, errlen - (size_t)k, fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

/* Appends "warning: MESSAGE\n" to c->warnings (ddprun prints each line as its own message). Returns
 * 0 or -ENOMEM. */
static int warn(ddprun_config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int warn(ddprun_config *c, const char *fmt, ...)
{
    char line[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t have = c->warnings ? strlen(c->warnings) : 0;
    size_t add = sizeof "warning: \n" + strlen(line);
    char *w = realloc(c->warnings, have + add);
    if (!w)
        return -ENOMEM;
    snprintf(w + have, add, "warning: %s\n", line);
    c->warnings = w;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Value conversions. Each names the option through `label` on failure.                        */
/* ------------------------------------------------------------------------------------------ */

static bool to_long(const char *s, long *out)
{
    char *end;
    if (!s || !*s || isspace((unsigned char)*s))
        return false;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

static bool to_double(const char *s, double *out)
{
    char *end;
    if (!s || !*s || isspace((unsigned char)*s))
        return false;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

static int get_int(const struct raw *r, enum opt_id id, long lo, long hi, int *out, char *err,
                   size_t errlen)
{
    long v;
    if (cli_parse_long(r->label[id], r->value[id], lo, hi, &v) < 0)
        return fail(err, errlen, "%s", cli_last_error());
    *out = (int)v;
    return 0;
}

/*
 * A duration from `min` (excluded with CLI_OPEN_MIN) to CLI_SECONDS_MAX, the bound of every
 * duration ddprun takes: the agent turns them into milliseconds for its timers and the store
 * clients' timeouts, which must not overflow ("--shutdown-timeout 1e18" would be an immediate
 * SIGKILL).
 */
static int get_seconds(const char *label, const char *s, double min, int flags, double *out,
                       char *err, size_t errlen)
{
    if (cli_parse_seconds(label, s, min, CLI_SECONDS_MAX, flags, out) < 0)
        return fail(err, errlen, "%s", cli_last_error());
    return 0;
}

/* check_env's rule for flags: PET_<NAME> is an integer, non-zero meaning set. */
static int get_flag(const struct raw *r, enum opt_id id, bool *out, char *err, size_t errlen)
{
    long v;
    if (!r->value[id]) {
        *out = false;
        return 0;
    }
    if (!to_long(r->value[id], &v))
        return fail(err, errlen, "%s: expected 0 or 1, got '%s'", r->label[id], r->value[id]);
    *out = v != 0;
    return 0;
}

static int dup_str(const char *s, char **out)
{
    if (!s) {
        *out = NULL;
        return 0;
    }
    *out = strdup(s);
    return *out ? 0 : -ENOMEM;
}

/* Usable CPUs, as torch._utils.cpu_count(): the affinity mask, else the online count. */
static int count_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/*
 * GPUs CUDA would show this process, without linking CUDA: the /dev/nvidiaN nodes, narrowed by
 * CUDA_VISIBLE_DEVICES when it is set. Like CUDA, the visible list ends at its first entry that is
 * empty or not a valid index or GPU-/MIG- UUID.
 */
static int count_gpus(void)
{
    int ndev = 0;
    DIR *d = opendir(ddprun__dev_dir);
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *p = e->d_name;
        if (strncmp(p, "nvidia", 6) != 0 || !p[6])
            continue;
        for (p += 6; *p >= '0' && *p <= '9'; p++)
            ;
        ndev += *p == '\0';
    }
    closedir(d);

    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (!cvd || ndev == 0)
        return ndev;
    int visible = 0;
    for (const char *p = cvd;;) {
        size_t len = strcspn(p, ",");
        char tok[128];
        if (len == 0 || len >= sizeof tok)
            break;
        memcpy(tok, p, len);
        tok[len] = '\0';
        long idx;
        if (to_long(tok, &idx)) {
            if (idx < 0 || idx >= ndev)
                break;
        } else if (strncmp(tok, "GPU-", 4) != 0 && strncmp(tok, "MIG-", 4) != 0) {
            break;
        }
        visible++;
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    return visible < ndev ? visible : ndev;
}

static int get_nproc(const struct raw *r, int *out, char *err, size_t errlen)
{
    const char *s = r->value[O_NPROC_PER_NODE];
    long v;
    if (to_long(s, &v) && v > 0 && v <= DDPRUN_MAX_LOCAL) {
        *out = (int)v;
        return 0;
    }
    if (to_long(s, &v) && v > DDPRUN_MAX_LOCAL)
        return fail(err, errlen, "%s: at most %d workers per node, got '%s'",
                    r->label[O_NPROC_PER_NODE], DDPRUN_MAX_LOCAL, s);
    int n;
    if (strcmp(s, "cpu") == 0) {
        n = count_cpus();
    } else if (strcmp(s, "gpu") == 0) {
        n = count_gpus();
        if (n == 0)
            return fail(err, errlen, "%s: 'gpu' given, but no GPU is visible",
                        r->label[O_NPROC_PER_NODE]);
    } else if (strcmp(s, "auto") == 0) {
        n = count_gpus();
        if (n == 0)
            n = count_cpus();
    } else {
        return fail(err, errlen,
                    "%s: expected a positive integer, 'auto', 'cpu' or 'gpu', got '%s'",
                    r->label[O_NPROC_PER_NODE], s);
    }
    *out = n < DDPRUN_MAX_LOCAL ? n : DDPRUN_MAX_LOCAL;
    return 0;
}

static int get_nnodes(const struct raw *r, int *min, int *max, char *err, size_t errlen)
{
    const char *s = r->value[O_NNODES];
    const char *colon = strchr(s, ':');
    char lo[32];
    long a, b;
    bool ok;
    if (!colon) {
        ok = to_long(s, &a);
        b = a;
    } else {
        size_t len = (size_t)(colon - s);
        ok = len < sizeof lo;
        if (ok) {
            memcpy(lo, s, len);
            lo[len] = '\0';
            ok = to_long(lo, &a) && to_long(colon + 1, &b);
        }
    }
    if (!ok || a < 1 || a > b || b > INT32_MAX)
        return fail(err, errlen, "%s: expected N or MIN:MAX with 0 < MIN <= MAX, got '%s'",
                    r->label[O_NNODES], s);
    *min = (int)a;
    *max = (int)b;
    return 0;
}

/*
 * torchrun's Std.from_str: one value 0-3 for every local rank, or LOCAL_RANK:VALUE pairs with the
 * ranks not named getting 0. (torchrun accepts one-digit local ranks only; ddprun any below
 * DDPRUN_MAX_LOCAL.)
 */
static int get_std(const struct raw *r, enum opt_id id, int *out, char *err, size_t errlen)
{
    const char *s = r->value[id];
    long v;
    if (!strchr(s, ':')) {
        if (!to_long(s, &v) || v < 0 || v > 3)
            goto bad;
        for (int i = 0; i < DDPRUN_MAX_LOCAL; i++)
            out[i] = (int)v;
        return 0;
    }
    int tmp[DDPRUN_MAX_LOCAL] = {0};
    for (const char *p = s;;) {
        size_t len = strcspn(p, ",");
        char pair[32], *colon;
        long rank;
        if (len == 0 || len >= sizeof pair)
            goto bad;
        memcpy(pair, p, len);
        pair[len] = '\0';
        colon = strchr(pair, ':');
        if (!colon)
            goto bad;
        *colon = '\0';
        if (!to_long(pair, &rank) || rank < 0 || rank >= DDPRUN_MAX_LOCAL)
            goto bad;
        if (!to_long(colon + 1, &v) || v < 0 || v > 3)
            goto bad;
        tmp[rank] = (int)v;
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    memcpy(out, tmp, sizeof tmp);
    return 0;
bad:
    return fail(err, errlen,
                "%s: expected 0, 1, 2 or 3, or LOCAL_RANK:VALUE pairs like 0:1,1:2, got '%s'",
                r->label[id], s);
}

/*
 * --local-ranks-filter, after --nproc-per-node. torchrun takes any set of integers and ignores the
 * ranks its node does not run, so "--local-ranks-filter 5" on a 2-worker node hides every worker
 * and says nothing. Here a filter that names no rank the node runs is a usage error (the console
 * would show no worker, which nobody asks for), and one that names some it does not run gets a
 * warning naming those, since a shared command line on nodes of different sizes is legitimate.
 */
static int get_ranks_filter(const struct raw *r, ddprun_config *c, char *err, size_t errlen)
{
    const char *s = r->value[O_LOCAL_RANKS_FILTER];
    for (int i = 0; i < DDPRUN_MAX_LOCAL; i++)
        c->show_rank[i] = true;
    c->local_ranks_filter_set = false;
    if (!s || !*s)
        return 0;
    bool show[DDPRUN_MAX_LOCAL] = {false};
    for (const char *p = s;;) {
        size_t len = strcspn(p, ",");
        char tok[32];
        long v;
        if (len == 0 || len >= sizeof tok)
            goto bad;
        memcpy(tok, p, len);
        tok[len] = '\0';
        if (!to_long(tok, &v) || v < 0 || v >= DDPRUN_MAX_LOCAL)
            goto bad;
        show[v] = true;
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    char absent[256] = "";
    size_t used = 0;
    int present = 0, nabsent = 0;
    for (int i = 0; i < DDPRUN_MAX_LOCAL; i++) {
        if (show[i] && i < c->nproc_per_node)
            present++;
        else if (show[i] && ++nabsent && used < sizeof absent)
            used +=
                (size_t)snprintf(absent + used, sizeof absent - used, "%s%d", used ? "," : "", i);
    }
    if (!present)
        return fail(err, errlen,
                    "%s: no local rank of '%s' runs on this node (%s %d runs local ranks 0 to %d), "
                    "so no worker's output would reach the console",
                    r->label[O_LOCAL_RANKS_FILTER], s, r->label[O_NPROC_PER_NODE],
                    c->nproc_per_node, c->nproc_per_node - 1);
    if (nabsent && warn(c, "%s: local rank%s %s do%s not run on this node (%s %d runs 0 to %d)",
                        r->label[O_LOCAL_RANKS_FILTER], nabsent > 1 ? "s" : "", absent,
                        nabsent > 1 ? "" : "es", r->label[O_NPROC_PER_NODE], c->nproc_per_node,
                        c->nproc_per_node - 1) < 0)
        return -ENOMEM;
    memcpy(c->show_rank, show, sizeof show);
    c->local_ranks_filter_set = true;
    return 0;
bad:
    return fail(err, errlen,
                "%s: expected a comma-separated list of local ranks like 0,1,2, got "
                "'%s'",
                r->label[O_LOCAL_RANKS_FILTER], s);
}

/*
 * torchrun's parse_rendezvous_endpoint(): HOST[:PORT], where a bracketed HOST is an IPv6 address;
 * port -1 when absent. The host keeps torchrun's character set.
 */
static int split_endpoint(const char *label, const char *ep, char **host, int *port, char *err,
                          size_t errlen)
{
    size_t len = strlen(ep);
    const char *colon = NULL;
    long p = -1;

    while (len && isspace((unsigned char)ep[len - 1]))
        len--;
    while (len && isspace((unsigned char)*ep))
        ep++, len--;
    if (!(len >= 2 && ep[0] == '[' && ep[len - 1] == ']')) {
        colon = memrchr(ep, ':', len);
    }
    size_t hlen = colon ? (size_t)(colon - ep) : len;
    if (colon) {
        const char *ps = colon + 1;
        size_t plen = len - hlen - 1;
        char buf[8];
        if (plen < 1 || plen > 5 || strspn(ps, "0123456789") < plen)
            goto badport;
        memcpy(buf, ps, plen);
        buf[plen] = '\0';
        p = strtol(buf, NULL, 10);
        if (p > 65535)
            goto badport;
    }
    const char *h = ep;
    if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']')
        h++, hlen -= 2;
    if (hlen == 0)
        return fail(err, errlen, "%s: expected HOST[:PORT], got '%s'", label, ep);
    for (size_t i = 0; i < hlen; i++)
        if (!isalnum((unsigned char)h[i]) && !strchr("_.:-", h[i]))
            return fail(err, errlen,
                        "%s: the host of '%s' must be a host name, an IPv4 or an IPv6 "
                        "address",
                        label, ep);
    *host = strndup(h, hlen);
    if (!*host)
        return -ENOMEM;
    *port = (int)p;
    return 0;
badport:
    return fail(err, errlen, "%s: the port of '%s' must be an integer from 0 to 65535", label, ep);
}

static int conf_bool(const char *label, const char *key, const char *v, bool *out, char *err,
                     size_t errlen)
{
    static const char *yes[] = {"1", "true", "t", "yes", "y"},
                      *no[] = {"0", "false", "f", "no", "n"};
    for (size_t i = 0; i < 5; i++) {
        if (strcasecmp(v, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(v, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return fail(err, errlen, "%s: %s: expected a boolean (true/false, 1/0, yes/no), got '%s'",
                label, key, v);
}

void ddprun_liveness(const ddprun_config *cfg, double *beat_s, double *dead_after_s)
{
    int attempts = cfg->keep_alive_max_attempt > 0 ? cfg->keep_alive_max_attempt : 3;
    double interval = cfg->keep_alive_interval_s > 0 ? cfg->keep_alive_interval_s : 5;
    double dead = cfg->heartbeat_timeout_s > 0 ? cfg->heartbeat_timeout_s : interval * attempts;
    *dead_after_s = dead;
    *beat_s = interval * attempts > dead ? dead / attempts : interval;
}

int ddprun_monitor_slice_ms(double beat_s, double dead_after_s, int nnodes)
{
    double ms = nnodes / 4 > 250 ? nnodes / 4 : 250;
    if (ms > dead_after_s * 250)
        ms = dead_after_s * 250;
    if (ms > beat_s * 1000)
        ms = beat_s * 1000;
    return ms < 10 ? 10 : (int)ms;
}

/*
 * Node liveness has floors: a node beats at most every BEAT_MIN_S, and counts as dead after no
 * less than LIVENESS_MIN_S without a beat (heartbeat_timeout, or keep_alive_interval x
 * keep_alive_max_attempt). Shorter, the monitor's own scheduling (it looks every 250 ms at
 * most) and a loaded host would declare live nodes dead at once.
 */
#define BEAT_MIN_S 0.1
#define LIVENESS_MIN_S 1.0

/*
 * The --rdzv-conf keys that are durations: where each is stored (SIZE_MAX: checked, then
 * ignored) and its lower bound (excluded with CLI_OPEN_MIN); the upper one is CLI_SECONDS_MAX.
 */
static const struct conf_seconds {
    const char *key;
    size_t offset;
    double min;
    int flags;
} conf_seconds[] = {
    {"join_timeout", offsetof(ddprun_config, join_timeout_s), 0, CLI_OPEN_MIN},
    {"last_call_timeout", offsetof(ddprun_config, last_call_timeout_s), 0, CLI_OPEN_MIN},
    {"close_timeout", offsetof(ddprun_config, close_timeout_s), 0, CLI_OPEN_MIN},
    {"read_timeout", offsetof(ddprun_config, read_timeout_s), 0, CLI_OPEN_MIN},
    {"timeout", offsetof(ddprun_config, timeout_s), 0, CLI_OPEN_MIN},
    {"heartbeat_timeout", offsetof(ddprun_config, heartbeat_timeout_s), LIVENESS_MIN_S, 0},
    {"keep_alive_interval", offsetof(ddprun_config, keep_alive_interval_s), BEAT_MIN_S, 0},
    {"cas_backoff_max_seconds", SIZE_MAX, 0, 0},
};

/* torchrun's _parse_rendezvous_config(), then the keys its rendezvous backends read. */
static int get_rdzv_conf(const struct raw *r, ddprun_config *c, char *err, size_t errlen)
{
    const char *label = r->label[O_RDZV_CONF];
    const char *s = r->value[O_RDZV_CONF];
    char *copy = strdup(s);
    int rc = 0;
    if (!copy)
        return -ENOMEM;
    char *p = copy;
    while (isspace((unsigned char)*p))
        p++;
    if (!*p)
        goto out;
    for (char *kv = p, *next; kv; kv = next) {
        next = strchr(kv, ',');
        if (next)
            *next++ = '\0';
        char *eq = strchr(kv, '=');
        char *key = kv, *val = eq ? eq + 1 : NULL;
        if (eq)
            *eq = '\0';
        while (isspace((unsigned char)*key))
            key++;
        for (char *e = key + strlen(key); e > key && isspace((unsigned char)e[-1]);)
            *--e = '\0';
        if (val) {
            while (isspace((unsigned char)*val))
                val++;
            for (char *e = val + strlen(val); e > val && isspace((unsigned char)e[-1]);)
                *--e = '\0';
        }
        if (!*key) {
            rc = fail(err, errlen, "%s: expected KEY=VALUE,..., got '%s'", label, s);
            goto out;
        }
        if (!val || !*val) {
            rc = fail(err, errlen, "%s: %s: a value is required", label, key);
            goto out;
        }
        char what[160];
        snprintf(what, sizeof what, "%s: %s", label, key);
        const struct conf_seconds *cs = NULL;
        for (size_t i = 0; i < sizeof conf_seconds / sizeof conf_seconds[0]; i++)
            if (strcmp(key, conf_seconds[i].key) == 0)
                cs = &conf_seconds[i];
        double d;
        long n;
        if (cs) {
            rc = get_seconds(what, val, cs->min, cs->flags, &d, err, errlen);
            if (rc == 0 && cs->offset != SIZE_MAX)
                *(double *)((char *)c + cs->offset) = d;
        } else if (strcmp(key, "keep_alive_max_attempt") == 0) {
            if (!to_long(val, &n) || n < 1 || n > INT32_MAX)
                rc = fail(err, errlen, "%s: expected a positive integer, got '%s'", what, val);
            else
                c->keep_alive_max_attempt = (int)n;
        } else if (strcmp(key, "is_host") == 0) {
            rc = conf_bool(label, key, val, &c->is_host, err, errlen);
            c->is_host_given = 1;
        } else if (!strcmp(key, "protocol")) {
            if (strcasecmp(val, "http") && strcasecmp(val, "https"))
                rc = fail(err, errlen, "%s: expected 'http' or 'https', got '%s'", what, val);
            c->etcd_https = strcasecmp(val, "https") == 0;
        } else if (!strcmp(key, "cacert") || !strcmp(key, "ca_cert") || !strcmp(key, "cert") ||
                   !strcmp(key, "ssl_cert") || !strcmp(key, "key") ||
                   !strcmp(key, "ssl_cert_key")) {
            /* torchrun's etcd backend spells them cacert, cert, key; etcd-v2's ca_cert,
             * ssl_cert, ssl_cert_key. */
            char **dst = !strcmp(key, "cacert") || !strcmp(key, "ca_cert")     ? &c->etcd_cacert
                         : !strcmp(key, "key") || !strcmp(key, "ssl_cert_key") ? &c->etcd_key
                                                                               : &c->etcd_cert;
            if (access(val, R_OK) != 0)
                rc = fail(err, errlen, "%s: cannot read '%s': %s", what, val, strerror(errno));
            else {
                free(*dst);
                rc = dup_str(val, dst);
            }
        } else if (strcmp(key, "store_type") == 0) {
            if (strcasecmp(val, "tcp") != 0)
                rc = fail(err, errlen, "%s: only 'tcp' is supported, got '%s'", what, val);
        } else {
            rc = fail(err, errlen,
                      "%s: unknown key '%s' (known: join_timeout, last_call_timeout, "
                      "close_timeout, read_timeout, timeout, heartbeat_timeout, is_host, "
                      "keep_alive_interval, keep_alive_max_attempt, cas_backoff_max_seconds, "
                      "store_type; etcd: protocol, cacert, cert, key)",
                      label, key);
        }
        if (rc < 0)
            goto out;
        if (!strcmp(key, "timeout"))
            c->timeout_given = true;
    }
    if (c->etcd_key && !c->etcd_cert)
        rc = fail(err, errlen, "%s: key given without cert", label);
    if (rc == 0 && c->heartbeat_timeout_s == 0 &&
        c->keep_alive_interval_s * c->keep_alive_max_attempt < LIVENESS_MIN_S)
        rc = fail(err, errlen,
                  "%s: keep_alive_interval x keep_alive_max_attempt is %g s: a node would count "
                  "as dead after less than %g s without a heartbeat (raise either, or give "
                  "heartbeat_timeout of at least %g s)",
                  label, c->keep_alive_interval_s * c->keep_alive_max_attempt, LIVENESS_MIN_S,
                  LIVENESS_MIN_S);
out:
    free(copy);
    return rc;
}

static int check_choice(const struct raw *r, enum opt_id id, const char *const *choices, char *err,
                        size_t errlen)
{
    const char *v = r->value[id];
    if (!v)
        return 0;
    for (const char *const *c = choices; *c; c++)
        if (strcmp(v, *c) == 0)
            return 0;
    char list[160] = "";
    for (const char *const *c = choices; *c; c++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'",
                 c == choices ? "" : (c[1] ? ", " : " or "), *c);
    return fail(err, errlen, "%s: expected %s, got '%s'", r->label[id], list, v);
}

static int check_signals(const struct raw *r, char *err, size_t errlen)
{
    static const char *known[] = {
        "SIGHUP",  "SIGINT",    "SIGQUIT", "SIGILL",   "SIGTRAP", "SIGABRT", "SIGBUS",
        "SIGFPE",  "SIGUSR1",   "SIGSEGV", "SIGUSR2",  "SIGPIPE", "SIGALRM", "SIGTERM",
        "SIGCHLD", "SIGCONT",   "SIGTSTP", "SIGTTIN",  "SIGTTOU", "SIGURG",  "SIGXCPU",
        "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGWINCH", "SIGIO",   "SIGPWR",  "SIGSYS"};
    const char *s = r->value[O_SIGNALS_TO_HANDLE];
    for (const char *p = s;;) {
        size_t len = strcspn(p, ",");
        while (len && isspace((unsigned char)*p))
            p++, len--;
        size_t tl = len;
        while (tl && isspace((unsigned char)p[tl - 1]))
            tl--;
        bool ok = false;
        for (size_t i = 0; i < sizeof known / sizeof known[0] && !ok; i++)
            ok = strlen(known[i]) == tl && strncmp(known[i], p, tl) == 0;
        if (!ok)
            return fail(err, errlen, "%s: unknown signal '%.*s' in '%s'",
                        r->label[O_SIGNALS_TO_HANDLE], (int)tl, p, s);
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    return 0;
}

/* A random version 4 UUID, as torchrun's str(uuid.uuid4()) for --standalone. */
static int make_uuid(char **out)
{
    unsigned char b[16];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t k = getrandom(b + got, sizeof b - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    if (got < sizeof b) {
        /* No getrandom(): time and pid are unique enough for a job id. The wall clock here is
         * entropy, not a deadline (those use monoclock.h): it differs across reboots. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x =
            (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
        for (size_t i = 0; i < sizeof b; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            b[i] = (unsigned char)x;
        }
    }
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    char s[37];
    size_t k = 0;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            s[k++] = '-';
        k += (size_t)snprintf(s + k, sizeof s - k, "%02x", b[i]);
    }
    return dup_str(s, out);
}

/* ------------------------------------------------------------------------------------------ */
/* The parser.                                                                                */
/* ------------------------------------------------------------------------------------------ */

/*
 * Finds the option `name` (without "=VALUE") names: an exact spelling, else the one option all of
 * whose spellings that start with `name` belong to (argparse's abbreviations).
 */
static const cli_option *lookup(const char *name, size_t len, char *err, size_t errlen, int *rc)
{
    int k = cli_find(ddprun__options, ddprun__noptions, name, len, CLI_FIND_PREFIX);
    if (k < 0) {
        *rc = fail(err, errlen, "%s", cli_last_error());
        return NULL;
    }
    *rc = 0;
    return &ddprun__options[k];
}

/* An argument that argparse would take for an option rather than a value. */
static bool looks_like_option(const char *s)
{
    double d;
    return s[0] == '-' && s[1] != '\0' && !to_double(s, &d);
}

/* Step 1 and 2: defaults, then PET_<NAME>. */
static void read_defaults(struct raw *r)
{
    for (size_t i = 0; i < ddprun__noptions; i++) {
        const cli_option *o = &ddprun__options[i];
        r->value[o->id] = o->def;
        r->src[o->id] = SRC_DEFAULT;
        snprintf(r->label[o->id], sizeof r->label[o->id], "%s", cli_long_name(o));
        if (!o->tag)
            continue;
        char pet[64];
        ddprun__pet_name(o, pet, sizeof pet);
        const char *v = getenv(pet);
        if (!v)
            continue;
        r->value[o->id] = v;
        r->src[o->id] = SRC_ENV;
        snprintf(r->label[o->id], sizeof r->label[o->id], "%s (from %s)", cli_long_name(o), pet);
    }
    /* The pieces torchrun fills in after argparse. */
    if (r->src[O_MASTER_PORT] == SRC_DEFAULT)
        r->value[O_MASTER_PORT] = NULL;
    if (r->src[O_SHUTDOWN_TIMEOUT] == SRC_DEFAULT) {
        const char *v = getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
        if (v) {
            r->value[O_SHUTDOWN_TIMEOUT] = v;
            snprintf(r->label[O_SHUTDOWN_TIMEOUT], sizeof r->label[0],
                     "--shutdown-timeout (from TORCH_ELASTIC_SHUTDOWN_TIMEOUT)");
        }
    }
    if (r->src[O_LOG_LINE_PREFIX_TEMPLATE] == SRC_DEFAULT) {
        const char *v = getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
        r->value[O_LOG_LINE_PREFIX_TEMPLATE] = v;
    }
}

/*
 * Step 3: the command line. Returns the index of the training script, 0 after --help and the
 * like, or a negative errno.
 */
static int read_argv(int argc, char **argv, struct raw *r, char *err, size_t errlen)
{
    int i = 1;
    while (i < argc) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0)
            return i + 1;
        if (a[0] != '-' || a[1] == '\0')
            return i;
        size_t nlen = strcspn(a, "=");
        const char *inline_val = a[nlen] == '=' ? a + nlen + 1 : NULL;
        int rc;
        const cli_option *o = lookup(a, nlen, err, errlen, &rc);
        if (!o && a[1] != '-' && nlen > 2) {
            /* -r3: a short option with its value attached. */
            o = lookup(a, 2, err, errlen, &rc);
            if (o && o->metavar) {
                nlen = 2;
                inline_val = a + 2;
            } else {
                o = NULL;
                rc = fail(err, errlen, "unknown option '%s'", a);
            }
        }
        if (!o)
            return rc;
        char typed[64];
        snprintf(typed, sizeof typed, "%.*s", (int)nlen, a);
        i++;
        const char *val;
        if (!o->metavar) {
            if (inline_val)
                return fail(err, errlen, "%s: takes no value, got '%s'", typed, inline_val);
            val = "1";
        } else if (inline_val) {
            val = inline_val;
        } else {
            if (i >= argc || looks_like_option(argv[i]))
                return fail(err, errlen, "%s: expected a value (%s)", typed, o->metavar);
            val = argv[i++];
        }
        switch (o->id) {
        case O_HELP:
            ddprun_print_help();
            return 0;
        case O_VERSION:
            printf("ddprun %s\n", DDPRUN_VERSION);
            return 0;
        case O_PRINT_COMPLETION: {
            static const char *shells[] = {"bash", "zsh", "tcsh", NULL};
            r->value[o->id] = val;
            snprintf(r->label[o->id], sizeof r->label[0], "%s", typed);
            rc = check_choice(r, o->id, shells, err, errlen);
            if (rc < 0)
                return rc;
            ddprun__print_completion(val);
            return 0;
        }
        default:
            break;
        }
        if (o->id == O_ALLOW) {
            size_t have = strlen(r->allow);
            if (have + strlen(val) + 2 > sizeof r->allow)
                return fail(err, errlen, "%s: too many networks", typed);
            snprintf(r->allow + have, sizeof r->allow - have, "%s%s", have ? "," : "", val);
            val = r->allow;
        }
        r->value[o->id] = val;
        r->src[o->id] = SRC_CLI;
        snprintf(r->label[o->id], sizeof r->label[0], "%s", typed);
    }
    return fail(err, errlen,
                "missing the training script (usage: ddprun [OPTIONS] "
                "TRAINING_SCRIPT [SCRIPT_ARGS ...])");
}

/*
 * Slurm defaults, for a step only: srun sets SLURM_STEP_ID, and the step's own node count, node
 * index and node list (SLURM_STEP_NUM_NODES, SLURM_NODEID, SLURM_STEP_NODELIST), which differ from
 * the job's (SLURM_JOB_NUM_NODES, SLURM_JOB_NODELIST; in a step SLURM_NODELIST is the job's too)
 * when the step runs on part of the allocation. A batch script or an salloc shell has SLURM_JOB_ID
 * but no SLURM_STEP_ID and runs on one node: ddprun is then a one-node job, with a warning when
 * the allocation has more nodes. A step that runs more tasks than nodes makes each task a node of
 * the job (SLURM_STEP_NUM_TASKS nodes, SLURM_PROCID its rank), with a warning, instead of giving
 * two agents one node rank. Each option is taken only where neither the command line nor
 * PET_<NAME> gave one. Returns 1 when anything was taken from Slurm, 0, or a negative errno.
 */
static int read_slurm(struct raw *r, ddprun_config *c, char **first_host, char *err, size_t errlen)
{
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
    const char *nn = getenv("SLURM_STEP_NUM_NODES"), *id = getenv("SLURM_NODEID");
    const char *list = getenv("SLURM_STEP_NODELIST");
    const char *tasks = getenv("SLURM_STEP_NUM_TASKS"), *procid = getenv("SLURM_PROCID");
    bool unset = r->src[O_NNODES] == SRC_DEFAULT && r->src[O_NODE_RANK] == SRC_DEFAULT;
    int used = 0;
    long nodes, ntasks;
    if (!job)
        return 0;
    if (!step) {
        const char *jn = getenv("SLURM_JOB_NUM_NODES");
        if (unset && jn && to_long(jn, &nodes) && nodes > 1)
            return warn(c,
                        "Slurm job %s has %ld nodes, but this is not a step of it (no "
                        "SLURM_STEP_ID, as in a batch script or an salloc shell): ddprun runs "
                        "the job on this node alone; start it with srun --ntasks-per-node=1 to "
                        "run on every node",
                        job, nodes);
        return 0;
    }
    if (!nn || !id || !list)
        return 0;
    bool per_task =
        tasks && procid && to_long(nn, &nodes) && to_long(tasks, &ntasks) && ntasks > nodes;
    if (r->src[O_NNODES] == SRC_DEFAULT) {
        r->value[O_NNODES] = per_task ? tasks : nn;
        r->src[O_NNODES] = SRC_SLURM;
        snprintf(r->label[O_NNODES], sizeof r->label[0], "--nnodes (from %s)",
                 per_task ? "SLURM_STEP_NUM_TASKS" : "SLURM_STEP_NUM_NODES");
        used = 1;
    }
    if (r->src[O_NODE_RANK] == SRC_DEFAULT) {
        r->value[O_NODE_RANK] = per_task ? procid : id;
        r->src[O_NODE_RANK] = SRC_SLURM;
        snprintf(r->label[O_NODE_RANK], sizeof r->label[0], "--node-rank (from %s)",
                 per_task ? "SLURM_PROCID" : "SLURM_NODEID");
        used = 1;
    }
    if (per_task && unset && strcmp(procid, "0") == 0) {
        const char *tpn = getenv("SLURM_STEP_TASKS_PER_NODE");
        int rc = warn(c,
                      "the Slurm step runs %ld tasks on %ld nodes (SLURM_STEP_TASKS_PER_NODE=%s): "
                      "each task is a ddprun of its own, a node of the job, so the workers of "
                      "tasks that share a host all count LOCAL_RANK from 0; ddprun, like "
                      "torchrun, expects one task per node (srun --ntasks-per-node=1)",
                      ntasks, nodes, tpn ? tpn : "?");
        if (rc < 0)
            return rc;
    }
    if (r->src[O_MASTER_ADDR] == SRC_DEFAULT) {
        char **hosts;
        size_t n;
        int rc = ddprun_slurm_expand(list, &hosts, &n);
        if (rc == -ENOMEM)
            return rc;
        if (rc < 0)
            return fail(err, errlen,
                        "--master-addr (from SLURM_STEP_NODELIST): malformed host list "
                        "'%s'",
                        list);
        *first_host = hosts[0];
        hosts[0] = NULL;
        ddprun_slurm_free(hosts, n);
        r->src[O_MASTER_ADDR] = SRC_SLURM;
        used = 1;
    }
    return used;
}

void ddprun_config_free(ddprun_config *c)
{
    if (!c)
        return;
    free(c->master_addr);
    free(c->local_addr);
    free(c->etcd_cacert);
    free(c->etcd_cert);
    free(c->etcd_key);
    free(c->rdzv_endpoint);
    free(c->rdzv_host);
    free(c->rdzv_id);
    free(c->role);
    free(c->start_method);
    free(c->log_dir);
    free(c->log_line_prefix_template);
    free(c->logs_specs);
    free(c->numa_binding);
    free(c->token_file);
    for (int i = 0; i < c->nallow; i++)
        free(c->allow[i]);
    free(c->allow);
    free(c->signals_to_handle);
    free(c->event_log_handler);
    free(c->duplicate_stdout_filters);
    free(c->duplicate_stderr_filters);
    free(c->program);
    free(c->warnings);
    memset(c, 0, sizeof *c);
}

/* True for "ADDR" or "ADDR/BITS" with an IPv4 or IPv6 ADDR and BITS within its family's. */
static bool is_cidr(const char *s)
{
    char addr[INET6_ADDRSTRLEN + 1];
    unsigned char bin[16];
    const char *slash = strchr(s, '/');
    size_t n = slash ? (size_t)(slash - s) : strlen(s);
    if (n == 0 || n >= sizeof addr)
        return false;
    memcpy(addr, s, n);
    addr[n] = '\0';
    long max = inet_pton(AF_INET, addr, bin) == 1    ? 32
               : inet_pton(AF_INET6, addr, bin) == 1 ? 128
                                                     : -1;
    long bits;
    return max > 0 && (!slash || (to_long(slash + 1, &bits) && bits >= 0 && bits <= max));
}

/* --allow: the comma-separated networks, each checked, into c->allow. */
static int get_allow(const struct raw *r, ddprun_config *c, char *err, size_t errlen)
{
    const char *v = r->value[O_ALLOW];
    c->allow = NULL;
    c->nallow = 0;
    if (!v || !*v)
        return 0;
    size_t n = 1;
    for (const char *p = v; *p; p++)
        n += *p == ',';
    c->allow = calloc(n, sizeof *c->allow);
    if (!c->allow)
        return -ENOMEM;
    for (const char *p = v; *p;) {
        size_t len = strcspn(p, ",");
        char *one = strndup(p, len);
        if (!one)
            return -ENOMEM;
        c->allow[c->nallow++] = one;
        if (!is_cidr(one))
            return fail(err, errlen, "%s: expected an address or a network ADDR/BITS, got '%s'",
                        r->label[O_ALLOW], one);
        p += len + (p[len] == ',');
    }
    return 0;
}

/* --rdzv-backend's values, by ddprun_backend: the names of backend.c's rows. */
static const char *backends[] = {[DDPRUN_BACKEND_STATIC] = "static",
                                 [DDPRUN_BACKEND_C10D] = "c10d",
                                 [DDPRUN_BACKEND_ETCD] = "etcd",
                                 NULL};
/* What --rdzv-backend accepts: the names, and torchrun's second etcd backend as an alias. */
static const char *backend_choices[] = {"static", "c10d", "etcd", "etcd-v2", NULL};

const char *ddprun_backend_name(ddprun_backend backend)
{
    size_t n = sizeof(backends) / sizeof(backends[0]) - 1;
    return (unsigned)backend < n ? backends[backend] : NULL;
}

/* Step 4: converts and checks the final values into c, then applies torchrun's run() rules. */
static int resolve(struct raw *r, char *slurm_host, ddprun_config *c, char *err, size_t errlen)
{
    static const char *methods[] = {"spawn", "fork", "forkserver", NULL};
    static const char *numa[] = {"node", "socket", "exclusive", "core-complex", NULL};
    int rc;

#define TRY(x)                                                                                     \
    do {                                                                                           \
        if ((rc = (x)) < 0)                                                                        \
            return rc;                                                                             \
    } while (0)

    TRY(get_nnodes(r, &c->nnodes_min, &c->nnodes_max, err, errlen));
    TRY(get_nproc(r, &c->nproc_per_node, err, errlen));
    TRY(get_int(r, O_NODE_RANK, 0, INT32_MAX, &c->node_rank, err, errlen));
    TRY(check_choice(r, O_RDZV_BACKEND, backend_choices, err, errlen));
    /* The one place the backend's name is compared: from here on it is an enum. */
    ddprun_backend backend = DDPRUN_BACKEND_STATIC;
    for (int i = 0; backends[i]; i++)
        if (strcmp(r->value[O_RDZV_BACKEND], backends[i]) == 0)
            backend = (ddprun_backend)i;
    if (strcmp(r->value[O_RDZV_BACKEND], "etcd-v2") == 0)
        backend = DDPRUN_BACKEND_ETCD;
    TRY(get_flag(r, O_STANDALONE, &c->standalone, err, errlen));
    TRY(get_int(r, O_MAX_RESTARTS, 0, INT32_MAX, &c->max_restarts, err, errlen));
    TRY(get_seconds(r->label[O_MONITOR_INTERVAL], r->value[O_MONITOR_INTERVAL], 0, 0,
                    &c->monitor_interval_s, err, errlen));
    TRY(check_choice(r, O_START_METHOD, methods, err, errlen));
    TRY(get_flag(r, O_MODULE, &c->module, err, errlen));
    TRY(get_flag(r, O_NO_PYTHON, &c->no_python, err, errlen));
    TRY(get_flag(r, O_RUN_PATH, &c->run_path, err, errlen));
    TRY(get_std(r, O_REDIRECTS, c->redirects, err, errlen));
    TRY(get_std(r, O_TEE, c->tee, err, errlen));
    TRY(get_ranks_filter(r, c, err, errlen));
    TRY(check_choice(r, O_NUMA_BINDING, numa, err, errlen));
    TRY(check_signals(r, err, errlen));
    TRY(get_seconds(r->label[O_SHUTDOWN_TIMEOUT], r->value[O_SHUTDOWN_TIMEOUT], 0, 0,
                    &c->shutdown_timeout_s, err, errlen));
    TRY(get_flag(r, O_VIRTUAL_LOCAL_RANK, &c->virtual_local_rank, err, errlen));
    c->prefix_output = r->value[O_NO_PREFIX] == NULL;
    c->pid_namespace = r->value[O_NO_PID_NAMESPACE] == NULL;
    TRY(get_seconds(r->label[O_HUNG_TIMEOUT], r->value[O_HUNG_TIMEOUT], 0, 0, &c->hung_timeout_s,
                    err, errlen));
    static const char *on_off[] = {"on", "off", NULL};
    TRY(check_choice(r, O_STORE_PROXY, on_off, err, errlen));
    c->store_proxy = r->value[O_STORE_PROXY] && strcmp(r->value[O_STORE_PROXY], "on") == 0;
    static const char *ttys[] = {"auto", "on", "off", NULL};
    TRY(check_choice(r, O_TTY, ttys, err, errlen));
    c->tty = !r->value[O_TTY] || !strcmp(r->value[O_TTY], "auto") ? DDPRUN_TTY_AUTO
             : !strcmp(r->value[O_TTY], "on")                     ? DDPRUN_TTY_ON
                                                                  : DDPRUN_TTY_OFF;
    if (r->value[O_MASTER_PORT])
        TRY(get_int(r, O_MASTER_PORT, 0, 65535, &c->master_port, err, errlen));
    else
        c->master_port = STATIC_DEFAULT_PORT;

    c->join_timeout_s = 600;
    c->last_call_timeout_s = 30;
    c->close_timeout_s = 30;
    c->read_timeout_s = 60;
    c->timeout_s = 900;
    c->keep_alive_interval_s = 5;
    c->keep_alive_max_attempt = 3;
    c->heartbeat_timeout_s = 0; /* unset: keep_alive_interval * keep_alive_max_attempt */
    TRY(get_rdzv_conf(r, c, err, errlen));

    if (c->no_python && c->module && !c->run_path)
        return fail(err, errlen, "%s: cannot be combined with %s", r->label[O_NO_PYTHON],
                    r->label[O_MODULE]);

    const char *log_dir = r->value[O_LOG_DIR];
    const char *tmpl = r->value[O_LOG_LINE_PREFIX_TEMPLATE];
    TRY(dup_str(slurm_host ? slurm_host : r->value[O_MASTER_ADDR], &c->master_addr));
    size_t mlen = c->master_addr ? strlen(c->master_addr) : 0;
    if (mlen >= 2 && c->master_addr[0] == '[' && c->master_addr[mlen - 1] == ']') {
        /* An IPv6 literal written as in an endpoint: [::1] is ::1. */
        memmove(c->master_addr, c->master_addr + 1, mlen - 2);
        c->master_addr[mlen - 2] = '\0';
    }
    TRY(dup_str(r->value[O_LOCAL_ADDR], &c->local_addr));
    TRY(dup_str(r->value[O_ROLE], &c->role));
    TRY(dup_str(r->value[O_START_METHOD], &c->start_method));
    TRY(dup_str(log_dir && *log_dir ? log_dir : NULL, &c->log_dir));
    TRY(dup_str(tmpl && *tmpl ? tmpl : NULL, &c->log_line_prefix_template));
    TRY(dup_str(r->value[O_LOGS_SPECS], &c->logs_specs));
    TRY(dup_str(r->value[O_NUMA_BINDING], &c->numa_binding));
    TRY(dup_str(r->value[O_SIGNALS_TO_HANDLE], &c->signals_to_handle));
    TRY(dup_str(r->value[O_EVENT_LOG_HANDLER], &c->event_log_handler));
    TRY(dup_str(r->value[O_DUPLICATE_STDOUT_FILTERS], &c->duplicate_stdout_filters));
    TRY(dup_str(r->value[O_DUPLICATE_STDERR_FILTERS], &c->duplicate_stderr_filters));
    TRY(dup_str(r->value[O_TOKEN_FILE], &c->token_file));
    TRY(get_allow(r, c, err, errlen));

    /*
     * torchrun's run(): --standalone, and a one-node static job given neither an endpoint nor a
     * master port, both become c10d on a free local port with a random id. Port 0 tells the
     * agent to host the store itself and publish the port it got.
     */
    const char *endpoint = r->value[O_RDZV_ENDPOINT];
    bool local = c->standalone || (backend == DDPRUN_BACKEND_STATIC && !*endpoint &&
                                   !r->value[O_MASTER_PORT] && c->nnodes_max == 1);
    if (local) {
        c->rdzv_backend = DDPRUN_BACKEND_C10D;
        TRY(dup_str("127.0.0.1:0", &c->rdzv_endpoint));
        TRY(dup_str("127.0.0.1", &c->rdzv_host));
        c->rdzv_port = 0;
        TRY(make_uuid(&c->rdzv_id));
        c->is_host = true;
        c->is_host_given = 1;
        if (c->standalone) {
            c->nnodes_min = c->nnodes_max = 1;
            c->node_rank = 0;
        }
        return 0;
    }

    c->rdzv_backend = backend;
    TRY(dup_str(endpoint, &c->rdzv_endpoint));
    TRY(dup_str(r->value[O_RDZV_ID], &c->rdzv_id));
    if (backend == DDPRUN_BACKEND_ETCD) {
        /* The members are checked when ddprun connects (etcd.h's endpoint list); torchrun's
         * etcd backends read timeout as the join timeout. */
        if (!*endpoint)
            return fail(err, errlen,
                        "%s: the etcd backend needs the etcd cluster's members, "
                        "HOST[:PORT][,HOST[:PORT]...]",
                        r->label[O_RDZV_ENDPOINT]);
        if (c->timeout_given)
            c->join_timeout_s = c->timeout_s;
        return 0;
    }
    if (backend == DDPRUN_BACKEND_C10D) {
        if (!*endpoint) {
            /* torchrun's parse_rendezvous_endpoint() of an empty endpoint. */
            TRY(dup_str("localhost", &c->rdzv_host));
            c->rdzv_port = C10D_DEFAULT_PORT;
        } else {
            TRY(split_endpoint(r->label[O_RDZV_ENDPOINT], endpoint, &c->rdzv_host, &c->rdzv_port,
                               err, errlen));
            if (c->rdzv_port < 0)
                c->rdzv_port = C10D_DEFAULT_PORT;
        }
        return 0;
    }

    /* Static: the endpoint, when given, is node 0's store and so replaces the master's. */
    if (*endpoint) {
        TRY(split_endpoint(r->label[O_RDZV_ENDPOINT], endpoint, &c->rdzv_host, &c->rdzv_port, err,
                           errlen));
        if (c->rdzv_port < 0)
            return fail(err, errlen, "%s: the static backend needs a port, got '%s'",
                        r->label[O_RDZV_ENDPOINT], endpoint);
        free(c->master_addr);
        TRY(dup_str(c->rdzv_host, &c->master_addr));
        c->master_port = c->rdzv_port;
    } else {
        TRY(dup_str(c->master_addr, &c->rdzv_host));
        c->rdzv_port = c->master_port;
    }
    if (c->node_rank >= c->nnodes_max)
        return fail(err, errlen, "%s: %d is not below the node count %d of %s",
                    r->label[O_NODE_RANK], c->node_rank, c->nnodes_max, r->label[O_NNODES]);
    return 0;
#undef TRY
}

int ddprun_virtual_device(const char *visible, int local_rank, char *buf, size_t len)
{
    if (!visible) {
        int k = snprintf(buf, len, "%d", local_rank);
        return k >= 0 && (size_t)k < len ? 0 : -ERANGE;
    }
    const char *p = visible;
    for (int i = 0; i < local_rank; i++) {
        p = strchr(p, ',');
        if (!p)
            return -ERANGE;
        p++;
    }
    size_t n = strcspn(p, ",");
    while (n && isspace((unsigned char)*p))
        p++, n--;
    while (n && isspace((unsigned char)p[n - 1]))
        n--;
    if (n >= len)
        return -ERANGE;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return 0;
}

/*
 * Whether the file at path is a program that torchrun's "python -u path" could not run but exec
 * can: executable, and a binary (ELF) or a script whose '#!' line names no python. A file that
 * cannot be read counts as not a program.
 */
static bool is_program(const char *path)
{
    struct stat st;
    char head[256];
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || access(path, X_OK) != 0)
        return false;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, head, sizeof head - 1);
    close(fd);
    if (n < 4)
        return false;
    head[n] = '\0';
    if (memcmp(head, "\177ELF", 4) == 0)
        return true;
    if (head[0] != '#' || head[1] != '!')
        return false;
    head[strcspn(head, "\n")] = '\0';
    return strstr(head, "python") == NULL;
}

/* The executable execvp() would run for a name without a slash, in buf; false if none. */
static bool find_on_path(const char *name, char *buf, size_t len)
{
    const char *path = getenv("PATH");
    for (const char *p = path ? path : "/bin:/usr/bin"; *p;) {
        size_t n = strcspn(p, ":");
        struct stat st;
        int k = snprintf(buf, len, "%.*s%s%s", (int)n, p, n ? "/" : "", name);
        if (k > 0 && (size_t)k < len && stat(buf, &st) == 0 && S_ISREG(st.st_mode) &&
            access(buf, X_OK) == 0)
            return true;
        p += n + (p[n] == ':');
    }
    return false;
}

/*
 * What runs (c->python, c->program). torchrun puts "python -u" in front of every training script
 * unless --no-python. ddprun does the same, except for programs python cannot run (is_program()),
 * which run as they are, so that binaries work without --no-python. The file looked at is the one
 * python would open: the script itself when its name has a slash or a file of that name is in
 * the working directory (run as "./NAME" then), else the command PATH finds. A name ending in
 * .py, -m and --run-path always mean python. --run-path takes the script's path as it is, a
 * relative one from the working directory, which the workers share: torchrun's workers, which
 * inherit torchrun's, call runpy.run_path() on the path as given.
 */
static int choose_program(ddprun_config *c, const char *script)
{
    char found[4096];
    struct stat st;
    const char *path = NULL;
    bool here = false;
    size_t len = strlen(script);

    c->python = !c->no_python || c->run_path;
    if (c->python && !c->module && !c->run_path &&
        !(len > 3 && strcmp(script + len - 3, ".py") == 0)) {
        if (strchr(script, '/'))
            path = script;
        else if (stat(script, &st) == 0 && S_ISREG(st.st_mode))
            path = script, here = true;
        else if (find_on_path(script, found, sizeof found))
            path = found;
        c->python = !(path && is_program(path));
    }
    if (here && !c->python) {
        c->program = malloc(len + 3);
        if (c->program)
            snprintf(c->program, len + 3, "./%s", script);
    } else {
        c->program = strdup(script);
    }
    return c->program ? 0 : -ENOMEM;
}

/*
 * --virtual-local-rank: every local rank must have a device in the list torchrun reads (its
 * ValueError at worker start is a usage error here). Then one warning per option that is
 * accepted but changes nothing in ddprun, so that torchrun command lines keep working but say so.
 */
static int check_extras(const struct raw *r, ddprun_config *c, char *err, size_t errlen)
{
    static const char *forwarded[] = {"SIGINT",  "SIGTERM", "SIGHUP",
                                      "SIGQUIT", "SIGUSR1", "SIGUSR2"};
    int rc = 0;
    char dev[64];

    if (c->virtual_local_rank) {
        const char *hip = getenv("HIP_VISIBLE_DEVICES");
        const char *var = hip && *hip ? "HIP_VISIBLE_DEVICES" : "CUDA_VISIBLE_DEVICES";
        const char *list = getenv(var);
        int last = c->nproc_per_node - 1;
        if (ddprun_virtual_device(list, last, dev, sizeof dev) < 0)
            return fail(err, errlen, "%s: local rank %d has no device in %s=%s",
                        r->label[O_VIRTUAL_LOCAL_RANK], last, var, list);
    }
    if (r->value[O_NUMA_BINDING])
        rc = warn(c, "%s has no effect in ddprun: workers are not bound to NUMA nodes",
                  r->label[O_NUMA_BINDING]);
    if (!rc && r->value[O_LOGS_SPECS])
        rc = warn(c, "%s has no effect in ddprun: it has no log plug-ins", r->label[O_LOGS_SPECS]);
    if (!rc && strcmp(r->value[O_EVENT_LOG_HANDLER], "null") != 0)
        rc = warn(c, "%s has no effect in ddprun: it has no event log handlers",
                  r->label[O_EVENT_LOG_HANDLER]);
    for (int id = O_DUPLICATE_STDOUT_FILTERS; !rc && id <= O_DUPLICATE_STDERR_FILTERS; id++)
        if (*r->value[id])
            rc = warn(c,
                      "%s has no effect in ddprun: matching lines are not copied to a file "
                      "of their own",
                      r->label[id]);
    if (!rc && r->value[O_LOCAL_ADDR] && c->rdzv_backend != DDPRUN_BACKEND_ETCD)
        rc = warn(c,
                  "%s has no effect in ddprun with the %s backend: workers reach the store at the "
                  "rendezvous address",
                  r->label[O_LOCAL_ADDR], ddprun_backend_name(c->rdzv_backend));
    const char *sigs = r->value[O_SIGNALS_TO_HANDLE];
    for (const char *p = sigs; !rc && *p;) {
        size_t n = strcspn(p, ",");
        const char *q = p;
        p += n + (p[n] == ',');
        while (n && isspace((unsigned char)*q))
            q++, n--;
        while (n && isspace((unsigned char)q[n - 1]))
            n--;
        bool known = false;
        for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0] && !known; i++)
            known = strlen(forwarded[i]) == n && strncmp(forwarded[i], q, n) == 0;
        if (!known)
            rc = warn(c,
                      "%s: ddprun does not forward %.*s (it forwards SIGINT, SIGTERM, SIGHUP, "
                      "SIGQUIT, SIGUSR1 and SIGUSR2)",
                      r->label[O_SIGNALS_TO_HANDLE], (int)n, q);
    }
    return rc;
}

int ddprun_config_parse(int argc, char **argv, ddprun_config *cfg, char *err, size_t errlen)
{
    struct raw *r = NULL;
    ddprun_config *c = NULL;
    char *slurm_host = NULL;
    int rc;

    if (err && errlen)
        err[0] = '\0';
    if (argc < 1 || !argv || !cfg)
        return fail(err, errlen, "no arguments");
    r = calloc(1, sizeof *r);
    c = calloc(1, sizeof *c);
    if (!r || !c) {
        rc = -ENOMEM;
        goto out;
    }
    read_defaults(r);
    int script = read_argv(argc, argv, r, err, errlen);
    if (script <= 0) {
        rc = script < 0 ? script : 1;
        goto out;
    }
    if (script >= argc) {
        rc = fail(err, errlen, "missing the training script after '--'");
        goto out;
    }
    long standalone = 0;
    if (r->value[O_STANDALONE] && !to_long(r->value[O_STANDALONE], &standalone))
        standalone = 0; /* resolve() reports it */
    if (!standalone) {
        rc = read_slurm(r, c, &slurm_host, err, errlen);
        if (rc < 0)
            goto out;
        c->from_slurm = rc > 0;
    }
    rc = resolve(r, slurm_host, c, err, errlen);
    if (rc < 0)
        goto out;
    rc = choose_program(c, argv[script]);
    if (rc < 0)
        goto out;
    rc = check_extras(r, c, err, errlen);
    if (rc < 0)
        goto out;
    c->argv = argv + script;
    c->argc = argc - script;
    *cfg = *c;
    free(c);
    c = NULL;
    rc = 0;
out:
    if (rc == -ENOMEM && err && errlen && !err[0])
        fail(err, errlen, "out of memory");
    if (c)
        ddprun_config_free(c);
    free(slurm_host);
    free(r);
    free(c);
    return rc;
}
