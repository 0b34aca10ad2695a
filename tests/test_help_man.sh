#!/usr/bin/env bash
# Checks that a program's --help and its man page document the same long options: every long
# option --help prints appears in the man page, and every long option the man page mentions is
# one --help prints. The programs print --help from the option table their parser uses, so this
# keeps the man pages in step with the parsers (ddprun: launcher/options_table.c; coll-bench:
# bench/coll/coll-bench.c).
#
# Usage: test_help_man.sh BINARY MAN_PAGE [OPTION...]
#   OPTION: a long option --help must print (ddprun: both spellings, --nproc-per-node and
#   --nproc_per_node), or --short: also compare the "-x, --long" pairs.
# Exit: 0 pass, 1 fail.
set -euo pipefail

BIN=${1:?usage: test_help_man.sh BINARY MAN_PAGE [OPTION...]}
MAN=${2:?usage: test_help_man.sh BINARY MAN_PAGE [OPTION...]}
shift 2
short=0
required=()
for a in "$@"; do
    if [[ $a == --short ]]; then short=1; else required+=("$a"); fi
done

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

# The man page's source, with roff's escaped minus (\-) read as '-' and font changes dropped.
# Example blocks (.EX to .EE) are left out: they hold other programs' options too.
sed -e '/^\.EX/,/^\.EE/d' -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' -e 's/\\f(..//g' "$MAN" |
    extract >"$tmp/man"

n_help=$(wc -l <"$tmp/help")
if [[ $n_help -lt 10 ]]; then
    echo "FAIL: only $n_help long options in --help; is it the right binary?" >&2
    exit 1
fi
for opt in "${required[@]}"; do
    if ! grep -qx -- "$opt" "$tmp/help"; then
        echo "FAIL: --help lacks $opt" >&2
        exit 1
    fi
done

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

# Short options: "-x, --long" in --help against "\fB-x\fI ..., \fB--long" or ".BR -x ", " --long".
if [[ $short -eq 1 ]]; then
    grep -oE -- '^  -[A-Za-z], --[A-Za-z0-9-]+' "$tmp/help.txt" | sed 's/^  //' |
        LC_ALL=C sort >"$tmp/hshort"
    sed -e '/^\.EX/,/^\.EE/d' -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' -e 's/"//g' "$MAN" |
        grep -oE -- '-[A-Za-z]( [A-Z0-9|.]+)? *, *--[A-Za-z0-9-]+' |
        sed -E 's/^(-[A-Za-z])[^-]*(--.*)$/\1, \2/' | LC_ALL=C sort -u >"$tmp/mshort"
    if ! diff -u "$tmp/hshort" "$tmp/mshort" >"$tmp/short.diff"; then
        echo "FAIL: short options differ between --help (-) and $MAN (+):" >&2
        cat "$tmp/short.diff" >&2
        fails=1
    fi
fi
if [[ $fails -ne 0 ]]; then
    exit 1
fi
echo "PASS: $n_help long options, the same in --help and $MAN"
