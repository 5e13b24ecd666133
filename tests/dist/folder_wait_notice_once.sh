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
# Hold the folder's lock as a prepare --append does (exclusive), for 3 s, from before the job starts.
flock -x "$work/data" sleep 3 &
holder=$!
sleep 0.5
timeout 120 $mpirun -np 2 "$moetrain" train --steps 1 --set data.path="$work/data" --set run.dir="$work/run" \
  --set run.save_final=false > /dev/null 2> "$work/err"
rc=$?
wait $holder
lines=$(grep -c "waiting for a prepare or tokenize_hf.py adding files to $work/data to finish" "$work/err")
if [ $rc != 0 ] || [ "$lines" != 1 ]; then
  echo "FAIL: exit $rc, $lines wait notices (want 0 and 1):"; cat "$work/err"; exit 1
fi
echo "folder_wait_notice_once: OK"
