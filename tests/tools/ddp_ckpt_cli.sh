#!/usr/bin/env bash
# ddp-ckpt end to end (worker/tools/ddp-ckpt.c, ddp-ckpt(1)), on checkpoints ddp-train writes under
# ddprun at world size 2, ZeRO-2 (small buckets: several groups, in reverse arena order), and at
# world size 3, ZeRO-3 (units); a width of 99 gives groups of odd sizes, padded to the world:
#  1. inspect (text and --json): step, world size, stage, tensors and shapes as ddp-train
#     registered them; a root stands for its newest complete checkpoint, a torn one (no
#     manifest) is passed over with a line naming it, and inspecting it directly fails;
#  2. verify: intact, then a flipped byte, a truncated shard and a missing shard, each exit 1
#     with a line naming the file and what is wrong (the byte range of the bad chunk);
#  3. export: the consolidated parameters, loaded with the Python safetensors package (numpy,
#     and torch when importable), equal value for value to ddp-train's --dump-final of the same
#     run, its metadata describing the model and the input normalisation; --optimizer adds
#     NAME.exp_avg and NAME.exp_avg_sq of the same shapes; a damaged checkpoint is not exported;
#  4. import: a safetensors file (ddp-train's --dump-init, values changed) becomes a checkpoint
#     that exports back to the same tensors, and that ddp-train --init-from starts from (its
#     --dump-init after the load equals the file); F32 only, a malformed file (header length
#     beyond the file, offsets out of range) and names without a unit are refused, named;
#  5. usage errors (exit 2).
# Usage: ddp_ckpt_cli.sh DDPRUN DDP_TRAIN DDP_CKPT
# Exit: 0 pass, 1 fail, 77 skipped (no Fashion-MNIST, or no python3 with safetensors and numpy).
set -uo pipefail
DDPRUN=${1:?usage: ddp_ckpt_cli.sh DDPRUN DDP_TRAIN DDP_CKPT}
TRAIN=${2:?usage}
CKPT=${3:?usage}
DATA=/usr/share/datasets/fashion-mnist
if [[ ! -r $DATA/train-images-idx3-ubyte.gz ]]; then
    echo "SKIP: $DATA (Debian's dataset-fashion-mnist) is not installed"
    exit 77
fi
PY=$(command -v python3) || { echo "SKIP: no python3"; exit 77; }
if ! "$PY" -c 'import numpy, safetensors.numpy' 2>/dev/null; then
    echo "SKIP: $PY has no safetensors and numpy (.ci/install-deps installs them)"
    exit 77
fi
. "$(dirname "$0")/../launcher/lib.sh" # $tmp, fail, ok


common=(--device cpu --max-steps 6 --global-batch 96 --hidden 99 --warmup 2 --log-every 3 --timeout-ms 30000)
train() { # NAME WORLD ARGS...
    local name=$1 world=$2
    shift 2
    if ! timeout 120 "$DDPRUN" --standalone --nproc-per-node "$world" "$TRAIN" "${common[@]}" \
        "$@" >"$tmp/$name.log" 2>&1; then
        fail "ddp-train $name"
        tail -5 "$tmp/$name.log" >&2
        return 1
    fi
}
train z2 2 --zero 2 --bucket-mb 0.05 --checkpoint-dir "$tmp/z2" --checkpoint-every 3 \
    --dump-init "$tmp/z2-init.safetensors" --dump-final "$tmp/z2-final.safetensors" || exit 1
train z3 3 --zero 3 --checkpoint-dir "$tmp/z3" --checkpoint-every 6 \
    --dump-final "$tmp/z3-final.safetensors" || exit 1
step3=$tmp/z2/step-000000000003
step6=$tmp/z2/step-000000000006

# 1. inspect.
expect 0 "^zero stage   2" "$CKPT" inspect "$tmp/z2"
grep -q "^step         6 " "$tmp/out" && grep -q "^world size   2" "$tmp/out" &&
    grep -qE "^  fc1.weight +float32 +\(99, 784\) +77616" "$tmp/out" ||
    fail "inspect's text lacks step 6, world 2 or fc1.weight (99, 784)"
