#!/usr/bin/env bash
# ddp-train end to end, briefly: short runs on Fashion-MNIST alone and on two ranks under
# ddprun, their metrics and dumps, and the failures a user meets first (missing or malformed
# data files named, a global batch the ranks do not divide, bad options) with the exit codes
# ddp-train(1) documents, and the choice of OpenBLAS's kernels. A few seconds in all.
#
# The losses of the world-1 and world-2 runs are compared: the global batch of a step is the
# same whatever the world size (data.h), so they differ only by the order in which floats are
# summed (the allreduce, the split of the batch's rows), which after 20 SGD steps stays far
# below the tolerance of 1e-4 relative.
#
# Usage: test_ddp_train.sh DDPRUN DDP_TRAIN
# Exit: 0 pass, 1 fail, 77 skipped (Fashion-MNIST is not installed).
set -euo pipefail

DDPRUN=${1:?usage: test_ddp_train.sh DDPRUN DDP_TRAIN}
TRAIN=${2:?usage: test_ddp_train.sh DDPRUN DDP_TRAIN}
DATA=/usr/share/datasets/fashion-mnist
if [[ ! -r $DATA/train-images-idx3-ubyte.gz ]]; then
    echo "SKIP: $DATA (Debian's dataset-fashion-mnist) is not installed"
    exit 77
fi

. "$(dirname "$0")/../launcher/lib.sh" # $tmp, fail, ok

# expect_exit CODE PATTERN CMD...: CMD exits with CODE and its stderr matches PATTERN.
expect_exit() {
    local want=$1 pattern=$2
    shift 2
    local status=0
    "$@" >"$tmp/out" 2>"$tmp/err" || status=$?
    if [[ $status -ne $want ]]; then
        fail "$* exited with $status, expected $want"
        sed 's/^/    /' "$tmp/err" >&2
    elif ! grep -qE -- "$pattern" "$tmp/err"; then
        fail "$*: stderr lacks /$pattern/"
        sed 's/^/    /' "$tmp/err" >&2
    fi
}

