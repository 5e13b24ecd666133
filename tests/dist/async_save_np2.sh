#!/usr/bin/env bash
# train.async_save on 2 MPI ranks (ep 2): with each rank's writes held back by a test hook, so
# the steps after a save run while both files are written and the ranks find their writes done at
# different step boundaries, every checkpoint (both rank files and index.json) is byte for byte the
# foreground run's, the last one committed before exit. A write that fails on rank 1 only ends the
# job with the error naming rank 1 (every rank raises it), and leaves no checkpoint and no temp folder.
# Usage: async_save_np2.sh "MPIRUN ARGS (the launcher and its options)" MOETRAIN
set -u
mpirun=$1
moetrain=$2
work=$(mktemp -d /tmp/moe-async-save-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail=0
args=(train --steps 6 --save-every 3 --set parallel.ep=2 --set run.device=cpu)
timeout 120 $mpirun -np 2 "$moetrain" "${args[@]}" --set run.dir="$work/fg" > "$work/fg.log" 2>&1 ||
  { echo "FAIL: the foreground run"; cat "$work/fg.log"; exit 1; }
timeout 120 $mpirun -np 2 -x MOE_TEST_SLOW_BACKGROUND_SAVE=300 "$moetrain" "${args[@]}" --set train.async_save=true \
  --set run.dir="$work/bg" > "$work/bg.log" 2>&1 || { echo "FAIL: the background run"; cat "$work/bg.log"; exit 1; }
for step in step-000003 step-000006; do
  for f in rank-00000.safetensors rank-00001.safetensors index.json; do
    cmp -s "$work/fg/$step/$f" "$work/bg/$step/$f" || { echo "FAIL: $step/$f differs from the foreground run's"; fail=1; }
  done
done
[ "$(grep -c 'then written in the background' "$work/bg.log")" -eq 2 ] ||
  { echo "FAIL: not both checkpoints were written in the background"; cat "$work/bg.log"; fail=1; }

timeout 120 $mpirun -np 1 "$moetrain" "${args[@]}" --set train.async_save=true --set run.dir="$work/full" : \
  -np 1 env MOE_TEST_FAIL_BACKGROUND_SAVE=1 "$moetrain" "${args[@]}" --set train.async_save=true \
  --set run.dir="$work/full" > "$work/full.out" 2> "$work/full.err"
status=$?
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] || { echo "FAIL: a failed write on rank 1 exited $status"; fail=1; }
# Every rank fails with it alike (an AgreedError): one line, by rank 0, and no MPI_Abort banner.
[ "$(grep -c "^error: checkpoint step-000003 was not saved: rank 1's file, written in the background" \
  "$work/full.err")" -eq 1 ] || { echo "FAIL: rank 1's failed write was not reported once"; cat "$work/full.err"; fail=1; }
grep -q -e '^error (rank' -e 'MPI_ABORT' "$work/full.err" &&
  { echo "FAIL: an error every rank meets alike ended the job by MPI_Abort"; cat "$work/full.err"; fail=1; }
ls -A "$work/full" | grep -q -e '^step-' -e '^\.tmp-' && { echo "FAIL: a checkpoint or temp folder is left"; ls -A "$work/full"; fail=1; }
exit $fail
