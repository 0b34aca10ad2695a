#!/usr/bin/env bash
# ddp_model_get_params() and the gradients' semantics that libddp(3), SEMANTICS, states, end to
# end: ddp-ckpt-check under ddprun (tests/libddp/ddp-ckpt-check.c says what each scenario checks).
#  1. grads, worlds 2-4, every stage: gradients averaged over ranks and summed over
#     micro-steps, a second ddp_grad_buffer() in a micro-step is the same buffer and keeps what
#     was added, a micro-step after a synchronising one is refused;
#  2. params, worlds 1-4, stages 0-3 (and stage 2 at bf16), AdamW: the full parameters and
#     optimizer state, to every rank and to each root, identical on every rank, equal to the
#     units' gathered parameters, to stage 0's (printed: the largest difference); then each
#     checkpoint of that state, exported by `ddp-ckpt export --optimizer`, holds exactly rank 0's
#     copy, tensor by tensor, bit for bit (names and order from the manifest).
# Usage: run_params.sh DDPRUN DDP_CKPT_CHECK DDP_CKPT
set -uo pipefail
DDPRUN=${1:?usage}; CHECK=${2:?usage}; CKPT=${3:?usage}
. "$(dirname "$0")/lib.sh"
need_python

# 1.
for n in 2 3 4; do ckpt_check grads "$n" "$tmp/grads$n"; done

# 2.
for n in 1 2 3 4; do
    ckpt_check params "$n" "$tmp/w$n"
    for state in "$tmp/w$n"/*.state; do
        [[ -e $state ]] || { fail "world $n: no copies written"; break; }
        ck=${state%.state}
        if ! "$CKPT" export "$ck" -o "$ck.safetensors" --optimizer >"$tmp/export.log" 2>&1; then
            fail "ddp-ckpt export $ck"
            cat "$tmp/export.log" >&2
            continue
        fi
        python3 - "$ck" <<'PY' || fail "world $n: $(basename "$ck"): the export is not the copy"
import glob, json, struct, sys
ck = sys.argv[1]
manifest = json.load(open(glob.glob(f"{ck}/step-*/manifest.json")[0]))
blob = open(f"{ck}.safetensors", "rb").read()
hlen = struct.unpack("<Q", blob[:8])[0]
header, data = json.loads(blob[8:8 + hlen]), blob[8 + hlen:]
copy = open(f"{ck}.state", "rb").read()
at, bad, n = 0, 0, 0
for s, state in enumerate(manifest["state"]):
    for p in manifest["params"]:
        name = p["name"] if s == 0 else f"{p['name']}.{state}"
        a, b = header[name]["data_offsets"]
        nbytes = 4 * p["count"]
        bad += data[a:b] != copy[at:at + nbytes]
        at, n = at + nbytes, n + 1
bad += at != len(copy)
print(f"  {ck.split('/')[-2]}/{ck.split('/')[-1]}: ddp-ckpt export --optimizer, {n} tensors "
      f"({', '.join(manifest['state'])}): {'identical to' if not bad else 'DIFFERENT from'} "
      f"rank 0's ddp_model_get_params() copy")
sys.exit(1 if bad else 0)
PY
    done
done

finish
