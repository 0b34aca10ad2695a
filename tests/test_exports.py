#!/usr/bin/env python3
"""Checks that a shared library exports exactly the functions its public header declares.

The exported set is what `nm -D --defined-only` lists for the library (functions and data
alike: a public header declares no variables, so any data symbol is a leak). The declared set
is every `<prefix>_name(` in the header once its comments are removed: a function declaration,
since the headers declare no function-like macros or function-pointer variables spelt that way
(a typedef of a function pointer reads `(*<prefix>_name)(`, which does not match).

Fails, naming them, on symbols exported but not declared (an internal `<prefix>__` function, a
helper of a static library) and on functions declared but not exported (not implemented, or
missing from the library's linker version script).

Usage: test_exports.py NM LIBRARY HEADER PREFIX [--pending NAME...]
  --pending: functions declared but not yet implemented, allowed to be missing until they land;
  one that is exported fails the test, so that the list is emptied as they arrive.
Exit: 0 pass, 1 fail, 77 skipped (no nm).
"""
import re
import subprocess
import sys


def declared(header, prefix):
    with open(header, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return set(re.findall(r"\b(%s_[A-Za-z0-9_]*)\s*\(" % re.escape(prefix), text))


def exported(nm, library):
    out = subprocess.run([nm, "-D", "--defined-only", library], check=True,
                         capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        # "value type name[@version]"; absolute symbols (type A) are version nodes, not code.
        if fields[-2] == "A":
            continue
        names.add(fields[-1].split("@")[0])
    return names


def main(argv):
    args = argv[1:]
    pending = set()
    if "--pending" in args:
        i = args.index("--pending")
        pending = set(args[i + 1:])
        args = args[:i]
    if len(args) != 4:
        print(__doc__.split("\n\n")[-1], file=sys.stderr)
        return 1
    nm, library, header, prefix = args
    if not nm:
        print("SKIP: no nm")
        return 77

    want = declared(header, prefix)
    have = exported(nm, library)
    if len(want) < 10:
        print(f"FAIL: only {len(want)} declarations found in {header}; is the parser wrong?")
        return 1

    fails = []
    leaked = sorted(have - want)
    missing = sorted(want - have - pending)
    arrived = sorted(pending & have)
    undeclared_pending = sorted(pending - want)
    if leaked:
        fails.append(f"exported by {library} but not declared in {header}:\n  " +
                     "\n  ".join(leaked))
    if missing:
        fails.append(f"declared in {header} but not exported by {library}:\n  " +
                     "\n  ".join(missing))
    if arrived:
        fails.append("exported now, so remove from the --pending list in tests/meson.build:\n  " +
                     "\n  ".join(arrived))
    if undeclared_pending:
        fails.append(f"in the --pending list but not declared in {header}:\n  " +
                     "\n  ".join(undeclared_pending))
    for f in fails:
        print("FAIL: " + f)
    if fails:
        return 1
    note = f" ({len(pending)} declared but pending: {', '.join(sorted(pending))})" if pending else ""
    print(f"PASS: {library} exports the {len(have)} functions {header} declares{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
