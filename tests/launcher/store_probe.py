#!/usr/bin/env python3
"""A worker that passes a barrier on the store named by MASTER_ADDR/MASTER_PORT with raw
modern-protocol requests (no torch), then, on rank 0 once every rank has passed, prints the
store's STATUS as one line "STATUS <json>". Used by store_proxy.sh to see what the root store
saw with and without --store-proxy: its connections, its multiplexed ones, its operations.

Each rank: ADD probe/arrived 1; WAIT probe/all (the last to arrive sets it); ADD probe/passed 1;
rank 0 then WAITs probe/done, which the last to pass sets, and asks for STATUS (not with
--no-status: a PyTorch store has none). With --hold-first, the first attempt
(TORCHELASTIC_RESTART_COUNT 0) prints "ready MASTER_PORT" and WAITs for a key nobody sets
instead, and fails when its connection closes. Bounded by the socket's timeout."""

import json
import os
import socket
import struct
import sys


def vec(b):
    return struct.pack("<Q", len(b)) + b


class Store:
    def __init__(self, host, port):
        self.s = socket.create_connection((host, port), timeout=60)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE))  # VALIDATE

    def recv(self, n):
        b = b""
        while len(b) < n:
            c = self.s.recv(n - len(b))
            if not c:
                raise ConnectionError("store closed the connection")
            b += c
        return b

    def add(self, key, delta):
        self.s.sendall(b"\x04" + vec(key) + struct.pack("<q", delta))
        return struct.unpack("<q", self.recv(8))[0]

    def set(self, key, val):
        self.s.sendall(b"\x01" + vec(key) + vec(val))

    def wait(self, key):
        self.s.sendall(b"\x06" + struct.pack("<Q", 1) + vec(key))
        assert self.recv(1) == b"\x00"

    def status(self):
        self.s.sendall(b"\xe0")
        n = struct.unpack("<Q", self.recv(8))[0]
        return json.loads(self.recv(n))


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    st = Store(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    if "--hold-first" in sys.argv and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        print("ready " + os.environ["MASTER_PORT"], flush=True)
        st.wait(b"probe/never")
        return 1
    if st.add(b"probe/arrived", 1) == world:
        st.set(b"probe/all", b"1")
    st.wait(b"probe/all")
    if st.add(b"probe/passed", 1) == world:
        st.set(b"probe/done", b"1")
    if rank == 0 and "--no-status" not in sys.argv:
        st.wait(b"probe/done")
        print("STATUS " + json.dumps(st.status(), separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
