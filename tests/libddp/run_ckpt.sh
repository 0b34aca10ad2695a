#!/usr/bin/env bash
# libddp's checkpoints end to end, ddp-ckpt-check under ddprun (tests/libddp/ddp-ckpt-check.c says
# what each scenario checks):
#  1. resume: 2K steps straight against K, save, load into a new model, K more: identical shard
#     files (parameters and optimizer state), every stage, SGD with momentum and AdamW, worlds 2
#     and 3;
#  2. reshard: checkpoints saved at worlds 1-4 and every stage, each loaded at worlds 1-4 into
#     every stage: the parameters right after the load equal the saver's dump byte for byte, and
#     the optimizer state (the loaded model saved again, both checkpoints consolidated here)
#     equals the saver's (AdamW); Lion's state likewise, saved at worlds 1 and 3 and loaded at 2
#     and 4;
#  3. async: a save returns before its manifest exists, training goes on, the step's poll or
#     ddp_checkpoint_wait() completes it; keep;
#  4. bad: torn and malformed checkpoints skipped with a log line; a flipped byte, a truncated
#     shard, a missing one, another model, another optimizer: the same error on every rank;
#  5. fail: a save whose write fails on the last rank (EFBIG) or whose directory cannot be made
#     fails on every rank alike without breaking the model; its torn directory goes, the
#     previous complete checkpoint stays, the next save succeeds.
# Usage: run_ckpt.sh DDPRUN DDP_CKPT_CHECK
set -uo pipefail
DDPRUN=${1:?usage}; CHECK=${2:?usage}
. "$(dirname "$0")/lib.sh"
need_python

# 1.
for n in 2 3; do ckpt_check resume "$n" "$tmp/resume$n"; done
# 2.
compare_reshard() { # ROOT SAVER_WORLDS LOADER_WORLDS
python3 - "$@" <<'PY' || fail "reshard $1: the loaded state differs from the saved"
import array, json, os, sys
root = sys.argv[1]
savers = [int(w) for w in sys.argv[2].split()]
loaders = [int(w) for w in sys.argv[3].split()]
def consolidate(ckpt):
    """Every state array of a checkpoint, parameter by parameter, as the arena would hold it."""
    step = sorted(d for d in os.listdir(ckpt) if d.startswith("step-"))[-1]
    d = os.path.join(ckpt, step)
    mf = json.load(open(os.path.join(d, "manifest.json")))
    files = []
    for sh in mf["shards"]:
        a = array.array("f")
        a.frombytes(open(os.path.join(d, sh["file"]), "rb").read())
        files.append(a)
    out = {}
    st = mf["shard_total"]
    for s, name in enumerate(mf["state"]):
        vals = []
        for p in mf["params"]:
            g = mf["groups"][p["group"]]
            k0 = p["offset"] - g["offset"]
            for k in range(k0, k0 + p["count"]):
                q, i = divmod(k, g["shard"])
                vals.append(files[q][s * st + g["shard_offset"] + i])
        out[name] = array.array("f", vals).tobytes()
    return mf, out
bad = checked = 0
for n in savers:
    for s in range(4):
        saved = f"{root}/w{n}s{s}"
        smf, sstate = consolidate(saved)
        dump = open(saved + ".params", "rb").read()
        if dump != sstate["param"]:
            print(f"  {saved}: the saver's dump differs from its checkpoint"); bad += 1
        for m in loaders:
            for t in range(4):
                loaded = f"{saved}-w{m}t{t}"
                lmf, lstate = consolidate(loaded)
                checked += 1
                if open(loaded + ".params", "rb").read() != dump:
                    print(f"  w{n}s{s} -> w{m}t{t}: parameters after the load differ"); bad += 1
                elif lstate != sstate:
                    print(f"  w{n}s{s} -> w{m}t{t}: optimizer state differs"); bad += 1
                elif (lmf["step"], lmf["world_size"], lmf["zero_stage"]) != (smf["step"], m, t):
                    print(f"  w{n}s{s} -> w{m}t{t}: manifest {lmf['step']} {lmf['world_size']} {lmf['zero_stage']}"); bad += 1
print(f"  reshard: {checked} loads (worlds {savers} x stages 0-3 -> worlds {loaders} x stages "
      f"0-3): parameters and {smf['optimizer']['kind']} state identical in {checked - bad}")
sys.exit(1 if bad else 0)
PY
}
for n in 1 2 3 4; do ckpt_check save "$n" "$tmp/reshard"; done
for n in 1 2 3 4; do ckpt_check load "$n" "$tmp/reshard" 1 2 3 4; done
compare_reshard "$tmp/reshard" "1 2 3 4" "1 2 3 4"
for n in 1 3; do CKPT_CHECK_OPTIMIZER=lion ckpt_check save "$n" "$tmp/reshard-lion"; done
for n in 2 4; do CKPT_CHECK_OPTIMIZER=lion ckpt_check load "$n" "$tmp/reshard-lion" 1 3; done
compare_reshard "$tmp/reshard-lion" "1 3" "2 4"
# 3. and 4.
ckpt_check async 2 "$tmp/async"
for n in 1 3; do ckpt_check bad "$n" "$tmp/bad$n"; done
# 5.
for n in 1 2; do ckpt_check fail "$n" "$tmp/fail$n"; done

finish
