#!/usr/bin/env bash
# Checks that each public header compiles on its own, as C99 or as C++11, with every warning an
# error: a translation unit that includes nothing but the header, twice (so the include guard
# is exercised too). The project itself is C11 with _GNU_SOURCE; the headers promise more, to
# users built otherwise.
#
# Usage: test_headers.sh c99|c++11 [-I DIR]... -- [--posix] HEADER...
#   The compiler is $CC (c99) or $CXX (c++11), split into words (it may be "ccache cc").
#   --posix: the next header needs POSIX (clock_gettime): that one is compiled with
#   -D_POSIX_C_SOURCE=200809L, the way its users must build. Other headers get strict ISO C.
# Exit: 0 pass, 1 fail, 77 skipped (c++11 without a C++ compiler).
set -euo pipefail

usage='usage: test_headers.sh c99|c++11 [-I DIR]... -- [--posix] HEADER...'
lang=${1:?$usage}
shift
incs=()
while [[ $# -gt 0 && $1 != -- ]]; do
    case $1 in
    -I) incs+=("-I$2"); shift 2 ;;
    *) echo "$usage" >&2; exit 1 ;;
    esac
done
[[ ${1:-} == -- ]] || { echo "$usage" >&2; exit 1; }
shift

case $lang in
c99)
    read -r -a compiler <<<"${CC:-cc}"
    flags=(-x c -std=c99 -pedantic-errors -Wall -Wextra -Werror -Wstrict-prototypes)
    ;;
c++11)
    if [[ -z ${CXX:-} ]]; then
        echo "SKIP: no C++ compiler (meson found none)"
        exit 77
    fi
    read -r -a compiler <<<"$CXX"
    flags=(-x c++ -std=c++11 -pedantic-errors -Wall -Wextra -Werror)
    ;;
*) echo "$usage" >&2; exit 1 ;;
esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fails=0
n=0
posix=0
for h in "$@"; do
    if [[ $h == --posix ]]; then
        posix=1
        continue
    fi
    extra=()
    if [[ $posix -eq 1 ]]; then
        extra=(-D_POSIX_C_SOURCE=200809L)
        posix=0
    fi
    name=$(basename "$h")
    printf '#include "%s"\n#include "%s"\n' "$name" "$name" >"$tmp/tu"
    if ! "${compiler[@]}" "${flags[@]}" "${extra[@]}" -I"$(dirname "$h")" "${incs[@]}" \
        -fsyntax-only "$tmp/tu" 2>"$tmp/err"; then
        echo "FAIL: $h does not compile alone as $lang (${compiler[*]} ${flags[*]} ${extra[*]}):"
        cat "$tmp/err"
        fails=$((fails + 1))
    fi
    n=$((n + 1))
done
if [[ $n -eq 0 ]]; then
    echo "$usage" >&2
    exit 1
fi
if [[ $fails -ne 0 ]]; then
    exit 1
fi
echo "PASS: $n headers compile alone as $lang (${compiler[*]} ${flags[*]})"
