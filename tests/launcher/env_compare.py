#!/usr/bin/env python3
"""Checks and compares the dumps that dump_env.py wrote under two launchers.

    env_compare.py check DIR --nproc N [--attempts A] [--max-restarts M] [--standalone]
                   [--port P]
    env_compare.py compare REF_DIR TEST_DIR --nproc N [--attempts A] [--max-restarts M]
                   [--standalone] [--ref-port P] [--test-port P]
    env_compare.py diff A_DIR B_DIR         (report only, always exits 0)

check: the invariants any torchrun-compatible launcher meets on one node (ranks, sizes, run id,
restart count, error-file layout, agent store listening). compare: variable by variable against
the reference launcher (torchrun), with the allowed differences listed below. Prints one line
per finding; exit status 1 if any is a FAIL. Standard library only.
"""
import argparse
import glob
import json
import os
import re
import sys

# ------------------------------------------------------------------------------------------
# Variables whose values legitimately differ between two launches. Each is still checked for
# its shape by `check` (run on both sides), so "differs" never means "anything goes".
# ------------------------------------------------------------------------------------------
#
# MASTER_PORT: with --standalone the store port is picked at random (torchrun binds port 0);
#   in static cases each side was given its own --master-port and must report exactly that one.
#   Shape: a decimal port 1..65535, the same on every rank of an attempt.
# TORCHELASTIC_RUN_ID: --standalone draws a random run id (torchrun: uuid4). Shape: non-empty,
#   the same on every rank and attempt. Static cases: compared exactly ("none" by default).
# TORCHELASTIC_ERROR_FILE: a fresh temporary directory per run. Shape: an absolute path ending
#   in attempt_<restart count>/<local rank>/error.json, one per rank and attempt, all under one
#   run directory, whose parent directory exists when the worker starts and which does not
#   exist yet. Compared for presence only.
#
# MASTER_ADDR under --standalone: torchrun (1.13 and 2.x) says "localhost", the host of its
#   localhost:0 rendezvous endpoint. Another loopback spelling ("127.0.0.1", "::1") names the
#   same host and is accepted, reported as info; `check` still requires, where the agent store
#   is in use, that MASTER_ADDR:MASTER_PORT accepts connections. Static cases: exact.
LOOPBACK = {"localhost", "127.0.0.1", "::1"}
SHAPE_CHECKED = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}

# Version-specific variables. torch 1.13 and 2.x set different ones, and a launcher that is a
# drop-in for both may set the union. If the reference sets one, the tested launcher must set
# the same value; if the reference does not, the tested launcher may set it, but only to the
# value the other torch generation would (the default below, or the caller's own setting).
#   TORCH_NCCL_ASYNC_ERROR_HANDLING  torch 2.2+: "1" unless the caller set it
#   TORCHELASTIC_SIGNALS_TO_HANDLE   torch 2.4+ exports its --signals-to-handle setting
VERSION_SPECIFIC = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
}

# Deprecated variables: older torch generations set them, current torchrun does not, and the
# tested launcher must not either (torch 2.2+ warns in every worker that finds one set). When the
# reference sets one and the tested launcher does not, that is reported as info; a value the
# tested launcher adds that the caller did not set is a FAIL, whatever the reference did.
#   NCCL_ASYNC_ERROR_HANDLING        torch 1.13 to 2.1: "1" unless the caller set it; torch 2.2+
#                                    reads it only as a deprecated spelling of the one above
DEPRECATED = {"NCCL_ASYNC_ERROR_HANDLING"}

# TORCHELASTIC_USE_AGENT_STORE: torch 1.13 with --standalone (c10d rendezvous) says False and
# lets rank 0 start the TCPStore at MASTER_PORT; torch 2.x always says True and serves it from
# the agent. A launcher may say True where 1.13 says False provided its store is already
# listening at MASTER_ADDR:MASTER_PORT when the worker starts (recorded by dump_env.py); the
# worker then connects as a client, which works with both torch generations.
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"

# Set by the shell to the command it ran; differs between any two launchers.
IGNORED = {"_"}

# Launcher-private variables the tested launcher may add (torchrun sets none): informational.
PRIVATE_PREFIXES = ("DDPRUN_",)

ERROR_FILE_RE = re.compile(r"^(/.+)/attempt_(\d+)/(\d+)/error\.json$")


