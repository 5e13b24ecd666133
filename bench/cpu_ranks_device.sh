#!/usr/bin/env bash
# Runs on the H200 machine (16 cores; check the load it prints) from the repo root, binaries in .devrun: the
# CPU-rank benchmarks that the 2-core build machine runs oversubscribed, with a core per rank:
#   bench/pipeline_bubble.sh        1F1B and interleaved, pp = 2 and pp = 4: bubble against theory
#   bench/overlap_grad_reduce_cpu.sh the reduction after the backward against the overlapped one
# (REPEATS=2), dp = 2, dp = 4 and dp 2 x ep 2. The CUDA build's moetrain runs them with
# run.device = "cpu" (the same CPU ops as the MOE_CUDA=OFF build).
set -uo pipefail
. bench/device_mpi_env.sh
echo "cores $(nproc), load $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
BIN=.devrun/bin/moetrain STEPS=${STEPS:-6} bash bench/pipeline_bubble.sh || status=1
BIN=.devrun/bin/moetrain REPEATS=${REPEATS:-2} bash bench/overlap_grad_reduce_cpu.sh || status=1
exit $status
