#!/usr/bin/env bash
# The program under EXAMPLE in a section 3 man page compiles as printed and runs under ddprun.
# Usage: test_man_example.sh PAGE DDPRUN CC BUILD_ROOT SOURCE_ROOT ARGS...
set -euo pipefail
page=$1 ddprun=$2 cc=$3 build=$4 src=$5
shift 5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The first .EX block of the EXAMPLE section, roff escapes undone.
sed -n '/^\.SH EXAMPLE/,/^\.SH SEE/p' "$page" | awk '/^\.EE/ { exit } on { print } /^\.EX/ { on = 1 }' |
    sed -e 's/\\e/\\/g' -e 's/^\\&//' >"$tmp/example.c"
libs="$build/worker:$build/libcollective:$build/rendezvous"
# EXAMPLE_CFLAGS: the build's sanitizers, so that the program links against its libraries.
$cc -std=c11 -Wall -Wextra -Werror ${EXAMPLE_CFLAGS:-} -I"$src/worker" -I"$src/libcollective" -I"$src/rendezvous" \
    "$tmp/example.c" -o "$tmp/example" -L"$build/worker" -L"$build/libcollective" \
    -L"$build/rendezvous" -lddp -lcollective -lrendezvous -Wl,-rpath,"$libs"
timeout 60 "$ddprun" --standalone --nproc-per-node 2 "$tmp/example" "$@"
echo PASS
