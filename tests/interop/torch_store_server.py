#!/usr/bin/env python3
"""Host PyTorch's own TCPStore server, as the reference the interop tests compare against.

Usage: torch_store_server.py [HOST]   (HOST defaults to 127.0.0.1)

Binds port 0, prints the chosen port as the first line of stdout, and serves until stdin
reaches end of file or the process is killed. The caller keeps stdin open (a pipe or fifo it
holds) so that the server also goes away when the caller dies. Run it with the same
interpreter as the clients: torch 1.13 serves the legacy protocol, torch 2.x the modern one
(with its default libuv backend).

No world size is given and wait_for_workers is off, so the server holds no keys of its own
and does not wait for anyone to join; every user, rank 0 included, is an ordinary client.
"""

import datetime
import sys

import torch.distributed as dist


def main():
    host = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
    # Positional arguments: the keyword names differ between torch 1.13 and 2.x.
    store = dist.TCPStore(host, 0, None, True, datetime.timedelta(seconds=30), False)
    print(store.port, flush=True)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())
