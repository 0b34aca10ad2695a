#!/usr/bin/env python3
"""Peers that test the store's admission (test_admission.sh): what a client library cannot do.

  admission_peer.py probe HOST PORT [--dev DEV] [--src ADDR] [--set KEY VALUE]
      One modern connection, bound to device DEV first (SO_BINDTODEVICE) and/or to source
      address ADDR (an IPv6 link-local "fe80::b%v1" carries its scope), that sends VALIDATE,
      PING, LIST_KEYS, the optional SET, and PING again. Prints "admitted KEYS..." when every
      reply came (the keys LIST_KEYS showed), "refused" when the store closed the connection.
      Exit 0 admitted, 1 refused, 2 could not connect.

  admission_peer.py flood HOST PORT COUNT READY [--once]
      Holds COUNT idle connections to HOST:PORT (sending nothing), opening a new one for each the
      store closes (not with --once), until killed. Writes "up" into the file (FIFO) READY once
      COUNT connection attempts were made, and then the number of connections the store closed,
      every second, to stdout.

  admission_peer.py hold HOST PORT COUNT
      Opens COUNT idle connections, prints "opened", then obeys stdin: for each line "close1" it
      closes the connections the store closed and one it still holds, and prints "closed one,
      held N". Ends at end of input.

Protocol: rdzv-protocol(7), modern generation. Bounded: every wait has a timeout.
"""
import selectors
import socket
import struct
import sys
import time


def sockaddr(host, port):
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    return info[0], info[4]


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        got = s.recv(n - len(buf))
        if not got:
            raise EOFError
        buf += got
    return buf


def probe(argv):
    host, port = argv[0], int(argv[1])
    dev = src = None
    kv = None
    i = 2
    while i < len(argv):
        if argv[i] == "--dev":
            dev, i = argv[i + 1], i + 2
        elif argv[i] == "--src":
            src, i = argv[i + 1], i + 2
        elif argv[i] == "--set":
            kv, i = (argv[i + 1], argv[i + 2]), i + 3
        else:
            sys.exit("probe: unknown argument " + argv[i])
    fam, addr = sockaddr(host, port)
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(5)
    if dev:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
    if src:
        s.bind(sockaddr(src, 0)[1])
    try:
        s.connect(addr)
    except OSError as e:
        print("cannot connect:", e, file=sys.stderr)
        return 2
    try:
        s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x0d" + struct.pack("<I", 7))
        if struct.unpack("<I", recv_exact(s, 4))[0] != 7:
            raise EOFError
        s.sendall(b"\x11")
        n = struct.unpack("<q", recv_exact(s, 8))[0]
        keys = []
        for _ in range(n):
            ln = struct.unpack("<Q", recv_exact(s, 8))[0]
            keys.append(recv_exact(s, ln).decode(errors="replace"))
        if kv:
            k, v = kv[0].encode(), kv[1].encode()
            s.sendall(b"\x01" + struct.pack("<Q", len(k)) + k + struct.pack("<Q", len(v)) + v)
        s.sendall(b"\x0d" + struct.pack("<I", 8))
        if struct.unpack("<I", recv_exact(s, 4))[0] != 8:
            raise EOFError
    except (EOFError, ConnectionError, socket.timeout):
        print("refused")
        return 1
    print("admitted", *keys)
    return 0


def flood(argv):
    host, port, count, ready = argv[0], int(argv[1]), int(argv[2]), argv[3]
    once = "--once" in argv[4:]
    fam, addr = sockaddr(host, port)
    sel = selectors.DefaultSelector()
    closed = 0

    def open_one():
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect_ex(addr)
        except OSError:
            s.close()
            return
        sel.register(s, selectors.EVENT_READ)

    for _ in range(count):
        open_one()
    with open(ready, "w") as f:
        f.write("up\n")
    last = time.monotonic()
    while True:
        for key, _ in sel.select(timeout=0.2):
            s = key.fileobj
            try:
                data = s.recv(1)
            except OSError:
                data = b""
            if data:
                continue
            sel.unregister(s)
            s.close()
            closed += 1
            if not once:
                open_one()
        if time.monotonic() - last >= 1:
            last = time.monotonic()
            print("closed", closed, flush=True)


def hold(argv):
    host, port, count = argv[0], int(argv[1]), int(argv[2])
    fam, addr = sockaddr(host, port)
    conns = []
    for _ in range(count):
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(addr)
        conns.append(s)
    print("opened", len(conns), flush=True)
    for line in sys.stdin:
        if line.strip() != "close1":
            continue
        gone = selectors.DefaultSelector()
        for s in conns:
            gone.register(s, selectors.EVENT_READ)
        for key, _ in gone.select(timeout=0):
            conns.remove(key.fileobj)
            key.fileobj.close()
        gone.close()
        if conns:
            conns.pop().close()
        print("closed one, held", len(conns), flush=True)


if __name__ == "__main__":
    modes = {"probe": probe, "flood": flood, "hold": hold}
    if len(sys.argv) < 2 or sys.argv[1] not in modes:
        sys.exit(__doc__)
    sys.exit(modes[sys.argv[1]](sys.argv[2:]))
