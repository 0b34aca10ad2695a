#!/usr/bin/python3
"""torchrun for Debian's torch 1.13 under Python 3.11.

torch 1.13's Std.from_str() finds the Std member for a digit by iterating over the IntFlag
class. From Python 3.11 on, iterating an IntFlag yields only its canonical single-bit members
(OUT, ERR), so NONE (0) and ALL (3) are never found and from_str("0") -- the default for
--redirects and --tee -- returns None; torchrun then fails before starting any worker.

This wrapper replaces that one classmethod with a parse that builds the member from its value
(Std(v)), which works on every Python, then runs torch.distributed.run's main() with the
command line unchanged:

    /usr/bin/python3 tests/launcher/torchrun113.py --nproc-per-node 4 script.py args...

torch 1.13's torchrun spells its options with underscores only (--nproc_per_node); torch 2.x
accepts --nproc-per-node too. So that one command line serves both, the wrapper also rewrites
hyphenated launcher options (those before the training script) to the underscore spelling.
Arguments after the training script are passed through untouched.
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api as _mp_api

_Std = _mp_api.Std
# A single digit 0-3 for every local rank, or "local_rank:digit" pairs separated by commas.
_ONE = re.compile(r"[0-3]")
_PAIRS = re.compile(r"\d+:[0-3](,\d+:[0-3])*")


def _std_from_str(cls, vm):
    text = vm.strip()
    if _ONE.fullmatch(text):
        return cls(int(text))
    if _PAIRS.fullmatch(text):
        out = {}
        for item in text.split(","):
            rank, value = item.split(":")
            out[int(rank)] = cls(int(value))
        return out
    raise ValueError(f"{vm!r}: expected a digit 0-3 or local_rank:digit pairs such as 0:3,1:0")


_Std.from_str = classmethod(_std_from_str)

# Launcher options that take no value; every other option takes one (as "--x v" or "--x=v").
_FLAGS = {"--standalone", "-m", "--module", "--no_python", "--run_path"}


def _underscore_options(args):
    out = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg == "-" or arg == "--":
            break  # the training script (or an explicit end of options): stop rewriting
        name, eq, value = arg.partition("=")
        if name.startswith("--"):
            name = "--" + name[2:].replace("-", "_")
        out.append(name + eq + value)
        i += 1
        if not eq and name not in _FLAGS and i < len(args):
            out.append(args[i])  # the option's value
            i += 1
    return out + args[i:]


if __name__ == "__main__":
    from torch.distributed.run import main

    sys.argv = ["torchrun"] + _underscore_options(sys.argv[1:])
    main()
