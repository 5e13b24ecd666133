#!/usr/bin/env bash
# Runs on an H200 machine from the repo root, binaries in .devrun (as for device_check.sh): pipeline
# parallelism and the overlapped gradient reduction on GPUs. With one GPU the ranks share it: each gets its own NCCL_HOSTID, so NCCL
# treats them as separate hosts and moves the stages' messages over its socket transport on the
# loopback interface (NCCL refuses two ranks of one host on one GPU). That checks correctness; its
# throughput is not a pipeline's (two stages share one GPU, messages go through host sockets).
#   1. tests/dist/gpu_pipeline_test.cpp under mpirun with 2 and 4 ranks, and
#      tests/dist/gpu_overlap_grad_reduce_test.cpp (the overlapped reduction on GPUs) with 2;
#   2. `moetrain train` on bench-olmoe-4l (4 microbatches of 2 x 4096 tokens per step) with
#      pp = 1, pp = 2 (1F1B) and pp = 2 interleaved (2 chunks per rank), STEPS steps each: the
#      losses side by side and the largest relative difference from pp = 1, and the held-out loss
#      (train.eval_every = 4: evaluation through the stages) against pp = 1's;
#   3. a failing stage: pp = 2 on GPUs with rank 1 failing in step 2 (MOE_TEST_FAIL_ON_RANK) must
#      end the job with that rank's error and a non-zero exit within RUN_LIMIT_S, not hang in NCCL.
# PARTS (default "tests train fail") picks which of the three run; PRECISION (bf16, the default, or
# fp8) the runs' train.precision in 2 and 3.
set -uo pipefail
. bench/device_mpi_env.sh
out=${OUT:-/tmp}
steps=${STEPS:-8}
limit=${RUN_LIMIT_S:-240}  # per run: a hang ends as a failure, not as the call's time limit
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
parts=" ${PARTS:-tests train fail} "
for p in $parts; do
  case "$p" in tests|train|fail) ;; *) echo "PARTS: '$p' is not one of: tests train fail" >&2; exit 2 ;; esac
done
status=0
[[ $parts == *" tests "* ]] && for t in gpu_pipeline_test:2 gpu_pipeline_test:4 gpu_overlap_grad_reduce_test:2; do
  name=${t%:*} np=${t#*:}
  read -ra mpi <<< "$(mpi_launch "$np")"
  if timeout "$limit" "${mpi[@]}" ".devrun/bin/$name" > "$out/${name}_np$np.log" 2>&1; then r=PASS; else r=FAIL; status=1; fi
  echo "$name np $np: $r"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |relative L2" "$out/${name}_np$np.log" | sort | uniq
done
# Shared-GPU ranks: a host id per rank (mpirun's rank variable, read by a shell in each rank).
shared=()
[ "$gpus" -lt 2 ] && shared=(-x NCCL_SOCKET_IFNAME=lo -x NCCL_IB_DISABLE=1)
launch() {  # launch NP CMD...: CMD on NP ranks, each with its own NCCL host id where they share a GPU
  local np="$1"; shift
  read -ra mpi <<< "$(mpi_launch "$np")"
  if [ "$gpus" -lt "$np" ]; then
    timeout "$limit" "${mpi[@]}" "${shared[@]}" bash -c 'NCCL_HOSTID=moetrain-rank-$OMPI_COMM_WORLD_RANK exec "$@"' _ "$@"
  else
    timeout "$limit" "${mpi[@]}" "$@"
  fi
}
common=(--config configs/bench-olmoe-4l.toml --steps "$steps" --set train.micro_batch_size=2
        --set run.device='"cuda"' --set train.log_every=1 --set train.eval_every=4 --set train.eval_batches=2
        --set train.precision="\"${PRECISION:-bf16}\"")
run() {  # run NAME NP [--set ...]
  local name="$1" np="$2"; shift 2
  rm -rf "/tmp/pp-$name" "$out/pp_$name.metrics.jsonl"  # a run that writes none is not compared with an old file
  echo "== $name (np $np): $*"
  launch "$np" .devrun/bin/moetrain train "${common[@]}" --set run.dir="\"/tmp/pp-$name\"" "$@" \
    > "$out/pp_$name.log" 2>&1 || { status=1; tail -5 "$out/pp_$name.log"; }
  grep -E "^  (device|parallel|pipeline)|throughput|bubble|high-water" "$out/pp_$name.log" | head -8
  cp "/tmp/pp-$name/metrics.jsonl" "$out/pp_$name.metrics.jsonl" 2> /dev/null
}
if [[ $parts == *" fail "* ]]; then
  echo "== failing stage (np 2, pp = 2, rank 1 fails in step 2)"
  rm -rf /tmp/pp-fail
  t0=$(date +%s)
  export MOE_TEST_FAIL_ON_RANK=1
  launch 2 .devrun/bin/moetrain train "${common[@]}" --set parallel.pp=2 --set run.dir='"/tmp/pp-fail"' \
    > "$out/pp_fail.log" 2>&1
  rc=$?
  unset MOE_TEST_FAIL_ON_RANK
  echo "  exit $rc after $(( $(date +%s) - t0 )) s; $(grep -c 'error (rank 1): test hook MOE_TEST_FAIL_ON_RANK' "$out/pp_fail.log") line(s) with rank 1's error"
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || ! grep -q 'error (rank 1): test hook MOE_TEST_FAIL_ON_RANK' "$out/pp_fail.log"; then
    echo "  FAIL: expected rank 1's error and a non-zero exit before the time limit"; status=1
  else
    echo "  PASS"
  fi
fi
[[ $parts == *" train "* ]] || exit $status
run pp1 1
run pp2_1f1b 2 --set parallel.pp=2
run pp2_interleaved 2 --set parallel.pp=2 --set parallel.pp_schedule='"interleaved"' --set parallel.pp_virtual=2
python3 - "$out" pp1 pp2_1f1b pp2_interleaved <<'PY'
import json, sys
out, names = sys.argv[1], sys.argv[2:]
def losses(name, key):
    try:
        rows = [json.loads(l) for l in open(f"{out}/pp_{name}.metrics.jsonl")]
    except OSError:
        return []
    return [r[key] for r in rows if key in r]
for key in ("loss", "eval_loss"):
    ref = losses(names[0], key)
    for n in names:
        l = losses(n, key)
        worst = max((abs(a - b) / abs(b) for a, b in zip(l, ref)), default=float("nan"))
        print(f"{key:9s} {n:18s} " + " ".join(f"{v:.5f}" for v in l) + f"   max rel diff vs pp1 {worst:.2e}")
PY
exit $status