expect 0 "^step         3 " "$CKPT" inspect "$step3"
"$CKPT" inspect --json "$tmp/z2" >"$tmp/z2.json" || fail "inspect --json"
"$CKPT" inspect --json "$tmp/z3" >"$tmp/z3.json" || fail "inspect --json (z3)"
"$PY" - "$tmp" <<'PY' || fail "inspect --json's contents"
import json, sys
from safetensors.numpy import load_file
tmp = sys.argv[1]
init = load_file(f"{tmp}/z2-init.safetensors")
for name, world, stage in (("z2", 2, 2), ("z3", 3, 3)):
    j = json.load(open(f"{tmp}/{name}.json"))
    assert j["step"] == 6 and j["world_size"] == world and j["zero_stage"] == stage, j
    assert j["optimizer"]["kind"] == "adamw" and j["state"] == ["param", "exp_avg", "exp_avg_sq"]
    assert [t["name"] for t in j["tensors"]] == list(init), (j["tensors"], list(init))
    for t in j["tensors"]:
        assert tuple(t["shape"]) == init[t["name"]].shape and t["dtype"] == "float32", t
    assert j["elements"] == sum(a.size for a in init.values())
    assert len(j["shards"]) == world and j["bytes"] == sum(s["bytes"] for s in j["shards"])
    assert j["bytes"] == 3 * 4 * j["padded_elements"], j
    # Several groups (small buckets, or units), and odd sizes padded to the world size.
    assert j["groups"] >= 2 and j["padded_elements"] > j["elements"], j
print(f"ok: inspect --json: step, world, stage, optimizer and {len(init)} tensors as registered")
PY

# A torn checkpoint (a later step without its manifest) is passed over, named; alone, it fails.
cp -r "$step6" "$tmp/z2/step-000000000009"
rm "$tmp/z2/step-000000000009/manifest.json"
expect 0 "step-000000000009 skipped: no manifest" "$CKPT" inspect "$tmp/z2"
grep -q "^step         6 " "$tmp/out" || fail "inspect of the root did not take step 6"
expect 1 "step-000000000009: no manifest.json: the checkpoint is incomplete" \
    "$CKPT" inspect "$tmp/z2/step-000000000009"
expect 0 "step-000000000009: incomplete" "$CKPT" verify --all "$tmp/z2"
rm -r "$tmp/z2/step-000000000009"

# 2. verify, intact and damaged (each damage on a copy of step 6).
expect 0 "step-000000000006: step 6, 2 shard files, [0-9]+ bytes: intact" "$CKPT" verify "$tmp/z2"
expect 0 "step-000000000003: step 3, .*intact" "$CKPT" verify --all "$tmp/z2"
expect 0 "intact" "$CKPT" verify "$tmp/z3"
"$CKPT" verify --quiet --all "$tmp/z2" >"$tmp/out" 2>&1 && [[ ! -s $tmp/out ]] ||
    fail "verify --quiet of intact checkpoints printed something or failed: $(cat "$tmp/out")"
damaged() { # NAME: a fresh copy of step 6 under $tmp/NAME/
    rm -rf "$tmp/$1"
    mkdir -p "$tmp/$1"
    cp -r "$step6" "$tmp/$1/"
    echo "$tmp/$1/step-000000000006"
}
d=$(damaged flip)
"$PY" -c 'import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(1234); b = f.read(1); f.seek(1234); f.write(bytes([b[0] ^ 0xFF]))' \
    "$d/shard-00001-of-00002.bin"
expect 1 "shard-00001-of-00002.bin: CRC32C mismatch in bytes \[0, [0-9]+\)" "$CKPT" verify "$d"
grep -q "DAMAGED" "$tmp/out" || fail "verify's verdict is not DAMAGED"
expect 1 "shard-00001-of-00002.bin: CRC32C mismatch" "$CKPT" verify --quiet "$d"
expect 1 "shard-00001-of-00002.bin: CRC32C mismatch" "$CKPT" export "$d" -o "$tmp/bad.safetensors"
[[ ! -e $tmp/bad.safetensors ]] || fail "a damaged checkpoint was exported"
d=$(damaged trunc)
truncate -s -100 "$d/shard-00000-of-00002.bin"
expect 1 "shard-00000-of-00002.bin: [0-9]+ bytes, the manifest says [0-9]+ \(truncated\)" \
    "$CKPT" verify "$tmp/trunc"
d=$(damaged missing)
rm "$d/shard-00001-of-00002.bin"
expect 1 "shard-00001-of-00002.bin: missing \(shard 1 of 2\)" "$CKPT" verify "$d"
d=$(damaged manifest)
sed -i 's/"world_size": *2/"world_size": 5/' "$d/manifest.json"
expect 1 "manifest.json: " "$CKPT" verify "$d"

# 3. export, against ddp-train's own dump of the final parameters.
expect 0 "6 tensors of .*step-000000000006, step 6 \(world 2, stage 2\)" \
    "$CKPT" export "$tmp/z2" -o "$tmp/z2-export.safetensors"
