#!/usr/bin/env python3
"""Hosts one PyTorch TCPStore server for store-bench, the reference the bench compares against.

Starts torch.distributed.TCPStore(host, port, is_master=True, wait_for_workers=False), prints
two lines on stdout and flushes them:

    <port>
    torch <version> libuv=<0|1|?>

then stays up until its stdin closes (or it is killed). It serves whatever protocol generation
the interpreter's torch speaks: torch < 2.2 the legacy one, newer torch the modern one (VALIDATE
first). It does not measure anything and never talks to the store itself.

Listening socket: torch >= 2 formats every accepted client's address with getnameinfo() on its
event-loop thread, a reverse DNS lookup unless /etc/hosts answers. Left to itself it listens
dual-stack, so a 127.0.0.1 client shows up as ::ffff:127.0.0.1, which /etc/hosts never lists,
and every connection costs a DNS round trip (on a resolver that rate-limits, a 5 s stall every
few dozen connections). To measure the store rather than the resolver, this script binds an
IPv4 socket to --host itself and hands it over (master_listen_fd), so lookups are answered from
/etc/hosts. --own-listener restores torch's own listener.

Exit codes: 0 after stdin closed, 77 when torch cannot be imported (the bench reports the anchor
as skipped), 2 on bad arguments.
"""

import argparse
import datetime
import os
import socket
import sys
import warnings


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=0, help="port, 0 for any (default 0)")
    ap.add_argument("--timeout-s", type=float, default=600.0,
                    help="the store's operation timeout in seconds (default 600)")
    ap.add_argument("--no-libuv", action="store_true",
                    help="torch >= 2.4: use the older non-libuv server")
    ap.add_argument("--own-listener", action="store_true",
                    help="let torch >= 2 create its own (dual-stack) listening socket")
    args = ap.parse_args()

    # Importing torch without numpy warns on stderr; that is noise for the bench's log.
    warnings.filterwarnings("ignore")
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # ImportError, or a broken install raising anything else
        print(f"torch_store_server: cannot import torch: {e}", file=sys.stderr)
        return 77

    kwargs = {}
    if args.no_libuv:
        kwargs["use_libuv"] = False
    port = args.port
    listener = None
    if not args.own_listener and int(torch.__version__.split(".")[0]) >= 2:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((args.host, args.port))
        listener.listen(socket.SOMAXCONN)  # torch listens again with its own backlog
        port = listener.getsockname()[1]
        kwargs["master_listen_fd"] = listener.fileno()
    store = dist.TCPStore(args.host, port, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=args.timeout_s), **kwargs)
    libuv = getattr(store, "libuvBackend", None)
    libuv = "?" if libuv is None else int(bool(libuv))
    sys.stdout.write(f"{store.port}\ntorch {torch.__version__} libuv={libuv}\n")
    sys.stdout.flush()

    # Block until the bench closes our stdin.
    while sys.stdin.buffer.read(4096):
        pass
    # Skip interpreter teardown: the store's destructor may join a server thread that still
    # holds client connections, and nothing here needs cleaning up.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
