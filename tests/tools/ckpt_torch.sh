#!/usr/bin/env bash
# A ddp-train checkpoint in PyTorch and back (ddp-ckpt(1), NAMES and METADATA), as a PyTorch user
# does it without reading a man page:
#  1. ddp-train on two ranks (ZeRO-2, 30 steps, its final checkpoint); ddp-ckpt export --names
#     torch; Python reads the file's metadata with the safetensors package (model, layer_sizes,
#     activation, input_divisor/mean/std), builds nn.Sequential from it, loads the file with
#     load_state_dict(strict=True), normalises the 10,000 test images as the metadata says and
#     gets ddp-train's own final evaluation (test loss and accuracy from --metrics); its logits on
#     a few images equal those of ddp-train's final parameters (--dump-final, fc names) computed
#     in float64 (max difference printed);
#  2. the module's state_dict (values changed), saved by safetensors.torch: ddp-ckpt import
#     without --names is refused (exit 1, naming 0.weight ..., suggesting --names torch, nothing
#     written); --names torch imports it, and ddp-train --init-from starts from exactly those
#     values (its --dump-init); --rename maps a prefixed file (model.0.weight) the same way;
#     --names any takes the names as they are.
# Usage: ckpt_torch.sh DDPRUN DDP_TRAIN DDP_CKPT
# Exit: 0 pass, 1 fail, 77 skipped (no Fashion-MNIST, or no python3 with torch and safetensors).
set -uo pipefail
DDPRUN=${1:?usage: ckpt_torch.sh DDPRUN DDP_TRAIN DDP_CKPT}
TRAIN=${2:?usage}
CKPT=${3:?usage}
. "$(dirname "$0")/../libddp/lib.sh" # $tmp, fail, ok, need_data, finish
need_data
PY=$(command -v python3) || { echo "SKIP: no python3"; exit 77; }
if ! "$PY" -c 'import torch, numpy, safetensors.torch' 2>/dev/null; then
    echo "SKIP: $PY has no torch, numpy and safetensors"
    exit 77
fi

expect_timeout=120
common=(--device cpu --hidden 48 --layers 2 --global-batch 128 --threads 1 --timeout-ms 30000)

# 1. Train, export, rebuild in PyTorch.
expect 0 "after 30 steps" "$DDPRUN" --standalone --nproc-per-node 2 --no-prefix "$TRAIN" \
    "${common[@]}" --zero 2 --max-steps 30 --checkpoint-dir "$tmp/ck" \
    --metrics "$tmp/metrics.jsonl" --dump-final "$tmp/final.safetensors" || finish
expect 0 "6 tensors of .*step-000000000030, step 30" \
    "$CKPT" export "$tmp/ck" --names torch -o "$tmp/torch.safetensors"
"$PY" - "$tmp" "$DATA" <<'PY' || fail "nn.Sequential from the export's metadata"
import gzip, json, sys
import numpy as np
import torch
from torch import nn
from safetensors import safe_open
from safetensors.torch import load_file
tmp, data = sys.argv[1], sys.argv[2]
with safe_open(f"{tmp}/torch.safetensors", "pt") as f:
    meta = f.metadata()
assert meta["model"] == "mlp" and meta["activation"] == "relu" and meta["names"] == "torch", meta
sizes = [int(s) for s in meta["layer_sizes"].split(",")]
assert sizes == [784, 48, 48, 10], sizes
act = {"relu": nn.ReLU}[meta["activation"]]
mods = []
for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
    mods += [nn.Linear(a, b)] + ([act()] if i < len(sizes) - 2 else [])
model = nn.Sequential(*mods)
model.load_state_dict(load_file(f"{tmp}/torch.safetensors"), strict=True)
with gzip.open(f"{data}/t10k-images-idx3-ubyte.gz") as f:
    px = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
with gzip.open(f"{data}/t10k-labels-idx1-ubyte.gz") as f:
    y = torch.from_numpy(np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64))
div, mean, std = (float(meta[k]) for k in ("input_divisor", "input_mean", "input_std"))
assert meta["input_shape"] == "28,28", meta["input_shape"]
x = (torch.from_numpy(px.astype(np.float32)) / div - mean) / std  # ToTensor(), Normalize()
with torch.no_grad():
    logits = model(x)
loss = nn.functional.cross_entropy(logits.double(), y).item()
acc = (logits.argmax(1) == y).double().mean().item()
evals = [json.loads(l) for l in open(f"{tmp}/metrics.jsonl") if "test_loss" in l]
ref = evals[-1]
print(f"  torch: test loss {loss:.6f}, accuracy {acc:.4f}; ddp-train: {ref['test_loss']:.6f}, "
      f"{ref['test_accuracy']:.4f}")
