# shellcheck shell=bash disable=SC2034  # sets pyexe and version for the sourcing script
# Sourced by the launcher tests. probe_torch PYTHON CONDITION: exits 77 (skip) unless PYTHON
# exists and imports torch with torch.distributed satisfying the Python expression CONDITION
# (`d` is torch.distributed); otherwise sets pyexe (the real interpreter, not a pyenv shim, which
# would add PYENV_* and PATH to the launcher's environment and so to the workers') and version.
probe_torch() {
    local py=$1 cond=$2 info
    if ! command -v "$py" >/dev/null 2>&1; then
        echo "SKIP: $py not found"
        exit 77
    fi
    if ! info=$("$py" -c "import sys, torch, torch.distributed as d
assert $cond; print(sys.executable, torch.__version__)" 2>/dev/null) || [[ $info != *" "* ]]; then
        echo "SKIP: $py has no usable torch.distributed ($cond)"
        exit 77
    fi
    pyexe=${info% *}
    version=${info#* }
}
