#!/usr/bin/env python3
"""Run PyTorch's own TCPStore tests (test/distributed/test_store.py) against ddp-rendezvous.

Usage: torch_store_suite.py [--proxy PROXY_SERVE] [-k SUBSTRING]... DDP_RENDEZVOUS TEST_STORE_PY

TEST_STORE_PY is PyTorch's test file of the same version as the torch this interpreter imports;
it is loaded from that path, never copied here. Before it is loaded, torch.distributed.TCPStore
is replaced (in every torch.distributed module that names it) by a subclass whose master role is
played by our server: where a test constructs a master store, a fresh `ddp-rendezvous serve
--bind 127.0.0.1` is started on the port the test asked for (0: a free one), and the object the
test gets is PyTorch's own client connected to it. With --proxy, a store proxy
(tests/rendezvous/proxy_serve.c) is started on that port in front of a server on a free port, so
every client goes through the proxy. A client store (is_master=False) is PyTorch's, untouched.

What the master object itself does in PyTorch is done here, in its place:
  - wait_for_workers with a world size: wait until world_size clients have joined (PyTorch's
    "init/" counter), else raise DistStoreError "Timed out after N seconds waiting for clients.
    J/W clients joined." as PyTorch's master does;
  - a server that cannot listen: DistNetworkError "The server socket has failed to listen on any
    local network address.", followed by our server's own error (strerror: "Address already in
    use"); with TORCHELASTIC_USE_AGENT_STORE set and MASTER_PORT naming the port, that failure
    is ignored and the object is a client, as PyTorch 2.x's constructor does;
  - multi_tenant=True: masters of one port in one process share one server;
  - master_listen_fd: the bound socket is handed to `serve --listen-fd`.
The server (and proxy) lives until the test that made the master ends: PyTorch's lives as long
as the C++ store, which may outlive its Python object. TCPStoreTest and LibUvTCPStoreTest both
run: use_libuv picks only the client's backend here (the non-libuv client has no queues, so
the file skips its queue tests, as it does against PyTorch's own server).

Tests that check something only PyTorch's in-process server has are reported as skipped with
the reason (NOT_APPLICABLE below), never dropped. Every server and proxy must still be running
when its master goes away; one that died counts as a failure.

Prints unittest's verbose log, the not-applicable tests with their reasons, the proxies' summed
counters, then "N passed, N failed, N skipped". Exit status: 0 all passed, 1 a failure, 2 usage,
77 torch.distributed or PyTorch's test helpers (expecttest) missing.
"""

import argparse
import atexit
import importlib.util
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import weakref
from datetime import timedelta

# Tests that assert a property of PyTorch's own in-process server object, keyed by
# "Class.method" (the names of both torch versions' files).
NOT_APPLICABLE = {
    "TCPStoreTest.test_repr": "asserts repr() names PyTorch's in-process server "
    "(server=TCPServer(port=N)); the master here is a client of ddp-rendezvous (server=<nullptr>)",
}
NOT_APPLICABLE["LibUvTCPStoreTest.test_repr"] = NOT_APPLICABLE["TCPStoreTest.test_repr"]
# Only through the proxy.
PROXY_NOT_APPLICABLE = {
    "TCPStoreTest.test_take_over_listen_socket": "hands the master a bound socket "
    "(master_listen_fd); ddp-rendezvous serve takes it (--listen-fd, run directly) but the test "
    "proxy takes no descriptor, and the clients must reach the proxy",
}
PROXY_NOT_APPLICABLE["LibUvTCPStoreTest.test_take_over_listen_socket"] = PROXY_NOT_APPLICABLE[
    "TCPStoreTest.test_take_over_listen_socket"
]

# TCPStore's constructor arguments in order (torch 1.13 stops after multi_tenant).
ARG_NAMES = ["host_name", "port", "world_size", "is_master", "timeout", "wait_for_workers",
             "multi_tenant", "master_listen_fd", "use_libuv"]
START_TIMEOUT_S = 10
VALIDATE_MAGIC = 0x3C85F7CE
OP_VALIDATE, OP_ADD = 0, 4  # the modern protocol's, which our server speaks to anyone