expect 1 "exists \(--force replaces it\)" "$CKPT" export "$tmp/z2" -o "$tmp/z2-export.safetensors"
expect 0 "18 tensors" "$CKPT" export "$tmp/z2" -o "$tmp/z2-export.safetensors" --optimizer --force
mv "$tmp/z2-export.safetensors" "$tmp/z2-optim.safetensors"
expect 0 "6 tensors" "$CKPT" export "$tmp/z2" -o "$tmp/z2-export.safetensors"
expect 0 "6 tensors.*world 3, stage 3" "$CKPT" export "$tmp/z3" -o "$tmp/z3-export.safetensors"
expect 0 "6 tensors.*step 3" "$CKPT" export "$step3" -o "$tmp/z2-step3.safetensors"
"$PY" - "$tmp" <<'PY' || fail "export's values"
import sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file
tmp = sys.argv[1]
for run in ("z2", "z3"):
    ref, got = load_file(f"{tmp}/{run}-final.safetensors"), load_file(f"{tmp}/{run}-export.safetensors")
    assert list(got) == list(ref), (list(got), list(ref))
    for k in ref:
        assert got[k].dtype == np.float32 and got[k].shape == ref[k].shape, k
        assert np.array_equal(got[k], ref[k]), f"{run} {k}: max diff {np.abs(got[k] - ref[k]).max()}"
    print(f"ok: {run} export == ddp-train --dump-final, {sum(a.size for a in ref.values())} values")
with safe_open(f"{tmp}/z2-export.safetensors", "np") as f:
    m = f.metadata()
    assert m["step"] == "6" and m["world_size"] == "2" and m["zero_stage"] == "2", m
    # ddp-train's model and input normalisation, from the checkpoint's user state.
    assert m["model"] == "mlp" and m["layer_sizes"] == "784,99,99,10", m
    assert m["activation"] == "relu" and m["names"] == "ddp-train", m
    assert (m["input_divisor"], m["input_mean"], m["input_std"]) == ("255", "0.286", "0.353"), m
opt, ref = load_file(f"{tmp}/z2-optim.safetensors"), load_file(f"{tmp}/z2-final.safetensors")
assert list(opt) == [k + s for k in ref for s in ("", ".exp_avg", ".exp_avg_sq")], list(opt)
for k in ref:
    assert np.array_equal(opt[k], ref[k]) and opt[k + ".exp_avg"].shape == ref[k].shape
    assert (opt[k + ".exp_avg_sq"] >= 0).all() and (opt[k + ".exp_avg_sq"] > 0).any(), k
step3, final = load_file(f"{tmp}/z2-step3.safetensors"), ref
assert any(not np.array_equal(step3[k], final[k]) for k in ref), "step 3 equals step 6"
print("ok: --optimizer arrays named and shaped; step 3 differs from step 6")
try:
    import torch
    from safetensors.torch import load_file as tload
except ImportError:
    print("note: no torch; the PyTorch load is not checked")
else:
    t = tload(f"{tmp}/z2-export.safetensors")
    assert all(torch.equal(t[k], torch.from_numpy(ref[k])) for k in ref)
    print(f"ok: safetensors.torch loads the export (torch {torch.__version__})")
PY

# 4. import: ddp-train's initial weights, changed so that the seed cannot explain them.
"$PY" - "$tmp" <<'PY' || fail "making the import's input files"
import sys
import numpy as np
from safetensors.numpy import load_file, save_file
tmp = sys.argv[1]
init = load_file(f"{tmp}/z2-init.safetensors")
new = {k: (v * 0.5 + 0.01).astype(np.float32) for k, v in init.items()}
# ddp-train's order (safetensors' own writer sorts by name: written here in our order by hand).
import json, struct
def write(path, tensors, header_len=None, bad_offsets=False):
    hdr, off = {}, 0
    for i, (k, v) in enumerate(tensors.items()):
        end = off + v.nbytes
        beyond = 8 if bad_offsets and i == len(tensors) - 1 else 0  # the last one past the end
        hdr[k] = {"dtype": {"float32": "F32", "float16": "F16"}[str(v.dtype)],
                  "shape": list(v.shape), "data_offsets": [off + beyond, end + beyond]}
        off = end
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", header_len if header_len is not None else len(h)) + h)
        for v in tensors.values():
            f.write(v.tobytes())
