# Helpers of the elastic training tests (test_elastic_resume.sh, test_elastic_etcd.sh); source
# it after netns_lib.sh (bash). Each node's ddprun runs in the background with its pid in
# pids[NODE] and its output in $tmp/NAME.NODE.
#
#   finish NODES...   waits (200 s at most each) for those nodes' ddprun; their exit codes,
#                     each followed by a space, in $rcs.
#   accuracy NAME     the last test accuracy (a number) any node of job NAME printed.
finish() {
  local i
  rcs=""
  for i in "$@"; do
    timeout 200 tail --pid="${pids[$i]}" -f /dev/null
    wait "${pids[$i]}"
    rcs+="$? "
  done
}
accuracy() { cat "$tmp/$1".* | grep -o 'test accuracy [0-9.]*%' | tail -1 | grep -o '[0-9.]*'; }