class Served:
    """One ddp-rendezvous serve (and with a proxy, one proxy_serve in front of it) for a master
    store; `port` is where clients connect. Raises OSError (errno, our program's message) when
    a program cannot start."""

    crashes = []  # "what: how", for programs that were not running when they were stopped
    proxy_totals = {}  # the proxies' counters, summed
    live = set()
    started = 0  # masters served
    masters = []  # (store, Served) of the running test, or made before any test started

    def __init__(self, rdzv, proxy, port, listen_fd):
        self.procs = []
        Served.live.add(self)
        try:
            if listen_fd is not None:
                args = ["--listen-fd", str(listen_fd)]
            else:
                args = ["--bind", "127.0.0.1", "--port", str(0 if proxy else port)]
            root = self._start("ddp-rendezvous", [rdzv, "serve", "--quiet"] + args,
                               pass_fds=() if listen_fd is None else (listen_fd,))
            self.port = root
            if proxy:
                env = dict(os.environ, PROXY_SERVE_PORT=str(port)) if port else None
                self.port = self._start("proxy_serve", [proxy, "127.0.0.1", str(root)], env=env)
            Served.started += 1
        except BaseException:
            self.close()
            raise

    def _start(self, what, argv, pass_fds=(), env=None):
        err = tempfile.TemporaryFile()
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                             pass_fds=pass_fds, env=env)
        p.what, p.err, p.lines = what, err, []
        self.procs.append(p)
        line = b""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            if select.select([p.stdout], [], [], deadline - time.monotonic())[0]:
                c = p.stdout.read1(1) if hasattr(p.stdout, "read1") else p.stdout.read(1)
                if not c:
                    break
                line += c
        p.started = line.strip().isdigit()
        if not p.started:
            p.wait(timeout=START_TIMEOUT_S)
            err.seek(0)
            msg = err.read().decode(errors="replace").strip() or f"exit status {p.returncode}"
            raise OSError(98 if "in use" in msg else 0, f"{what}: {msg}")
        # Keep reading stdout (the proxy's counters come last) so it never blocks on a pipe.
        p.reader = threading.Thread(target=lambda: p.lines.extend(p.stdout), daemon=True)
        p.reader.start()
        return int(line)

    def close(self):
        if self not in Served.live:
            return
        Served.live.discard(self)
        for p in reversed(self.procs):  # the proxy first: its root must outlive it
            if not getattr(p, "started", False):
                p.kill()  # it failed to start, as _start reported
                p.wait()
                continue
            alive = p.poll() is None
            if p.what == "proxy_serve":
                p.stdin.close()  # end of file: it prints its counters and exits 0
            else:
                p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                Served.crashes.append(f"{p.what}: did not stop within 5 s, killed")
            if not alive or p.returncode != 0:
                p.err.seek(0)
                tail = p.err.read().decode(errors="replace").strip().splitlines()[-3:]
                Served.crashes.append(f"{p.what}: {'exited' if not alive else 'stopped'} with "
                                      f"status {p.returncode} {tail}")
            if p.what == "proxy_serve":
                self._count(p)

    @staticmethod
    def _count(p):
        p.reader.join(timeout=5)
        words = b"".join(p.lines).split()
        for name, value in zip(words[::2], words[1::2]):
            if value.isdigit():
                key = name.decode()
                Served.proxy_totals[key] = Served.proxy_totals.get(key, 0) + int(value)


class Result(unittest.TextTestResult):
    """Stops the servers of each test's master stores when the test ends."""

    def startTest(self, test):
        Served.masters.clear()  # those made at import time (class attributes) stay up
        super().startTest(test)

    served_tests = 0  # tests that made a master store of their own

    def stopTest(self, test):
        super().stopTest(test)
        Result.served_tests += bool(Served.masters)
        for _, served in Served.masters:
            served.close()
        Served.masters.clear()


