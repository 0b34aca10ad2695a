#!/usr/bin/env bash
# The program under EXAMPLE in a section 3 man page compiles as printed and runs under ddprun
# (and, with --alone, also by itself, as a job of one, none of the torchrun variables set).
# Usage: test_man_example.sh [--alone] [--pkg-config DIR] PAGE DDPRUN CC BUILD_ROOT SOURCE_ROOT
#        ARGS...
# With --pkg-config, the flags come from `pkg-config --cflags --libs` of the page's library (the
# page's name: libddp.3 is libddp), as the page's build line has it, with PKG_CONFIG_PATH=DIR: the
# build's meson-uninstalled/, whose NAME-uninstalled.pc files pkg-config prefers, so the test
# checks the .pc files meson generates: those flags alone, with no run path of the test's own,
# give a program that finds the build tree's libraries at run time (LD_LIBRARY_PATH unset).
# Exit 77 (skipped) without pkg-config.
set -euo pipefail
pcdir= alone=
if [[ ${1:-} == --alone ]]; then
    alone=1
    shift
fi
if [[ ${1:-} == --pkg-config ]]; then
    pcdir=$2
    shift 2
    command -v pkg-config >/dev/null || { echo "SKIP: pkg-config not found"; exit 77; }
fi
page=$1 ddprun=$2 cc=$3 build=$4 src=$5
shift 5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The first .EX block of the EXAMPLE section, roff escapes (\-, \e, \&) undone.
sed -n '/^\.SH EXAMPLE/,/^\.SH SEE/p' "$page" | awk '/^\.EE/ { exit } on { print } /^\.EX/ { on = 1 }' |
    sed -e 's/\\-/-/g' -e 's/\\e/\\/g' -e 's/^\\&//' >"$tmp/example.c"
if [[ -n $pcdir ]]; then
    lib=$(basename "$page" .3)
    flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs "$lib")
    echo "pkg-config --cflags --libs $lib: $flags"
    unset LD_LIBRARY_PATH
else
    flags="-I$src/worker/libddp -I$src/libcollective -I$src/rendezvous -L$build/worker/libddp"
    flags+=" -L$build/libcollective -L$build/rendezvous -lddp -lcollective -lrendezvous"
    flags+=" -Wl,-rpath,$build/worker/libddp:$build/libcollective:$build/rendezvous"
fi
# EXAMPLE_CFLAGS: the build's sanitizers, so that the program links against its libraries.
# shellcheck disable=SC2086 # flags and EXAMPLE_CFLAGS are lists of words
$cc -std=c11 -Wall -Wextra -Werror ${EXAMPLE_CFLAGS:-} "$tmp/example.c" -o "$tmp/example" $flags
timeout 60 "$ddprun" --standalone --nproc-per-node 2 "$tmp/example" "$@"
if [[ -n $alone ]]; then
    echo "alone: $tmp/example $*"
    env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT -u LOCAL_RANK -u LOCAL_WORLD_SIZE \
        timeout 60 "$tmp/example" "$@"
fi
echo PASS
