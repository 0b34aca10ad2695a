/*
 * Failure records (failure.h): building one, and its JSON encoding through jansson. The agent
 * (ddprun.c) makes every record with ddprun_failure_init(), sends it with ddprun_failure_to_json()
 * and reads other nodes' with ddprun_failure_from_json(), so a record means the same on every
 * node.
 *
 * Deliberately not here: the store (noderdzv.c publishes and waits for the text), printing the
 * summary, reading a worker's error file (ddprun.c). Out-parameters are written only on success.
 */
#include "failure.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

void ddprun_failure_init(ddprun_failure *f, const char *node, int rank, int local_rank,
                         int exit_code, int pid, const char *message)
{
    struct timespec ts;
    /* The wall clock on purpose: see ddprun_failure.time. */
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(f, 0, sizeof *f);
    f->time = (double)ts.tv_sec + ts.tv_nsec / 1e9;
    snprintf(f->node, sizeof f->node, "%s", node ? node : "?");
    f->rank = rank;
    f->local_rank = local_rank;
    f->exit_code = exit_code;
    f->pid = pid;
    snprintf(f->message, sizeof f->message, "%s", message ? message : "");
}

char *ddprun_failure_to_json(const ddprun_failure *f)
{
    if (!f)
        return NULL;
    json_t *o =
        json_pack("{s:f, s:s, s:i, s:i, s:i, s:i, s:s, s:b}", "time", f->time, "node", f->node,
                  "rank", f->rank, "local_rank", f->local_rank, "exit_code", f->exit_code, "pid",
                  f->pid, "message", f->message, "teardown", f->teardown);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

int ddprun_failure_from_json(const char *json, ddprun_failure *f)
{
    if (!json || !f)
        return -EINVAL;
    json_t *o = json_loads(json, 0, NULL);
    if (!o)
        return -EPROTO;
    ddprun_failure r;
    memset(&r, 0, sizeof r);
    const char *node = NULL, *msg = NULL;
    int teardown = 0;
    int rc = json_unpack(o, "{s:F, s:s, s:i, s:i, s:i, s:i, s?s, s?b}", "time", &r.time, "node",
                         &node, "rank", &r.rank, "local_rank", &r.local_rank, "exit_code",
                         &r.exit_code, "pid", &r.pid, "message", &msg, "teardown", &teardown) == 0
                 ? 0
                 : -EPROTO;
    if (rc == 0) {
        r.teardown = teardown != 0;
        snprintf(r.node, sizeof r.node, "%s", node);
        snprintf(r.message, sizeof r.message, "%s", msg ? msg : "");
        *f = r;
    }
    json_decref(o);
    return rc;
}

int ddprun_failure_exit_status(const ddprun_failure *f)
{
    if (!f)
        return 1;
    int code = f->exit_code >= 0 ? f->exit_code : 128 - f->exit_code;
    return code == 0 ? 1 : code;
}

int ddprun_failure_cmp(const void *x, const void *y)
{
    const ddprun_failure *a = x, *b = y;
    if (a->teardown != b->teardown)
        return a->teardown ? 1 : -1;
    return a->time < b->time ? -1 : a->time > b->time;
}