def joined_clients(port, timeout_s):
    """PyTorch's "init/" counter (each client adds 1 as it joins), read with a raw ADD of 0."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        key = b"init/"
        s.sendall(struct.pack("<BI", OP_VALIDATE, VALIDATE_MAGIC) +
                  struct.pack("<BQ", OP_ADD, len(key)) + key + struct.pack("<q", 0))
        reply = b""
        while len(reply) < 8:
            chunk = s.recv(8 - len(reply))
            if not chunk:
                raise ConnectionError("the store closed the connection")
            reply += chunk
        return struct.unpack("<q", reply)[0]


def make_tcpstore(dist, real, rdzv, proxy, torch2):
    tenants = weakref.WeakValueDictionary()  # port -> Served, for multi_tenant masters
    network_error = getattr(dist, "DistNetworkError", RuntimeError)
    store_error = getattr(dist, "DistStoreError", RuntimeError)

    class TCPStore(real):
        __doc__ = real.__doc__

        def __init__(self, *args, **kwargs):
            kw = dict(zip(ARG_NAMES, args), **kwargs)
            if not kw.get("is_master", False):
                super().__init__(**kw)
                return
            port = kw["port"]
            served = tenants.get(port) if kw.get("multi_tenant") and port else None
            if served not in Served.live:
                served = None
            if served is None:
                try:
                    served = Served(rdzv, proxy, port, kw.get("master_listen_fd"))
                except OSError as e:
                    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "") in ("1", "True",
                                                                                   "true")
                    agent = agent and os.environ.get("MASTER_PORT") == str(port)
                    if not (torch2 and agent and e.errno == 98):
                        raise network_error("The server socket has failed to listen on any "
                                            f"local network address. port: {port}: "
                                            f"{e.strerror}") from None
                if served is not None and kw.get("multi_tenant"):
                    tenants[served.port] = served
            # PyTorch keeps its server as long as the C++ store lives, which may outlive this
            # Python object (init_process_group keeps only the C++ one): hold both until the
            # test ends, so that the store handed back later is this very object.
            if served is not None:
                Served.masters.append((self, served))
            kw.update(is_master=False, port=served.port if served else port)
            kw.pop("multi_tenant", None)
            kw.pop("master_listen_fd", None)
            super().__init__(**kw)
            world = kw.get("world_size")
            if served is not None and kw.get("wait_for_workers", True) and world and world > 1:
                timeout = kw.get("timeout", timedelta(seconds=300))
                deadline = time.monotonic() + timeout.total_seconds()
                joined = joined_clients(served.port, timeout.total_seconds())
                while joined < world:
                    if time.monotonic() >= deadline:
                        raise store_error(f"Timed out after {int(timeout.total_seconds())} "
                                          f"seconds waiting for clients. {joined}/{world} "
                                          "clients joined.")
                    time.sleep(0.01)  # polling PyTorch's counter, as its master does
                    joined = joined_clients(served.port, timeout.total_seconds())

    TCPStore.__name__ = TCPStore.__qualname__ = "TCPStore"
    TCPStore.__module__ = real.__module__
    return TCPStore


def patch_torch(dist, ours):
    real = dist.TCPStore
    # Every module that imports TCPStore by name: the package, rendezvous (env://, tcp://),
    # distributed_c10d, and the test helpers (common_distributed uses dist.TCPStore).
    for name, mod in list(sys.modules.items()):
        if (name == "torch.distributed" or name.startswith("torch.distributed.")) and \
                getattr(mod, "TCPStore", None) is real:
            setattr(mod, "TCPStore", ours)


def load_tests(path, patterns, na):
    spec = importlib.util.spec_from_file_location("test_store", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["test_store"] = mod
    spec.loader.exec_module(mod)
    suite = unittest.TestSuite()
    for test in iter_tests(unittest.defaultTestLoader.loadTestsFromModule(mod)):
        cls, method = type(test).__name__, test._testMethodName
        name = f"{cls}.{method}"
        if patterns and not any(p in name for p in patterns):
            continue
        if name in na:
            # PyTorch's TestCase wraps each test method on the instance.
            setattr(test, method, unittest.skip("not applicable: " + na[name])(
                getattr(test, method)))
        suite.addTest(test)
    return suite


def iter_tests(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from iter_tests(t)
        else:
            yield t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proxy", metavar="PROXY_SERVE", help="put a store proxy in front")
    ap.add_argument("-k", action="append", default=[], metavar="SUBSTRING",
                    help="run only tests whose Class.method contains it (repeatable)")
    ap.add_argument("rdzv", metavar="DDP_RENDEZVOUS")
    ap.add_argument("test_store_py", metavar="TEST_STORE_PY")
    opt = ap.parse_args()
    for path in [opt.rdzv] + ([opt.proxy] if opt.proxy else []):
        if not os.access(path, os.X_OK):
            print(f"torch_store_suite: {path} is not an executable", file=sys.stderr)
            return 2
    if not os.path.isfile(opt.test_store_py):
        print(f"torch_store_suite: {opt.test_store_py}: no such file", file=sys.stderr)
        return 2
    # PyTorch's helpers read sys.argv and check that tests come from the running script.
    sys.argv = [os.path.abspath(opt.test_store_py)]
    try:
        import torch
        import torch.distributed as dist
        if not dist.is_available():
            raise ImportError("torch.distributed is not available")
        import torch.distributed.rendezvous  # noqa: F401  (names TCPStore)
        import torch.testing._internal.common_distributed  # noqa: F401  (needs expecttest)
    except ImportError as e:
        print(f"SKIP: {e}", file=sys.stderr)
        return 77
    torch2 = int(torch.__version__.split(".")[0]) >= 2
    print(f"torch {torch.__version__}, {opt.test_store_py}, "
          f"{'through a store proxy' if opt.proxy else 'directly'}", flush=True)
    patch_torch(dist, make_tcpstore(dist, dist.TCPStore, os.path.abspath(opt.rdzv),
                                    opt.proxy and os.path.abspath(opt.proxy), torch2))
    atexit.register(lambda: [s.close() for s in list(Served.live)])
    na = dict(NOT_APPLICABLE, **(PROXY_NOT_APPLICABLE if opt.proxy else {}))
    suite = load_tests(opt.test_store_py, opt.k, na)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout, resultclass=Result).run(suite)
    skipped = len(result.skipped)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    passed = result.testsRun - failed - skipped - len(result.expectedFailures)
    for test, reason in result.skipped:
        if reason.startswith("not applicable: "):
            print(f"not applicable: {test.id()}: {reason[len('not applicable: '):]}")
    for what in Served.crashes:
        print(f"FAIL: {what}")
    print(f"master stores served by ddp-rendezvous{' behind a proxy' if opt.proxy else ''}: "
          f"{Served.started}, made by {Result.served_tests} tests and at import")
    if Served.proxy_totals:
        print("proxies: " + " ".join(f"{k} {v}" for k, v in Served.proxy_totals.items()))
    print(f"{passed} passed, {failed + len(Served.crashes)} failed, {skipped} skipped", flush=True)
    return 0 if result.wasSuccessful() and not Served.crashes else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # PyTorch's module-level stores (TestMultiThreadedWait's) hold threads; leave without
    # waiting for them, after atexit has stopped our servers.
    for s in list(Served.live):
        s.close()
    os._exit(code)
