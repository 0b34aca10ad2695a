#!/usr/bin/env bash
# meson.build's NCCL version floor (2.14, the oldest with everything libcollective/nccl.cu
# uses): configures the source tree against a copy of the CUDA prefix whose nccl.h claims
# another version, and checks that an older NCCL turns the nccl backend off (-Dnccl=auto, with
# a warning) or fails the configuration (-Dnccl=enabled), that 2.14.3 and 3.0.0 are accepted,
# and that the installed NCCL is accepted with the version its nccl.h gives.
# The copy links CUDA_HOME's bin/, lib64/ and every include/ entry but nccl.h; only `meson
# setup` runs (about a second each), nothing is built.
# Usage: test_nccl_floor.sh MESON SOURCE_ROOT CUDA_HOME
# Exit: 0 pass, 1 fail, 77 skipped (no meson, nvcc or nccl.h under CUDA_HOME).
set -uo pipefail
[ $# = 3 ] || { echo "usage: $0 MESON SOURCE_ROOT CUDA_HOME"; exit 2; }
meson=$1 src=$2 cuda=$3
[ -x "$meson" ] || { echo "skip: no meson"; exit 77; }
[ -x "$cuda/bin/nvcc" ] && [ -f "$cuda/include/nccl.h" ] ||
    { echo "skip: no nvcc or nccl.h under $cuda"; exit 77; }
. "$(dirname "$0")/launcher/lib.sh"

fake=$tmp/cuda
mkdir -p "$fake/include"
for d in bin lib64 lib; do [ -e "$cuda/$d" ] && ln -s "$cuda/$d" "$fake/$d"; done
for e in "$cuda"/include/*; do [ "${e##*/}" = nccl.h ] || ln -s "$e" "$fake/include/"; done

# nccl_h MAJOR MINOR PATCH: the real nccl.h with that version ("" MAJOR: none defined).
nccl_h() {
    if [ -z "$1" ]; then
        grep -Ev '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$cuda/include/nccl.h"
    else
        sed -E -e "s/^#define NCCL_MAJOR .*/#define NCCL_MAJOR $1/" \
            -e "s/^#define NCCL_MINOR .*/#define NCCL_MINOR $2/" \
            -e "s/^#define NCCL_PATCH .*/#define NCCL_PATCH $3/" "$cuda/include/nccl.h"
    fi >"$fake/include/nccl.h"
}

# setup NAME PREFIX NCCL_MODE: configures into $tmp/NAME; the output in $tmp/NAME.log.
setup() {
    "$meson" setup "$tmp/$1" "$src" -Dcudatoolkit_dir="$2" -Dnccl="$3" -Dtests=disabled \
        >"$tmp/$1.log" 2>&1
}

# accepted NAME PREFIX VERSION: configures with -Dnccl=auto; wants the backend on at VERSION.
accepted() {
    if ! setup "$1" "$2" auto; then
        fail "$1: meson setup failed"; tail -5 "$tmp/$1.log"
    elif grep -q "Message: NCCL $3 (nccl.h): at least 2.14, the nccl backend is on" "$tmp/$1.log" &&
        grep -Eq "^ +NCCL +: $3\$" "$tmp/$1.log"; then
        ok "$1: NCCL $3 accepted"
    else
        fail "$1: NCCL $3 not accepted"; grep -iE 'nccl|warning' "$tmp/$1.log"
    fi
}

# refused NAME VERSION_SHOWN: with -Dnccl=auto the backend is off with a warning; with
# -Dnccl=enabled meson setup fails, naming the floor.
refused() {
    if ! setup "$1" "$fake" auto; then
        fail "$1: meson setup -Dnccl=auto failed"; tail -5 "$tmp/$1.log"
    elif grep -q "WARNING: $2.*older than 2.14.*the nccl backend is off" "$tmp/$1.log" &&
        grep -Eq '^ +NCCL +: False$' "$tmp/$1.log"; then
        ok "$1 auto: backend off: $(grep -o "WARNING: .*" "$tmp/$1.log")"
    else
        fail "$1 auto: the backend was not turned off"; grep -iE 'nccl|warning' "$tmp/$1.log"
    fi
    if setup "$1-enabled" "$fake" enabled; then
        fail "$1 enabled: meson setup succeeded"
    elif grep -q "ERROR: .*older than 2.14.*-Dnccl=enabled needs NCCL >= 2.14" "$tmp/$1-enabled.log"; then
        ok "$1 enabled: configuration fails"
    else
        fail "$1 enabled: failed without naming the floor"; tail -3 "$tmp/$1-enabled.log"
    fi
}

nccl_h 2 13 4
refused nccl-2.13.4 "NCCL 2.13.4 (nccl.h)"
nccl_h "" "" ""
refused nccl-1.x "nccl.h defines no NCCL_MAJOR"
nccl_h 2 14 3
accepted nccl-2.14.3 "$fake" 2.14.3
nccl_h 3 0 0
accepted nccl-3.0.0 "$fake" 3.0.0
v=$(printf '#include <nccl.h>\nNCCL_MAJOR.NCCL_MINOR.NCCL_PATCH\n' |
    ${CC:-cc} -E -P -I "$cuda/include" -x c - 2>/dev/null | tail -1 | tr -d ' ')
accepted installed "$cuda" "$v"
[ $fails = 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all passed"
