#!/usr/bin/env bash
# gpt_memory.sh: the model-state memory of ddp-train --model gpt per rank at ZeRO-0..3, measured
# against the ZeRO paper's formulas (issue 25, point 6).
#
#     bench/train/gpt_memory.sh [BUILD_DIR]       # BUILD_DIR defaults to ./build
#
# For each model (MODELS), rank count (NPROCS) and stage 0-3 it runs one optimizer step under
# `ddprun --standalone --nproc-per-node N` (global batch 8 on a small text, so that even the
# larger model takes seconds; ranks may outnumber cores: nothing is timed) and reads rank 0's
# summary record (--metrics): parameter, gradient and optimizer bytes, their sum (the model
# state) and the pools beside it (buckets, gather buffers). The formula, with Psi parameters
# and Nd ranks, is the ZeRO paper's (Rajbhandari et al. 2020, section 5) for what libddp keeps
# in f32 with AdamW: 4 Psi bytes of parameters, 4 Psi of gradients and K Psi = 8 Psi of
# optimizer state (m and v); stage 0 keeps all 16 Psi on every rank, stage 1 shards the
# optimizer state (4 + 4 + 8 / Nd), stage 2 the gradients too (4 + 12 / Nd), stage 3 the
# parameters too (16 / Nd). (The paper's mixed-precision figures are 2 + 2 + 12 with K = 12:
# f32 master weights counted with the optimizer state.)
#
# Settings (environment):
#   MODELS   models: "default" (ddp-train's: 4 layers, width 128, 4 heads, context 128) and/or
#            LxC (L blocks of width C, C / 64 heads (at least 1), context 128); default
#            "default 12x512"
#   NPROCS   rank counts (default "2 4")
#   DATA     the text (default /usr/share/games/fortunes/love: 20 kB, a short evaluation)
#   OUT      directory for the runs' logs (default: a new one under ${TMPDIR:-/tmp})
#
# Exit status: 0, 1 a run failed, 2 bad usage or missing programs.
set -euo pipefail

BUILD=${1:-build}
usage() { echo "gpt_memory.sh: $*" >&2; exit 2; }
MODELS=${MODELS:-"default 12x512"}
NPROCS=${NPROCS:-"2 4"}
DATA=${DATA:-/usr/share/games/fortunes/love}
ddprun=$BUILD/launcher/ddprun
trainer=$BUILD/worker/trainer/ddp-train
for p in "$ddprun" "$trainer"; do
    [[ -x $p ]] || usage "$p not found; build first (ninja -C $BUILD)"
done
[[ -r $DATA ]] || usage "DATA=$DATA: not readable"
for m in $MODELS; do
    [[ $m == default || $m =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || usage "MODELS: $m is not default or LxC"
done
for n in $NPROCS; do
    if ! [[ $n =~ ^[1-9][0-9]*$ ]] || ((8 % n != 0)); then
        usage "NPROCS: $n does not divide the batch of 8"
    fi
done
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/gpt-memory.XXXXXX")}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
echo "# gpt_memory.sh: MODELS='$MODELS', NPROCS='$NPROCS', DATA=$DATA; logs in $OUT" >&2

failed=0
: >"$OUT/runs.txt"
for m in $MODELS; do
    shape=()
    if [[ $m != default ]]; then
        c=${m#*x} h=$((${m#*x} / 64))
        shape=(--layers "${m%x*}" --width "$c" --heads "$((h > 0 ? h : 1))")
    fi
    for n in $NPROCS; do
        for z in 0 1 2 3; do
            k=$m.$n.$z
            echo "# $k" >&2
            if ! "$ddprun" --standalone --nproc-per-node "$n" --no-prefix "$trainer" --model gpt \
                --device cpu "${shape[@]}" --zero "$z" --global-batch 8 --max-steps 1 \
                --data "$DATA" --metrics "$OUT/$k.jsonl" >"$OUT/$k.out" 2>"$OUT/$k.err"; then
                echo "gpt_memory.sh: $k failed:" >&2
                tail -n 5 "$OUT/$k.err" >&2
                failed=1
                continue
            fi
            echo "$m $n $z" >>"$OUT/runs.txt"
        done
    done
done

python3 - "$OUT" <<'EOF'
import json, re, sys

out = sys.argv[1]
MiB = 1 << 20
# Bytes per parameter on each rank, f32 + AdamW: (parameters, gradients, optimizer state).
formula = {0: lambda n: (4, 4, 8), 1: lambda n: (4, 4, 8 / n), 2: lambda n: (4, 4 / n, 8 / n),
           3: lambda n: (4 / n, 4 / n, 8 / n)}
print("model state per rank (rank 0), MiB: measured by ddp-train (parameters + gradients + "
      "optimizer state) against the ZeRO paper's formula for f32 + AdamW, Psi parameters on Nd "
      "ranks: ZeRO-0 (4 + 4 + 8) Psi, ZeRO-1 (4 + 4 + 8/Nd) Psi, ZeRO-2 (4 + 12/Nd) Psi, "
      "ZeRO-3 16 Psi/Nd; pools: libddp's buffers beside the state (buckets, gathered units)\n")
hdr = ("model", "Psi", "Nd", "ZeRO", "params", "grads", "optim", "state", "formula",
       "meas/form", "pools")
fmt = "{:<16} {:>9} {:>3} {:>4} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>7}"
print(fmt.format(*hdr))
last = None
for line in open(f"{out}/runs.txt"):
    m, n, z = line.split()
    n, z = int(n), int(z)
    k = f"{m}.{n}.{z}"
    err = open(f"{out}/{k}.err").read()
    what = re.search(r"GPT (\d+) layers, width (\d+), (\d+) heads, context (\d+)", err)
    psi = int(re.search(r"\((\d+) parameters\)", err).group(1))
    s = next(json.loads(l) for l in open(f"{out}/{k}.jsonl") if '"summary"' in l)["memory"]
    form = sum(formula[z](n)) * psi
    name = "L%s C%s H%s T%s" % what.groups()
    if last and last != (m, n):
        print()
    last = (m, n)
    print(fmt.format(name, psi, n, z, *(f"{s[b] / MiB:.2f}" for b in ("param_bytes",
                     "grad_bytes", "optimizer_bytes", "model_state_bytes")),
                     f"{form / MiB:.2f}", f"{s['model_state_bytes'] / form:.3f}",
                     f"{s['pool_bytes'] / MiB:.2f}"))
EOF
exit $failed