# Usage and data errors: exit 2, the flag or the file named.
expect_exit 2 "--zero: expected an integer from 0 to 3" "$TRAIN" --zero 4
expect_exit 2 "unknown option '--bogus'" "$TRAIN" --bogus
expect_exit 2 "--optimizer: unknown optimizer 'adam' \\(sgd, adamw, lion\\)" "$TRAIN" --optimizer adam
# --model picks a row of the model table (worker/trainer/model.h), mlp the default: a bad name
# is an error naming --model and the rows, and another row's options are not this one's.
expect_exit 2 "^ddp-train: --model: unknown model 'nope' \(mlp, gpt\)$" "$TRAIN" --model nope
expect_exit 2 "^ddp-train: --model: unknown model 'nope' \(mlp, gpt\)$" "$TRAIN" --model=nope --hidden 8
"$TRAIN" --help | grep -qx "  mlp (default)" || fail "--help lacks the model table's mlp row"
expect_exit 2 "$tmp/none/train-images-idx3-ubyte: cannot open" "$TRAIN" --data "$tmp/none"
mkdir "$tmp/bad"
cp "$DATA"/* "$tmp/bad/"
head -c 1000 "$DATA/t10k-images-idx3-ubyte.gz" >"$tmp/bad/t10k-images-idx3-ubyte.gz"
expect_exit 2 "$tmp/bad/t10k-images-idx3-ubyte.gz: truncated" "$TRAIN" --data "$tmp/bad"
printf 'not an IDX file at all' >"$tmp/bad/t10k-images-idx3-ubyte.gz"
expect_exit 2 "$tmp/bad/t10k-images-idx3-ubyte.gz: not an IDX file" "$TRAIN" --data "$tmp/bad"
expect_exit 2 "global batch \(255\) must be a multiple of world size x --grad-accum \(2 x 1" \
    "$DDPRUN" --standalone --nproc-per-node 2 --no-prefix "$TRAIN" --global-batch 255
# ...and the error names the nearest settings that work: the default global batch on 6 ranks,
# --grad-accum and --micro-batch that the ranks' share does not divide.
expect_exit 2 "global batch \(256\) must be a multiple of world size x --grad-accum \(6 x 1 = 6\); nearest that work: --global-batch 252 or 258; a world size of 4 or 8$" \
    "$DDPRUN" --standalone --nproc-per-node 6 --no-prefix "$TRAIN"
expect_exit 2 "\(4 x 3 = 12\); nearest that work: --global-batch 252 or 264; --grad-accum 2 or 4$" \
    "$DDPRUN" --standalone --nproc-per-node 4 --no-prefix "$TRAIN" --grad-accum 3
expect_exit 2 "--micro-batch 24: .*\(2 x 24 = 48\); nearest that work: --global-batch 240 or 288; --micro-batch 16 or 32$" \
    "$DDPRUN" --standalone --nproc-per-node 2 --no-prefix "$TRAIN" --micro-batch 24

# The device (ddp-train(1), GPUS), with every GPU hidden so that it goes alike with or without
# CUDA or a GPU: --device cuda is an error naming the flag, and so is --backend nccl without a
# GPU, decided for the whole job: on two ranks both exit 2 and rank 0 alone names the first rank
# without one; auto trains on the CPU (below, the first line names OpenBLAS's kernels).
expect_exit 2 "--device: unknown device 'gpu'" "$TRAIN" --device gpu
expect_exit 2 "--device cuda: (no CUDA device is visible|ddp-train was built without CUDA)" \
    env CUDA_VISIBLE_DEVICES= "$TRAIN" --device cuda
expect_exit 2 "--backend nccl needs --device cuda" "$TRAIN" --device cpu --backend nccl
expect_exit 2 "^ddp-train: --backend nccl: rank 0 has no GPU; use --backend auto or cpu$" \
    env CUDA_VISIBLE_DEVICES= "$TRAIN" --backend nccl
expect_exit 2 "rank 0 has no GPU" env CUDA_VISIBLE_DEVICES= "$DDPRUN" --standalone \
    --nproc-per-node 2 --no-prefix "$TRAIN" --backend nccl
[[ $(grep -c "^ddp-train: .*backend nccl" "$tmp/err") -eq 1 ]] || # (the failure table quotes it too)
    fail "--backend nccl without a GPU on two ranks: not one message"

# Lion, libddp's third optimizer, named by --optimizer: 20 steps on two ranks learn something.
expect_exit 0 "ZeRO-1, lion: test accuracy [1-9][0-9]\\." "$DDPRUN" --standalone --nproc-per-node 2 \
    --no-prefix "$TRAIN" --device cpu --max-steps 20 --optimizer lion --lr 3e-4 --warmup 0 \
    --zero 1

# Alone, then two ranks, on the host: 20 SGD steps, a loss every 5, metrics as JSON Lines (alone
# naming --model mlp, the two ranks taking it by default), each record with its time, elapsed
# time, attempt and world size; the file of an earlier run is emptied by a run from scratch.
common=(--device cpu --max-steps 20 --log-every 5 --optimizer sgd --lr 0.05 --warmup 0)
echo '{"an earlier run": 1}' >"$tmp/w1.jsonl" # a run from scratch replaces it
expect_exit 0 "test accuracy" "$TRAIN" "${common[@]}" --metrics "$tmp/w1.jsonl" \
    --dump-init "$tmp/init.safetensors" --dump-batches "$tmp/batches.safetensors" --model mlp
expect_exit 0 "test accuracy" "$DDPRUN" --standalone --nproc-per-node 2 "$TRAIN" \
    "${common[@]}" --grad-accum 2 --metrics "$tmp/w2.jsonl"

python3 - "$tmp" <<'EOF' || fail "metrics or dumps"
import json, struct, sys, time
tmp = sys.argv[1]

def records(path):
    return [json.loads(line) for line in open(path)]

w1, w2 = records(f"{tmp}/w1.jsonl"), records(f"{tmp}/w2.jsonl")
for recs, world in ((w1, 1), (w2, 2)):
    steps = [r["step"] for r in recs if "loss" in r]
    assert steps == [5, 10, 15, 20], (world, steps)
    assert recs[0]["start"] == "fresh" and recs[0]["step"] == 0, recs[0]
    for r in recs:
        assert list(r)[:4] == ["time", "elapsed", "attempt", "world"], r
        assert r["attempt"] == 0 and r["world"] == world and r["elapsed"] >= 0, r
        if "loss" in r:
            assert set(r) == {"time", "elapsed", "attempt", "world", "step", "epoch", "loss",
                              "lr", "grad_norm", "samples_per_s", "rss_bytes"}, r
    times = [r["time"] for r in recs]
    assert times == sorted(times) and abs(times[-1] - time.time()) < 600, times
    ev = [r for r in recs if "test_accuracy" in r and "summary" not in r]
    assert len(ev) == 1 and ev[0]["step"] == 20 and 0.5 < ev[0]["test_accuracy"] <= 1, ev
    s = recs[-1]
    assert s["summary"] == "done" and s["world"] == world and s["steps"] == 20, s
    assert s["memory"]["model_state_bytes"] > 0, s
l1 = [r["loss"] for r in w1 if "loss" in r]
l2 = [r["loss"] for r in w2 if "loss" in r]
worst = max(abs(a - b) / abs(a) for a, b in zip(l1, l2))
print(f"losses, world 1: {l1}\nlosses, world 2 x 2 micro-steps: {l2}\nmax relative difference {worst:.2e}")
assert worst < 1e-4, worst

def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        size = 8 + n + max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__")
        f.seek(0, 2)
        assert f.tell() == size, (path, f.tell(), size)
    return h

h = header(f"{tmp}/init.safetensors")
assert h["fc1.weight"]["shape"] == [512, 784] and h["fc3.bias"]["shape"] == [10], h
h = header(f"{tmp}/batches.safetensors")
assert h["x"]["shape"] == [20, 256, 784] and h["index"]["dtype"] == "I32", h
assert h["lr"]["shape"] == [20] and h["label"]["dtype"] == "U8", h
EOF

# OpenBLAS's kernels: the first line names them; a user's OPENBLAS_CORETYPE is kept, and where
# OpenBLAS falls back to Prescott on a CPU with AVX2, ddp-train picks a faster set (mlp.h). On
# the CPU: --device cpu, then --device auto with every GPU hidden.
OPENBLAS_CORETYPE=Haswell "$TRAIN" --device cpu --max-steps 1 --epochs 1 2>"$tmp/err" >/dev/null ||
    fail "ddp-train under OPENBLAS_CORETYPE=Haswell exited with $?"
grep -q "; OpenBLAS Haswell kernels$" "$tmp/err" || fail "the first line does not name Haswell"
CUDA_VISIBLE_DEVICES= "$TRAIN" --max-steps 1 --epochs 1 2>"$tmp/err" >/dev/null ||
    fail "ddp-train exited with $?"
grep -q "; OpenBLAS [A-Za-z0-9]* kernels$" "$tmp/err" ||
    fail "--device auto with every GPU hidden: the first line names no OpenBLAS kernels"
if grep -qw avx2 /proc/cpuinfo && grep -q "; OpenBLAS Prescott kernels$" "$tmp/err"; then
    fail "OpenBLAS runs its Prescott kernels on a CPU with AVX2"
fi

if [[ $fails -ne 0 ]]; then
    echo "FAIL: $fails check(s)" >&2
    exit 1
fi
echo "PASS"
