#!/usr/bin/env bash
# Runs on the H200 machine from the repo root (binaries in .devrun, as for device_check.sh): the
# MoE-layer benchmark of issue 6 in one call: moetrain's layer (bench/moe_layer_bench.cpp) and
# the minimal PyTorch torch._grouped_mm layer (python/bench/torch_olmoe.py --moe-layer-only),
# forward + backward, T 32768, d 2048, h 1024, top-4, N = 8..128.
set -uo pipefail
. bench/device_env.sh
py=${PYTHON:-/opt/torch/.venv/bin/python}
printf '%-6s %-28s %-28s %s\n' N moetrain "PyTorch _grouped_mm" speedup
for n in ${EXPERTS:-8 16 32 64 128}; do
  ours=$(.devrun/bin/moe_layer_bench --experts "$n" --topk 4 | sed -n 's/.*median \([0-9.]*\) ms.*GEMMs \([0-9]*\) TFLOP.*/\1 \2/p')
  theirs=$(timeout 120 "$py" python/bench/torch_olmoe.py --moe-layer-only --experts "$n" --topk 4 2>/dev/null |
           sed -n 's/.*median \([0-9.]*\) ms.*GEMMs \([0-9]*\) TFLOP.*/\1 \2/p')
  set -- $ours; om=${1:-nan}; ot=${2:-nan}
  set -- $theirs; tm=${1:-nan}; tt=${2:-nan}
  printf '%-6s %-28s %-28s %s\n' "$n" "$om ms ($ot TFLOP/s)" "$tm ms ($tt TFLOP/s)" \
    "$(python3 -c "print(f'{$tm/$om:.2f}x')" 2>/dev/null || echo -)"
done