def load(d):
    """{(rank, attempt): (info, {name: (value, launcher_set)})}"""
    out = {}
    for path in sorted(glob.glob(os.path.join(d, "*.jsonl"))):
        m = re.match(r"^(rank\d+|pid\d+)\.attempt(\w+)\.jsonl$", os.path.basename(path))
        if not m:
            continue
        info, env = None, {}
        with open(path) as f:
            for line in f:
                obj = json.loads(line)
                if obj["kind"] == "info":
                    info = obj
                else:
                    env[obj["name"]] = (obj["value"], obj["launcher_set"])
        out[(m.group(1), m.group(2))] = (info, env)
    return out


class Report:
    """Prints findings; the same finding on several ranks/attempts is printed once."""

    def __init__(self, label):
        self.label = label
        self.failed = False
        self.seen = {}  # (level, text) -> [where, ...], in first-seen order

    def _add(self, level, msg, where):
        if level == "FAIL":
            self.failed = True
        self.seen.setdefault((level, msg), []).append(where)

    def fail(self, msg, where=None):
        self._add("FAIL", msg, where)

    def info(self, msg, where=None):
        self._add("info", msg, where)

    def flush(self):
        for (level, msg), wheres in self.seen.items():
            wheres = [w for w in wheres if w]
            at = ""
            if wheres:
                at = " at " + ", ".join(wheres[:4]) + (f" (+{len(wheres) - 4})" if len(wheres) > 4 else "")
            print(f"{level} [{self.label}] {msg}{at}")


def val(env, name):
    v = env.get(name)
    return None if v is None else v[0]


def check(d, a, rep):
    dumps = load(d)
    attempts = [str(i) for i in range(a.attempts)]
    want = {(f"rank{r}", at) for r in range(a.nproc) for at in attempts}
    have = set(dumps)
    if have != want:
        rep.fail(f"dumps {sorted(have)} != expected {sorted(want)}")
        return
    run_ids, roots, err_files = set(), set(), set()
    bad_error_files = 0
    for at in attempts:
        ports = set()
        for r in range(a.nproc):
            info, env = dumps[(f"rank{r}", at)]
            where = f"rank{r} attempt{at}"
            if not info["parent_env"]:
                rep.info(f"{where}: parent environment unreadable; all variables counted as set")
            expect = {
                "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r), "GROUP_RANK": "0",
                "WORLD_SIZE": str(a.nproc), "LOCAL_WORLD_SIZE": str(a.nproc),
                "ROLE_WORLD_SIZE": str(a.nproc), "GROUP_WORLD_SIZE": "1",
                "TORCHELASTIC_RESTART_COUNT": at,
                "TORCHELASTIC_MAX_RESTARTS": str(a.max_restarts),
            }
            for name, v in expect.items():
                if val(env, name) != v:
                    rep.fail(f"{where}: {name}={val(env, name)!r}, expected {v!r}")
            port = val(env, "MASTER_PORT")
            if port is None or not port.isdigit() or not 0 < int(port) < 65536:
                rep.fail(f"{where}: MASTER_PORT={port!r} is not a port")
            elif a.port is not None and int(port) != a.port:
                rep.fail(f"{where}: MASTER_PORT={port} but --master-port {a.port} was given")
            ports.add(port)
            if not val(env, "MASTER_ADDR"):
                rep.fail(f"{where}: MASTER_ADDR missing")
            run_ids.add(val(env, "TORCHELASTIC_RUN_ID"))
            if val(env, AGENT_STORE) == "True" and info["master_listening"] is not True:
                rep.fail(f"{where}: {AGENT_STORE}=True but nothing listens at "
                         f"{val(env, 'MASTER_ADDR')}:{port}")
            ef = val(env, "TORCHELASTIC_ERROR_FILE")
            m = ERROR_FILE_RE.match(ef or "")
            if not m:
                rep.fail(f"{where}: TORCHELASTIC_ERROR_FILE={ef!r} is not "
                         "/.../attempt_<n>/<local_rank>/error.json")
                bad_error_files += 1
                continue
            if (m.group(2), m.group(3)) != (at, str(r)):
                rep.fail(f"{where}: TORCHELASTIC_ERROR_FILE={ef} names attempt {m.group(2)} "
                         f"local rank {m.group(3)}")
            if not info["error_file_dir_exists"]:
                rep.fail(f"{where}: directory of TORCHELASTIC_ERROR_FILE={ef} does not exist")
            if info["error_file_exists"]:
                rep.fail(f"{where}: TORCHELASTIC_ERROR_FILE={ef} exists before the worker ran")
            roots.add(m.group(1))
            err_files.add(ef)
        if len(ports) != 1:
            rep.fail(f"attempt{at}: ranks disagree on MASTER_PORT: {sorted(ports)}")
    if len(run_ids) != 1 or None in run_ids or "" in run_ids:
        rep.fail(f"TORCHELASTIC_RUN_ID not one non-empty value: {sorted(map(str, run_ids))}")
    if bad_error_files == 0 and len(err_files) != len(want):
        rep.fail(f"{len(err_files)} distinct error files for {len(want)} rank-attempts")
    if len(roots) > 1:
        rep.fail(f"error files under several run directories: {sorted(roots)}")


