#!/usr/bin/env bash
# Tensor parallelism on a machine with several H200s (docs/tp.md, "Checking on several GPUs"): the all-reduce
# curve fitted into the profiles, the tp engine against tp = 1, and `granisim validate` at tp = 2 (and 4 where
# the GPUs allow) on the multi-agent 16K and the Azure replay workloads. Resumable: run it again with the same
# OUT; each step leaves its output in OUT.
#
#   bash reports/tp/run_multi_gpu.sh OUT [BUDGET_S]
#
# BUDGET_S (default 480): no validation unit starts after it (granisim validation gpu-run --budget-s).
set -u
OUT=${1:?usage: run_multi_gpu.sh OUT [BUDGET_S]}
BUDGET_S=${2:-480}
source "$(dirname "$0")/../device_env.sh"
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off
mkdir -p "$OUT"
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
{ nvidia-smi; nvidia-smi topo -m; git log -1 --format=%H; } > "$OUT/machine.txt" 2>&1
if [ ! -e "$OUT/allreduce/fit.json" ]; then  # about a minute per tp
  cp granisim/config/profiles/h200.json "$OUT/h200.json"
  python3 -m calibration.measure.allreduce --out "$OUT/allreduce" --tp 2 4 8 --profile "$OUT/h200.json"
fi
if [ ! -e "$OUT/pytest_tp_gpu.txt" ]; then
  python3 -m pytest -q -m gpu tests/gpu_backend/test_tp_gpu.py > "$OUT/pytest_tp_gpu.txt" 2>&1
  tail -n 3 "$OUT/pytest_tp_gpu.txt"
fi
for tp in 2 4; do
  [ "$gpus" -ge $tp ] || continue
  python3 -m granisim.validation.gpu_runs validate --out "$OUT/val" --tp $tp --models llama-3.1-8b \
    --policies granikv token --only multi_agent_16k azure_replay --profile h200-engine --log-gpu --budget-s "$BUDGET_S"
done
echo "done (run again with the same OUT to resume)"
