/*
 * The table of rendezvous backends (backend.h): one row per --rdzv-backend value, each defined
 * in a file of its own. The agent picks its row once, by name, at startup.
 */
#include "backend.h"

#include <string.h>

extern const ddprun_backend_ops ddprun_backend_static; /* backend_static.c */
extern const ddprun_backend_ops ddprun_backend_c10d;   /* backend_c10d.c */
#ifdef DDPRUN_HAVE_ETCD
extern const ddprun_backend_ops ddprun_backend_etcd; /* backend_etcd.c (needs libcurl) */
#endif

static const ddprun_backend_ops *const backends[] = {
    &ddprun_backend_static,
    &ddprun_backend_c10d,
#ifdef DDPRUN_HAVE_ETCD
    &ddprun_backend_etcd,
#endif
};

const ddprun_backend_ops *ddprun_backend_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof(backends) / sizeof(backends[0]); i++)
        if (strcmp(backends[i]->name, name) == 0)
            return backends[i];
    return NULL;
}