assert abs(loss - ref["test_loss"]) < 1e-5 * max(1, loss), (loss, ref)
assert abs(acc - ref["test_accuracy"]) <= 2e-4, (acc, ref)  # an image at a tie, at most two
# The logits of a few images against ddp-train's final parameters (fc names), in float64.
p = {k: v.double() for k, v in load_file(f"{tmp}/final.safetensors").items()}
h = x[:8].double()
for k in range(1, len(sizes)):
    h = h @ p[f"fc{k}.weight"].T + p[f"fc{k}.bias"]
    h = h.relu() if k < len(sizes) - 1 else h
diff = (logits[:8].double() - h).abs().max().item()
print(f"  logits of 8 test images: max |torch - ddp-train's parameters in f64| = {diff:.2e}")
assert diff < 1e-4, diff
# Part 2's input: the module's own state_dict, changed, saved by safetensors.torch.
from safetensors.torch import save_file
sd = {k: (v * 0.5 + 0.01).contiguous() for k, v in model.state_dict().items()}
save_file(sd, f"{tmp}/seq.safetensors")
save_file({"model." + k: v for k, v in sd.items()}, f"{tmp}/prefixed.safetensors")
print("ok: nn.Sequential built from the metadata loads the export (strict) and matches ddp-train")
PY

# 2. Import of nn.Sequential's names.
expect 1 "seq.safetensors: the tensors make no model ddp-train builds: '0\.(weight|bias)'" \
    "$CKPT" import "$tmp/seq.safetensors" -o "$tmp/imp"
grep -q -- "--names torch maps them" "$tmp/out" || fail "the refusal does not suggest --names torch"
[[ ! -e $tmp/imp ]] || fail "a refused import wrote $tmp/imp"
expect 0 "step-000000000000: 6 tensors in 3 units" \
    "$CKPT" import "$tmp/seq.safetensors" --names torch -o "$tmp/imp"
expect 0 "after 1 steps" "$DDPRUN" --standalone --nproc-per-node 2 --no-prefix "$TRAIN" \
    "${common[@]}" --zero 3 --max-steps 1 --init-from "$tmp/imp/step-000000000000" \
    --dump-init "$tmp/initfrom.safetensors"
expect 0 "6 tensors" "$CKPT" import "$tmp/prefixed.safetensors" --rename model= --names torch \
    -o "$tmp/imp-prefixed"
expect 0 "6 tensors" "$CKPT" export "$tmp/imp-prefixed" -o "$tmp/prefixed-back.safetensors" \
    --names torch --rename 0=model.0,2=model.2,4=model.4
expect 0 "6 tensors in 3 units" "$CKPT" import "$tmp/seq.safetensors" --names any -o "$tmp/any"
"$PY" - "$tmp" <<'PY' || fail "import --names torch -> ddp-train --init-from"
import sys
import torch
from safetensors.torch import load_file
tmp = sys.argv[1]
seq, got = load_file(f"{tmp}/seq.safetensors"), load_file(f"{tmp}/initfrom.safetensors")
for i, k in enumerate((0, 2, 4)):
    for p in ("weight", "bias"):
        assert torch.equal(got[f"fc{i + 1}.{p}"], seq[f"{k}.{p}"]), (k, p)
back = load_file(f"{tmp}/prefixed-back.safetensors")
assert sorted(back) == sorted("model." + k for k in seq), sorted(back)
assert all(torch.equal(back["model." + k], v) for k, v in seq.items())
print("ok: --names torch import -> ddp-train --init-from is the state_dict; --rename both ways")
PY
expect 2 "--rename: 'x' is not OLD=NEW" "$CKPT" import "$tmp/seq.safetensors" --rename x -o "$tmp/x"
expect 2 "--names: unknown naming 'keras'" "$CKPT" export "$tmp/ck" --names keras -o "$tmp/x"
expect 1 "--rename nope=x: no tensor is named 'nope'" \
    "$CKPT" export "$tmp/ck" --rename nope=x -o "$tmp/x"
expect 1 "--names torch: tensor 'fc1.weight' is not an nn.Sequential module's" \
    "$CKPT" import "$tmp/initfrom.safetensors" --names torch -o "$tmp/x"
[[ ! -e $tmp/x ]] || fail "a refused export or import wrote $tmp/x"
finish
