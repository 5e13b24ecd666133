#!/usr/bin/env bash
# A job whose token folder is held by a prepare (or tokenize_hf.py) adding files waits for it and
# says so once, on rank 0: every rank used to print the same "waiting for a prepare" line.
# Usage: folder_wait_notice_once.sh "MPIRUN ARGS (the launcher and its options, no -np)" MOETRAIN
set -u
mpirun=$1
moetrain=$2
work=$(mktemp -d /tmp/moe-wait-XXXXXX)
trap 'rm -rf "$work"' EXIT
head -c 20000 /dev/urandom | base64 > "$work/text.txt"
"$moetrain" prepare "$work/text.txt" --out "$work/data" > /dev/null 2>&1 || { echo "FAIL: prepare"; exit 1; }
# Hold the folder's lock as a prepare --append does (exclusive) from before the job starts until a
# notice shows that the job waits for it (or 60 s), then 1 s more for a second rank's notice.
: > "$work/err"
flock -x "$work/data" bash -c "for i in \$(seq 600); do grep -q waiting '$work/err' && break; sleep 0.1; done; sleep 1" &
holder=$!
sleep 0.5
timeout 120 $mpirun -np 2 "$moetrain" train --steps 1 --set data.path="$work/data" --set run.dir="$work/run" \
  --set run.save_final=false > /dev/null 2>> "$work/err"
rc=$?
wait $holder
lines=$(grep -c "waiting for a prepare or tokenize_hf.py adding files to $work/data to finish" "$work/err")
if [ $rc != 0 ] || [ "$lines" != 1 ]; then
  echo "FAIL: exit $rc, $lines wait notices (want 0 and 1):"; cat "$work/err"; exit 1
fi
echo "folder_wait_notice_once: OK"
