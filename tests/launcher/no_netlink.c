/*
 * An LD_PRELOAD shim for test_admission.sh: socket(AF_NETLINK, ...) fails with EAFNOSUPPORT, as
 * on a kernel that cannot be asked who owns a socket; every other socket() is the real one. It
 * shows that the store's other-user rule fails closed when the kernel cannot answer.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <sys/socket.h>

int socket(int domain, int type, int protocol)
{
    static int (*real)(int, int, int);
    if (domain == AF_NETLINK) {
        errno = EAFNOSUPPORT;
        return -1;
    }
    if (!real)
        real = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
    return real ? real(domain, type, protocol) : (errno = ENOSYS, -1);
}