def compare(ref_dir, test_dir, a, rep):
    ref, test = load(ref_dir), load(test_dir)
    if set(ref) != set(test):
        rep.fail(f"rank/attempt dumps differ: reference {sorted(ref)}, tested {sorted(test)}")
    for key in sorted(set(ref) & set(test)):
        where = f"{key[0]} attempt{key[1]}"
        rinfo, renv = ref[key]
        tinfo, tenv = test[key]
        for name in sorted(set(renv) | set(tenv)):
            rv, tv = val(renv, name), val(tenv, name)
            if name in DEPRECATED and tv is not None and os.environ.get(name) is None:
                rep.fail(f"{name}={tv!r} set by the tested launcher: deprecated since torch 2.2",
                         where)
                continue
            if name in IGNORED or rv == tv:
                continue
            if name == "MASTER_PORT":
                if a.standalone:
                    continue  # random on both sides; shape checked
                # static: each side must report the port it was given (checked by `check`)
                if a.ref_port is not None and a.test_port is not None:
                    continue
            elif name == "MASTER_ADDR" and a.standalone:
                if rv in LOOPBACK and tv in LOOPBACK:
                    rep.info(f"MASTER_ADDR={tv!r} (reference {rv!r}): both loopback", where)
                    continue
            elif name == "TORCHELASTIC_RUN_ID" and a.standalone:
                if rv and tv:
                    continue  # random uuid; shape checked
            elif name == "TORCHELASTIC_ERROR_FILE":
                if rv and tv:
                    continue  # temporary path; shape checked
            elif name in DEPRECATED:
                if tv is None and rv is not None and os.environ.get(name) is None:
                    rep.info(f"{name} not set (reference {rv!r}): deprecated since torch 2.2",
                             where)
                    continue
            elif name in VERSION_SPECIFIC and rv is None:
                # the tested launcher sets the other torch generation's variable
                caller = os.environ.get(name)
                allowed = {VERSION_SPECIFIC[name]} if caller is None else {caller}
                if tv in allowed:
                    rep.info(f"{name}={tv} set (reference torch does not set it; "
                             "the other torch generation does)", where)
                    continue
            elif name == AGENT_STORE and rv == "False" and tv == "True":
                if tinfo["master_listening"]:
                    rep.info(f"{AGENT_STORE}=True (reference False); "
                             "the launcher's store is listening at MASTER_ADDR:MASTER_PORT", where)
                    continue
            elif name.startswith(PRIVATE_PREFIXES) and rv is None:
                rep.info(f"launcher-private {name}={tv!r}", where)
                continue
            rep.fail(f"{name}: reference {rv!r}, tested {tv!r}", where)


def diff(a_dir, b_dir):
    a, b = load(a_dir), load(b_dir)
    names = {}
    for key in sorted(set(a) & set(b)):
        aenv, benv = a[key][1], b[key][1]
        for name in sorted(set(aenv) | set(benv)):
            av, bv = val(aenv, name), val(benv, name)
            if av != bv and name not in IGNORED:
                names.setdefault(name, []).append((key, av, bv))
    for name, rows in sorted(names.items()):
        key, av, bv = rows[0]
        more = f" (and {len(rows) - 1} more)" if len(rows) > 1 else ""
        print(f"  {name}: {av!r} vs {bv!r} at {key[0]} attempt{key[1]}{more}")
    if set(a) != set(b):
        print(f"  dumps: {sorted(a)} vs {sorted(b)}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["check", "compare", "diff"])
    p.add_argument("dirs", nargs="+")
    p.add_argument("--label", default="")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--attempts", type=int, default=1)
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--standalone", action="store_true")
    p.add_argument("--port", type=int)
    p.add_argument("--ref-port", type=int)
    p.add_argument("--test-port", type=int)
    a = p.parse_args()
    rep = Report(a.label or " ".join(a.dirs))
    if a.mode == "check":
        check(a.dirs[0], a, rep)
    elif a.mode == "compare":
        compare(a.dirs[0], a.dirs[1], a, rep)
    else:
        diff(a.dirs[0], a.dirs[1])
    rep.flush()
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