write(f"{tmp}/new.safetensors", new)
write(f"{tmp}/badlen.safetensors", new, header_len=1 << 40)
write(f"{tmp}/badoff.safetensors", new, bad_offsets=True)
write(f"{tmp}/f16.safetensors", {"fc1.weight": np.zeros((2, 3), np.float16)})
write(f"{tmp}/nounit.safetensors", {"weight": np.zeros((2, 3), np.float32)})
PY
expect 0 "step-000000000000: 6 tensors in 3 units" "$CKPT" import "$tmp/new.safetensors" -o "$tmp/imp"
expect 1 "step-000000000000 exists \(--force replaces it\)" \
    "$CKPT" import "$tmp/new.safetensors" -o "$tmp/imp"
expect 0 "step-000000000042: 6 tensors" "$CKPT" import "$tmp/new.safetensors" -o "$tmp/imp" --step 42
expect 0 "^step         42 " "$CKPT" inspect "$tmp/imp"
grep -q "^world size   1" "$tmp/out" && grep -q "^zero stage   0" "$tmp/out" &&
    grep -q "^state        param$" "$tmp/out" || fail "import's checkpoint is not world 1, stage 0, params only"
expect 0 "intact" "$CKPT" verify --all "$tmp/imp"
[[ -z $(find "$tmp/imp" -name '.import-*') ]] || fail "import left its private directory"
expect 0 "6 tensors" "$CKPT" export "$tmp/imp" -o "$tmp/imp-export.safetensors"
# ddp-train starts from it, at another world size and stage: its --dump-init is the file.
train initfrom 2 --zero 3 --max-steps 1 --init-from "$tmp/imp/step-000000000000" \
    --dump-init "$tmp/initfrom.safetensors"
"$PY" - "$tmp" <<'PY' || fail "import round trip"
import sys
import numpy as np
from safetensors.numpy import load_file, save_file
tmp = sys.argv[1]
new = load_file(f"{tmp}/new.safetensors")
for other in ("imp-export", "initfrom"):
    got = load_file(f"{tmp}/{other}.safetensors")
    assert list(got) == list(new), (other, list(got))
    assert all(np.array_equal(got[k], new[k]) for k in new), other
print("ok: import -> export and import -> ddp-train --init-from give the file's tensors back")
save_file(new, f"{tmp}/sorted.safetensors")  # the package's own writer: its order, not ours
PY
# libddp matches parameters by name: a file in another order loads just the same.
expect 0 "6 tensors" "$CKPT" import "$tmp/sorted.safetensors" -o "$tmp/imp-sorted"
train initsorted 2 --zero 1 --max-steps 1 --init-from "$tmp/imp-sorted/step-000000000000" \
    --dump-init "$tmp/initsorted.safetensors"
"$PY" - "$tmp" <<'PY' || fail "import of a file in the safetensors package's order"
import sys
import numpy as np
from safetensors.numpy import load_file
tmp = sys.argv[1]
new, got = load_file(f"{tmp}/new.safetensors"), load_file(f"{tmp}/initsorted.safetensors")
assert sorted(got) == sorted(new) and all(np.array_equal(got[k], new[k]) for k in new)
print("ok: a file written by safetensors.numpy.save_file (name order) -> import -> --init-from")
PY
expect 1 "badlen.safetensors: header length 1099511627776 is beyond" \
    "$CKPT" import "$tmp/badlen.safetensors" -o "$tmp/bad"
expect 1 "badoff.safetensors: tensor 'fc3.bias': data_offsets \[[0-9]+, [0-9]+\) out of range" \
    "$CKPT" import "$tmp/badoff.safetensors" -o "$tmp/bad"
expect 1 "f16.safetensors: tensor 'fc1.weight' is F16; import takes F32 only" \
    "$CKPT" import "$tmp/f16.safetensors" -o "$tmp/bad"
expect 1 "nounit.safetensors: tensor 'weight': expected a name UNIT.PARAM" \
    "$CKPT" import "$tmp/nounit.safetensors" -o "$tmp/bad"
[[ ! -e $tmp/bad ]] || fail "a refused import created its root"

# 5. Usage.
expect 2 "export needs -o FILE" "$CKPT" export "$tmp/z2"
expect 2 "--json does not apply to 'verify'" "$CKPT" verify --json "$tmp/z2"
expect 2 "unknown command 'check'" "$CKPT" check "$tmp/z2"
expect 2 "--format: unknown format 'npz'" "$CKPT" export "$tmp/z2" -o x --format npz
expect 1 "no complete checkpoint" "$CKPT" inspect "$tmp"

if [[ $fails -ne 0 ]]; then
    echo "$fails failure(s)" >&2
    exit 1
fi
echo "PASS"
