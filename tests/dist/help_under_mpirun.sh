#!/usr/bin/env bash
# --help under mpirun: asked of every rank, the help is printed once and the job exits 0; asked of
# one rank of an MPMD launch, the job ends with one error naming both commands (exit 2). Before,
# a rank printed its help and left without joining MPI, and the other ranks waited for it in
# MPI_Init until killed. Usage: help_under_mpirun.sh "MPIRUN ARGS (the launcher and its options)" MOETRAIN
set -u
mpirun=$1
moetrain=$2
work=$(mktemp -d /tmp/moe-help-mpirun-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
fail=0
timeout 60 $mpirun -np 2 "$moetrain" train --help > all.out 2> all.err
status=$?
[ "$status" -eq 0 ] || { echo "FAIL: --help on both ranks exited $status"; cat all.out all.err; fail=1; }
[ "$(grep -c '^Usage: .*moetrain train' all.out)" -eq 1 ] || { echo "FAIL: the help is not printed once"; cat all.out; fail=1; }
timeout 60 $mpirun -np 1 "$moetrain" train --set run.device=cpu --set run.dir=run : -np 1 "$moetrain" train --help \
  > one.out 2> one.err
status=$?
[ "$status" -eq 2 ] || { echo "FAIL: --help on one rank exited $status (124: it hung)"; cat one.out one.err; fail=1; }
[ "$(grep -c '^error' one.err)" -eq 1 ] &&
  grep -q "rank 0 runs \`moetrain train\` but rank 1 runs \`moetrain train --help\`" one.err ||
  { echo "FAIL: no single error naming both commands"; cat one.err; fail=1; }
[ ! -e run ] || { echo "FAIL: rank 0 started training"; fail=1; }
exit $fail
