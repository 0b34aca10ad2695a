#!/usr/bin/env bash
# Checks that coll-bench's --help and its man page document the same long options: every long
# option --help prints appears in the man page and every long option the man page mentions
# (outside its examples) is one --help prints. --help comes from the option table in
# bench/coll/coll-bench.c, so this keeps the man page in step with the parser.
#
# Usage: test_coll_bench_help.sh COLL_BENCH_BINARY MAN_PAGE
# Exit: 0 pass, 1 fail.
set -euo pipefail

BIN=${1:?usage: test_coll_bench_help.sh COLL_BENCH_BINARY MAN_PAGE}
MAN=${2:?usage: test_coll_bench_help.sh COLL_BENCH_BINARY MAN_PAGE}

[[ -x $BIN ]] || { echo "FAIL: $BIN is not an executable" >&2; exit 1; }
[[ -r $MAN ]] || { echo "FAIL: cannot read $MAN" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Long options: two dashes, then a letter, then letters, digits, '-' and '_'.
extract() {
    grep -oE -- '--[A-Za-z][A-Za-z0-9_-]*' | sed 's/-*$//' | LC_ALL=C sort -u
}

status=0
"$BIN" --help >"$tmp/help.txt" || status=$?
if [[ $status -ne 0 ]]; then
    echo "FAIL: $BIN --help exited with $status" >&2
    exit 1
fi
extract <"$tmp/help.txt" >"$tmp/help"

# The man page's source, with roff's escaped minus (\-) read as '-' and font changes dropped;
# example blocks (.EX to .EE) hold ddprun's options too and are left out.
sed -e '/^\.EX/,/^\.EE/d' -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' -e 's/\\f(..//g' "$MAN" |
    extract >"$tmp/man"

n_help=$(wc -l <"$tmp/help")
if [[ $n_help -lt 10 ]]; then
    echo "FAIL: only $n_help long options in --help; is it the right binary?" >&2
    exit 1
fi

fails=0
missing=$(LC_ALL=C comm -23 "$tmp/help" "$tmp/man")
extra=$(LC_ALL=C comm -13 "$tmp/help" "$tmp/man")
if [[ -n $missing ]]; then
    echo "FAIL: in --help but not in $MAN:" >&2
    printf '  %s\n' $missing >&2
    fails=1
fi
if [[ -n $extra ]]; then
    echo "FAIL: in $MAN but not in --help:" >&2
    printf '  %s\n' $extra >&2
    fails=1
fi

# Short options too: "-x, --long" in --help against "\fB-x\fI ..., \fB--long" or ".BR -x ", " --long".
grep -oE -- '^  -[A-Za-z], --[A-Za-z0-9-]+' "$tmp/help.txt" | sed 's/^  //' | LC_ALL=C sort >"$tmp/hshort"
sed -e '/^\.EX/,/^\.EE/d' -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' -e 's/"//g' "$MAN" |
    grep -oE -- '-[A-Za-z]( [A-Z0-9|.]+)? *, *--[A-Za-z0-9-]+' |
    sed -E 's/^(-[A-Za-z])[^-]*(--.*)$/\1, \2/' | LC_ALL=C sort -u >"$tmp/mshort"
if ! diff -u "$tmp/hshort" "$tmp/mshort" >"$tmp/short.diff"; then
    echo "FAIL: short options differ between --help (-) and $MAN (+):" >&2
    cat "$tmp/short.diff" >&2
    fails=1
fi
if [[ $fails -ne 0 ]]; then
    exit 1
fi
echo "PASS: $n_help long options, the same in --help and $MAN"
