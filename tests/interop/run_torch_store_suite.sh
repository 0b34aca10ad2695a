#!/usr/bin/env bash
# PyTorch's own TCPStore tests (test/distributed/test_store.py) against ddp-rendezvous, directly
# or through a store proxy, by torch_store_suite.py (its docstring says how a master store is
# served by ours and which tests do not apply, and why).
#
# Usage: run_torch_store_suite.sh VAR PATH_TO_ddp-rendezvous PYTHON [PATH_TO_proxy_serve]
#
# VAR names the environment variable that holds the path of test_store.py from the PyTorch
# source of PYTHON's torch version: the repository holds no PyTorch code, and CI has no network,
# so the test is skipped (77) when VAR is unset. meson registers it as
#   torch-store-suite-torch2[-proxy]    TORCH_TEST_STORE_PY, the first python3 on PATH (torch 2.x)
#   torch-store-suite-torch113[-proxy]  TORCH113_TEST_STORE_PY, Debian's torch 1.13 at
#                                       /usr/bin/python3
# To run them, with a PyTorch checkout at the tag of each version and expecttest (which
# PyTorch's test helpers import) installed or on PYTHONPATH (`pip install expecttest`):
#   git -C pytorch show v2.X.Y:test/distributed/test_store.py >/tmp/test_store.py
#   git -C pytorch show v1.13.1:test/distributed/test_store.py >/tmp/test_store_113.py
#   TORCH_TEST_STORE_PY=/tmp/test_store.py TORCH113_TEST_STORE_PY=/tmp/test_store_113.py \
#     meson test -C build --suite interop --print-errorlogs 'torch-store-suite-*'
# Debian's source package of its torch (`apt-get source pytorch`) holds the 1.13 file too.
#
# Exit status: 0 pass, 1 fail, 77 skip (VAR unset, PYTHON missing or without torch.distributed
# or expecttest).

set -uo pipefail

if [[ $# -ne 3 && $# -ne 4 ]]; then
    echo "usage: $0 VAR PATH_TO_ddp-rendezvous PYTHON [PATH_TO_proxy_serve]" >&2
    exit 1
fi
var=$1 rdzv=$2 py=$3 proxy=${4:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

file=${!var:-}
if [[ -z $file ]]; then
    echo "SKIP: $var is not set (the path of PyTorch's test/distributed/test_store.py)"
    exit 77
fi
if [[ ! -f $file ]]; then
    echo "FAIL: $var=$file: no such file" >&2
    exit 1
fi
if ! command -v "$py" >/dev/null 2>&1; then
    echo "SKIP: $py not found"
    exit 77
fi

# PyTorch's tests take about 25 s here; the limit leaves room for a slow, shared machine.
timeout -k 5 240 "$py" "$here/torch_store_suite.py" ${proxy:+--proxy "$proxy"} "$rdzv" "$file"
rc=$?
((rc == 124 || rc == 137)) && echo "FAIL: timed out after 240 s" >&2
exit "$rc"
