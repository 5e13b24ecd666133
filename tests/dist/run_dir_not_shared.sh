#!/usr/bin/env bash
# Ranks that do not see one run.dir (node-local folders; here a relative run.dir under two working
# directories) are refused, naming the rank, before rank 0 moves or writes anything there: a fresh
# start leaves no run directory behind, and an --overwrite leaves the previous run where it was
# (it used to be moved into replaced/ and config.toml written before the check failed).
# Usage: run_dir_not_shared.sh "MPIRUN ARGS (the launcher and its options, no -np)" MOETRAIN
set -u
mpirun=$1
moetrain=$2
work=$(mktemp -d /tmp/moe-unshared-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/node0" "$work/node1"
fail=0
# two_nodes ARGS...: rank 0 in node0, rank 1 in node1, both with run.dir = run.
two_nodes() {
  timeout 60 $mpirun -np 1 --wdir "$work/node0" "$moetrain" "$@" --set run.dir=run : \
    -np 1 --wdir "$work/node1" "$moetrain" "$@" --set run.dir=run > /dev/null 2> "$work/err"
}
expect_refused() {  # NAME EXIT
  if [ "$2" != 1 ] || ! grep -q "^error: rank 1 does not see run.dir 'run' as rank 0 does" "$work/err"; then
    echo "FAIL: $1 (exit $2)"; cat "$work/err"; fail=1
  fi
}
two_nodes train --steps 2
expect_refused fresh $?
if [ -e "$work/node0/run" ] || [ -e "$work/node1/run" ]; then
  echo "FAIL: the refused fresh start left a run directory:"; find "$work" -path '*run*'; fail=1
fi
# A previous run in rank 0's folder, then an --overwrite start that is refused: untouched.
(cd "$work/node0" && "$moetrain" train --steps 2 --save-every 2 --set run.dir=run > /dev/null 2>&1) ||
  { echo "FAIL: could not train the previous run"; exit 1; }
before=$(cd "$work/node0/run" && find . | sort; md5sum config.toml metrics.jsonl)
two_nodes train --steps 2 --overwrite
expect_refused overwrite $?
after=$(cd "$work/node0/run" && find . | sort; md5sum config.toml metrics.jsonl)
if [ "$before" != "$after" ]; then
  echo "FAIL: the refused --overwrite changed the previous run:"; diff <(echo "$before") <(echo "$after"); fail=1
fi
[ $fail = 0 ] && echo "run_dir_not_shared: OK"
exit $fail
