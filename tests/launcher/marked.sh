# marked NAME=VALUE, for the tests that find a job's processes by a marker in their environment
# (tests/launcher/lib.sh sources it; so can a test with a preamble of its own).
# The live processes (zombies are gone) whose environment holds NAME=VALUE: a marker given to
# ddprun, which reaches every process of its job whatever its PID namespace.
marked() { # NAME=VALUE
  local e p st out=""
  for e in /proc/[0-9]*/environ; do
    grep -qzxF "$1" "$e" 2>/dev/null || continue
    p=${e#/proc/}; p=${p%/environ}
    st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) || continue
    [ "$st" = Z ] || out+="$p "
  done
  echo "$out"
}
