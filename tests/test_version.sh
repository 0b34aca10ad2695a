#!/usr/bin/env bash
# Checks that the version in meson.build's project() is the one every program prints and every
# man page carries. Programs take it from the generated version.h; the man pages' .TH lines
# ("ddprun X.Y.Z") are written by hand, so this is what tells a release to update them.
#
# Usage: test_version.sh VERSION PROGRAM... -- MAN_PAGE...
#   PROGRAM --version must print "<basename of PROGRAM> VERSION" as its first line.
# Exit: 0 pass, 1 fail.
set -euo pipefail

usage='usage: test_version.sh VERSION PROGRAM... -- MAN_PAGE...'
VERSION=${1:?$usage}
shift
progs=()
while [[ $# -gt 0 && $1 != -- ]]; do
    progs+=("$1")
    shift
done
[[ ${1:-} == -- ]] || { echo "$usage" >&2; exit 1; }
shift
mans=("$@")
[[ ${#progs[@]} -gt 0 && ${#mans[@]} -gt 0 ]] || { echo "$usage" >&2; exit 1; }

fails=0
for p in "${progs[@]}"; do
    want="$(basename "$p") $VERSION"
    status=0
    got=$("$p" --version 2>&1 | head -n 1) || status=$?
    if [[ $status -ne 0 || $got != "$want" ]]; then
        echo "FAIL: $p --version printed '$got' (exit $status), expected '$want'" >&2
        fails=1
    fi
done
for m in "${mans[@]}"; do
    th=$(grep -m 1 '^\.TH ' "$m" || true)
    if [[ $th != *"\"ddprun $VERSION\""* ]]; then
        echo "FAIL: $m: .TH line '$th' does not name \"ddprun $VERSION\"" >&2
        fails=1
    fi
done
if [[ $fails -ne 0 ]]; then
    exit 1
fi
echo "PASS: ${#progs[@]} programs and ${#mans[@]} man pages at version $VERSION"
