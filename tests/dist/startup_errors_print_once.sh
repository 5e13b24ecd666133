#!/usr/bin/env bash
# Start-up errors every rank meets alike in the Trainer are printed once, by rank 0, with exit 1 and
# no MPI_Abort (comm/agreed_outcome.h): a missing data file, a --resume that does not resolve, a
# checkpoint whose index.json is damaged (resumed or initialized from), a checkpoint whose dense
# weights (which every rank reads) fail their checksum, an --init-from that does not
# exist, a model the checkpoint's weights do not fit (initialized from or resumed), a run.dir that
# already holds a run, `eval` of a missing --data file, a parallel.ep the ranks cannot hold, pipeline
# layouts they cannot run (pp, its chunks, the interleaved schedule's microbatch groups, a
# parallel.lease_slots too small for one stage), and
# run.device = "cuda" on a machine without a GPU, a config that one rank's memory cannot hold,
# ranks that opened different token data (train data, eval.sets, eval --data), and a command-line
# output only one rank's folder already holds.
# Usage: startup_errors_print_once.sh "MPIRUN ARGS (the launcher and its options)" MOETRAIN
set -u
mpirun=$1
moetrain=$2
work=$(mktemp -d /tmp/moe-startup-errors-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail=0
$moetrain train --steps 2 --save-every 2 --set run.dir="$work/ckpt" > "$work/ckpt.log" 2>&1 ||
  { echo "FAIL: could not write the checkpoint"; cat "$work/ckpt.log"; exit 1; }
cp -r "$work/ckpt" "$work/damaged"
echo "{" > "$work/damaged/step-000002/index.json"
# flip_byte FILE TENSOR: one byte of the tensor's first chunk in that rank file flipped.
flip_byte() {
  python3 - "$1" "$2" <<'EOF'
import json, struct, sys
path, name = sys.argv[1], sys.argv[2]
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    key = next(k for k in header if k.split("@")[0] == name)
    at = 8 + n + header[key]["data_offsets"][0] + 5
    f.seek(at)
    b = f.read(1)
    f.seek(at)
    f.write(bytes([b[0] ^ 0xFF]))
EOF
}
# One byte of the embedding (a dense weight every rank reads at resume) flipped.
cp -r "$work/ckpt" "$work/corrupt"
flip_byte "$work/corrupt/step-000002/rank-00000.safetensors" model.embed_tokens.weight
# One byte of an expert only rank 1 holds under parallel.ep = 2 (saved by a 2-rank run).
$mpirun "$moetrain" train --steps 2 --save-every 2 --set parallel.ep=2 --set run.dir="$work/ep2" > "$work/ep2.log" 2>&1 ||
  { echo "FAIL: could not write the 2-rank checkpoint"; cat "$work/ep2.log"; exit 1; }
flip_byte "$work/ep2/step-000002/rank-00001.safetensors" model.layers.0.mlp.experts.down_proj

# expect NAME EXPECTED-LINE-START -- COMMAND ARGS...: exit 1, one "error" line that starts so, no abort.
expect() {
  local name=$1 line=$2
  shift 3
  timeout 60 $mpirun "$moetrain" "$@" > /dev/null 2> "$work/$name.err"
  local status=$?
  if [ "$status" != 1 ] || [ "$(grep -c '^error' "$work/$name.err")" != 1 ] ||
    ! grep -q "^error: $line" "$work/$name.err" || grep -q MPI_ABORT "$work/$name.err"; then
    echo "FAIL: $name (exit $status)"; cat "$work/$name.err"; fail=1
  fi
}
expect data 'data.path = "/no/such/tokens.bin" does not exist' -- train --steps 4 --set data.path=/no/such/tokens.bin --set run.dir="$work/a"
expect resume 'cannot resolve checkpoint /no/such/checkpoint' -- train --steps 4 --resume /no/such/checkpoint --set run.dir="$work/b"
expect damaged-resume "$work/damaged/step-000002/index.json is not valid JSON" -- train --steps 4 --resume latest --set run.dir="$work/damaged"
expect corrupt-chunk "checkpoint $work/corrupt/step-000002: rank file rank-00000.safetensors, tensor 'model.embed_tokens.weight' .*checksum mismatch" -- \
  train --steps 4 --resume latest --set run.dir="$work/corrupt"
# Read by rank 1 alone: one error too, naming the rank (it was each rank's line under the abort banner).
expect corrupt-one-rank "rank 1: checkpoint $work/ep2/step-000002: rank file rank-00001.safetensors, tensor 'model.layers.0.mlp.experts.down_proj' .*checksum mismatch" -- \
  train --steps 4 --resume latest --set parallel.ep=2 --set run.dir="$work/ep2"
expect corrupt-init-from "rank 1: checkpoint $work/ep2/step-000002: rank file rank-00001.safetensors, tensor 'model.layers.0.mlp.experts.down_proj' .*checksum mismatch" -- \
  train --steps 4 --init-from "$work/ep2" --set parallel.ep=2 --set run.dir="$work/q"
expect init-from '--init-from /no/such/run: no such file or directory' -- train --steps 4 --init-from /no/such/run --set run.dir="$work/c"
expect damaged-init "$work/damaged/step-000002/index.json is not valid JSON" -- train --steps 4 --init-from "$work/damaged" --set run.dir="$work/d"
expect architecture "--init-from: model.hidden_size is 128 in this run.s config but 64" -- train --steps 4 --init-from "$work/ckpt" --set model.hidden_size=128 --set run.dir="$work/e"
expect other-model "cannot load $work/ckpt/step-000002 into this run: the model config differs" -- train --steps 4 \
  --resume "$work/ckpt" --set model.hidden_size=128 --set run.dir="$work/f"
expect run-dir-held "run.dir '$work/ckpt' already holds a run" -- train --steps 4 --set run.dir="$work/ckpt"
expect eval-data '--data = "/no/such/tokens.bin" does not exist' -- eval --checkpoint "$work/ckpt" --data /no/such/tokens.bin
expect ep 'parallel.ep = 3 does not divide the 2 ranks' -- train --steps 4 --set parallel.ep=3 --set run.dir="$work/g"
# Pipeline layouts the ranks cannot run: every stage used to meet these while building its part.
expect pp 'parallel.pp = 3 does not divide the 2 ranks' -- train --steps 4 --set model.num_hidden_layers=4 --set parallel.pp=3 \
  --set run.dir="$work/j"
expect pp-chunks 'parallel.pp = 2 x parallel.pp_virtual = 3 = 6 pipeline chunks need at least one layer each' -- \
  train --steps 4 --set parallel.pp=2 --set 'parallel.pp_schedule="interleaved"' --set parallel.pp_virtual=3 \
  --set run.dir="$work/k"
expect pp-groups 'parallel.pp_schedule = "interleaved" takes microbatches in groups of parallel.pp = 2' -- \
  train --steps 4 --set model.num_hidden_layers=4 --set parallel.pp=2 --set 'parallel.pp_schedule="interleaved"' \
  --set parallel.pp_virtual=2 --set train.global_batch_size=3 --set train.micro_batch_size=1 --set run.dir="$work/l"
# A lease_slots override too small for stage 0 only (1F1B keeps pp microbatches in flight there, 1
# on the last stage): every rank refuses it, where stage 0 alone used to, while building its model.
expect pp-lease-slots 'parallel.lease_slots = 1 is below the 2 microbatches the 1f1b schedule keeps in flight on pipeline stage 0' -- \
  train --steps 4 --set model.num_hidden_layers=4 --set parallel.pp=2 --set parallel.lease_slots=1 \
  --set train.global_batch_size=4 --set train.micro_batch_size=1 --set run.dir="$work/m"
# Without a usable GPU here (the build machines), run.device = "cuda" is every rank's error.
if ! nvidia-smi -L > /dev/null 2>&1; then
  expect no-gpu 'run.device = "cuda", but ' -- train --steps 4 --set 'run.device="cuda"' --set run.dir="$work/h"
fi
# Ranks with different free memory check the smallest (here rank 1 has 20 MiB, which the tiny run
# does not fit in): one error, naming it, however much rank 0 has.
one_rank=${mpirun/-np 2/-np 1}
args=(train --steps 4 --set run.dir="$work/i")
timeout 60 $one_rank "$moetrain" "${args[@]}" : -np 1 env MOE_TEST_MEMORY_MIB=20 "$moetrain" "${args[@]}" \
  > /dev/null 2> "$work/memory.err"
status=$?
if [ "$status" != 1 ] || [ "$(grep -c '^error' "$work/memory.err")" != 1 ] ||
  ! grep -q '^error: the run needs .* per rank on the CPU but 20.00 MiB can be planned' "$work/memory.err" ||
  grep -q MPI_ABORT "$work/memory.err"; then
  echo "FAIL: memory (exit $status)"; cat "$work/memory.err"; fail=1
fi
# Pipeline stages plan different bytes: a config neither fits is one error, naming the largest
# stage's plan as `moetrain plan` states it (each stage printed its own advice and total).
args=(train --steps 4 --set model.num_hidden_layers=4 --set parallel.pp=2 --set run.dir="$work/p")
timeout 60 $one_rank env OMP_NUM_THREADS=1 MOE_TEST_MEMORY_MIB=1 "$moetrain" "${args[@]}" : \
  -np 1 env OMP_NUM_THREADS=1 MOE_TEST_MEMORY_MIB=1 "$moetrain" "${args[@]}" > /dev/null 2> "$work/stages.err"
status=$?
planned=$(OMP_NUM_THREADS=1 "$moetrain" plan --device cpu --gpus 2 --gpu-memory 0.0009765625 \
  --set model.num_hidden_layers=4 --set parallel.pp=2 | grep -o 'the run needs [^ ]* [KMG]iB')
if [ "$status" != 1 ] || [ "$(grep -c '^error' "$work/stages.err")" != 1 ] || [ -z "$planned" ] ||
  ! grep -q "^error: $planned per rank" "$work/stages.err" || grep -q MPI_ABORT "$work/stages.err"; then
  echo "FAIL: stages memory (exit $status; plan: $planned)"; cat "$work/stages.err"; fail=1
fi
# Ranks that open different token data under the same command (here a relative data.path from two
# working directories, as node-local dataset copies that differ): one error, naming both.
for r in 0 1; do
  mkdir -p "$work/node$r"
  for i in $(seq 1 $((200 + 100 * r))); do echo "line $i of the text on node $r, long enough for a window"; done \
    > "$work/node$r/text.txt"
  $moetrain prepare "$work/node$r/text.txt" --out "$work/node$r/data" > /dev/null 2>&1 ||
    { echo "FAIL: prepare for node $r"; fail=1; }
done
args=(train --steps 4 --set data.path=data --set run.dir="$work/m")
timeout 60 $one_rank -wdir "$work/node0" "$moetrain" "${args[@]}" : -np 1 -wdir "$work/node1" "$moetrain" "${args[@]}" \
  > /dev/null 2> "$work/data.err"
status=$?
if [ "$status" != 1 ] || [ "$(grep -c '^error' "$work/data.err")" != 1 ] ||
  ! grep -q '^error: the ranks opened different token data: rank 0 read 1 token file of .*, rank 1 1 token file of' \
    "$work/data.err" || grep -q MPI_ABORT "$work/data.err"; then
  echo "FAIL: different data (exit $status)"; cat "$work/data.err"; fail=1
fi
# Copies that differ only in their tokens (same file names and token counts; "node 0" / "node 1" in
# the text) were not told apart (only the listing was compared): the train data, a named
# validation set, and eval's --data (never compared before).
for r in 0 1; do
  mkdir -p "$work/same$r"
  for i in $(seq 1 200); do echo "line $i of the text on node $r, long enough for a window"; done > "$work/same$r/text.txt"
  $moetrain prepare "$work/same$r/text.txt" --out "$work/same$r/data" > /dev/null 2>&1 ||
    { echo "FAIL: prepare for copy $r"; fail=1; }
done
cmp -s "$work/same0/data/text.npy" "$work/same1/data/text.npy" && { echo "FAIL: the copies do not differ"; fail=1; }
[ "$(stat -c %s "$work/same0/data/text.npy")" = "$(stat -c %s "$work/same1/data/text.npy")" ] ||
  { echo "FAIL: the copies differ in size"; fail=1; }
# two_copies NAME EXPECTED-LINE-START ARGS...: rank 0 in same0, rank 1 in same1.
two_copies() {
  local name=$1 line=$2
  shift 2
  timeout 60 $one_rank -wdir "$work/same0" "$moetrain" "$@" : -np 1 -wdir "$work/same1" "$moetrain" "$@" \
    > /dev/null 2> "$work/$name.err"
  local status=$?
  if [ "$status" != 1 ] || [ "$(grep -c '^error' "$work/$name.err")" != 1 ] ||
    ! grep -q "^error: $line" "$work/$name.err" || grep -q MPI_ABORT "$work/$name.err"; then
    echo "FAIL: $name (exit $status)"; cat "$work/$name.err"; fail=1
  fi
}
two_copies same_size_data 'the ranks opened different token data: rank 0 read 1 token file of [0-9]* tokens' \
  train --steps 4 --set data.path=data --set run.dir="$work/n"
two_copies same_size_eval_set 'the ranks opened different token data for eval.sets\[0\]: rank 0 read 1 token file' \
  train --steps 4 --set data.path="$work/same0/data" --set run.dir="$work/o" --set 'eval.sets=[{name="v",path="data"}]'
two_copies same_size_eval_data 'the ranks opened different --data files: rank 0 read 1 token file' \
  eval --checkpoint "$work/ckpt" --data data
# A command-line output only one rank's folder already holds (eval --logits, relative, from two
# working directories): one error naming that rank, no abort (it was that rank's line under the
# abort banner), and the other rank writes nothing.
mkdir -p "$work/out0" "$work/out1"
touch "$work/out1/l.npy"
timeout 60 $one_rank -wdir "$work/out0" "$moetrain" eval --checkpoint "$work/ckpt" --data synthetic --logits l.npy : \
  -np 1 -wdir "$work/out1" "$moetrain" eval --checkpoint "$work/ckpt" --data synthetic --logits l.npy \
  > /dev/null 2> "$work/logits.err"
status=$?
if [ "$status" != 1 ] || [ "$(grep -c '^error' "$work/logits.err")" != 1 ] ||
  ! grep -q '^error: rank 1: eval --logits l.npy exists' "$work/logits.err" || grep -q MPI_ABORT "$work/logits.err" ||
  [ -e "$work/out0/l.npy" ]; then
  echo "FAIL: an existing --logits on one rank (exit $status)"; cat "$work/logits.err"; fail=1
fi
for d in a b c d e f g h i j k l m n o p q; do [ -e "$work/$d" ] && { echo "FAIL: run.dir $d was created"; fail=1; }; done
exit $fail
