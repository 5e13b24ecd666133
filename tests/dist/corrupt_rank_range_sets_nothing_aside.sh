#!/usr/bin/env bash
# A 2-rank resume from a checkpoint whose range only rank 1 reads is corrupt: the job ends with
# rank 1's checksum error before rank 0 claims run.dir, so nothing is set aside or rewritten (the
# newer checkpoint stays where --resume latest finds it, config.toml is unchanged, no lock is left).
# Before the ranks agreed on their loads, rank 0 moved step-000004 into abandoned/ first.
# Usage: corrupt_rank_range_sets_nothing_aside.sh "MPIRUN ARGS..." MOETRAIN
set -u
mpirun=$1
moetrain=$2
work=$(mktemp -d /tmp/moe-corrupt-range-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
sets=(--set run.device=cpu --set parallel.ep=2 --set train.micro_batch_size=2 --set train.global_batch_size=4
      --set train.eval_every=0 --set train.log_every=1 --set run.dir=run)
$mpirun "$moetrain" train "${sets[@]}" --steps 4 --save-every 2 > train.out 2>&1 || { cat train.out; exit 1; }
test -d run/step-000002 && test -d run/step-000004 || { echo "expected step-000002 and step-000004"; ls run; exit 1; }
cp run/config.toml config.before
# The last byte of rank 1's file is data only rank 1 reads back under the same topology (its
# expert slices and moment shard): flip it.
python3 - run/step-000002/rank-00001.safetensors <<'PY'
import sys
path = sys.argv[1]
with open(path, "r+b") as f:
    f.seek(-1, 2)
    b = f.read(1)[0]
    f.seek(-1, 2)
    f.write(bytes([b ^ 0x5a]))
PY
$mpirun "$moetrain" train "${sets[@]}" --steps 6 --resume run/step-000002 > resume.out 2> resume.err
status=$?
cat resume.out resume.err
fail=0
[ "$status" -ne 0 ] || { echo "FAIL: the resume from a corrupt checkpoint exited 0"; fail=1; }
grep -q "checksum" resume.err || { echo "FAIL: no checksum error in stderr"; fail=1; }
grep -q "moved what came after" resume.out && { echo "FAIL: rank 0 set checkpoints aside"; fail=1; }
[ -d run/step-000004 ] || { echo "FAIL: step-000004 is no longer in run/"; fail=1; }
[ ! -e run/abandoned ] || { echo "FAIL: run/abandoned exists"; ls -R run/abandoned; fail=1; }
[ ! -e run/.lock ] || { echo "FAIL: run/.lock was left"; fail=1; }
cmp -s config.before run/config.toml || { echo "FAIL: run/config.toml was rewritten"; fail=1; }
exit $fail
