#!/usr/bin/env python3
"""Launcher test worker: records the environment a launcher gave this rank.

    dump_env.py OUTDIR [--fail-attempt K]

Writes OUTDIR/rank<RANK>.attempt<TORCHELASTIC_RESTART_COUNT>.jsonl (RANK missing: "pid<pid>";
restart count missing: attempt "x") and exits 0. Does not import torch, so it runs under any
python 3 and starts fast.

--fail-attempt K drives --max-restarts: on attempt K every rank writes its dump (atomically,
by rename) and then looks at OUTDIR; a rank that finds the dumps of all WORLD_SIZE ranks of
attempt K exits 1, the others exit 0. At least the last rank to write fails, so the attempt
fails, yet no rank fails before every rank has written its dump: a launcher that stops the
group at the first failure cannot lose a dump, and nothing waits or sleeps.

JSON lines, one object each:

  {"kind": "info", "pid": .., "ppid": .., "parent_exe": .., "parent_env": true|false,
   "master_listening": true|false|null, "error_file_dir_exists": true|false|null,
   "error_file_exists": true|false|null, "argv": [..]}
  {"kind": "var", "name": NAME, "value": VALUE, "launcher_set": true|false}

A "var" line is written for every variable in RELEVANT or with a prefix in PREFIXES, and for
every variable that the launcher added or changed: one whose value differs from the launcher's
own environment as it was exec'd, read from /proc/<ppid>/environ ("launcher_set": true).
When the parent's environment cannot be read, parent_env is false and launcher_set is true
for every variable written. Variables the launcher removed are written with value null.

master_listening says whether a TCP connect to MASTER_ADDR:MASTER_PORT succeeded at start
(with TORCHELASTIC_USE_AGENT_STORE=True the launcher's store must already be there).
"""
import json
import os
import socket
import sys

RELEVANT = [
    "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
    "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
]
PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_", "PET_", "DDPRUN_")


def parent_environ(ppid):
    try:
        with open(f"/proc/{ppid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, _, v = item.partition(b"=")
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def master_listening():
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port or not port.isdigit():
        return None
    try:
        with socket.create_connection((addr, int(port)), timeout=5):
            return True
    except OSError:
        return False


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = sys.argv[1]
    fail_attempt = None
    if len(sys.argv) >= 4 and sys.argv[2] == "--fail-attempt":
        fail_attempt = sys.argv[3]

    env = dict(os.environ)
    ppid = os.getppid()
    penv = parent_environ(ppid)
    try:
        parent_exe = os.readlink(f"/proc/{ppid}/exe")
    except OSError:
        parent_exe = None

    names = set(n for n in RELEVANT if n in env)
    names.update(n for n in env if n.startswith(PREFIXES))
    if penv is not None:
        names.update(n for n in env if penv.get(n) != env[n])
        removed = [n for n in penv if n not in env]
    else:
        removed = []

    err = env.get("TORCHELASTIC_ERROR_FILE")
    info = {
        "kind": "info",
        "pid": os.getpid(),
        "ppid": ppid,
        "parent_exe": parent_exe,
        "parent_env": penv is not None,
        "master_listening": master_listening(),
        "error_file_dir_exists": os.path.isdir(os.path.dirname(err)) if err else None,
        "error_file_exists": os.path.exists(err) if err else None,
        "argv": sys.argv,
    }
    lines = [info]
    for n in sorted(names):
        lines.append({"kind": "var", "name": n, "value": env[n],
                      "launcher_set": penv is None or penv.get(n) != env[n]})
    for n in sorted(removed):
        lines.append({"kind": "var", "name": n, "value": None, "launcher_set": True})

    rank = env.get("RANK")
    tag = f"rank{rank}" if rank is not None and rank.isdigit() else f"pid{os.getpid()}"
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "x")
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, f"{tag}.attempt{attempt}.jsonl")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for line in lines:
            f.write(json.dumps(line, sort_keys=True) + "\n")
    os.replace(tmp, path)
    if fail_attempt is not None and attempt == fail_attempt:
        world = int(env.get("WORLD_SIZE", "1"))
        done = all(os.path.exists(os.path.join(outdir, f"rank{r}.attempt{attempt}.jsonl"))
                   for r in range(world))
        return 1 if done else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
