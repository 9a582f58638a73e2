#!/usr/bin/env bash
# One H200 call after a kernel change: check the kernels and the engine on the GPU, re-run the calibration that
# prices them, then validation units with the time left. Everything goes under OUT, packed into OUT.tgz at the end
# (one file: a device call brings back only a few files).
#
#   bash reports/calibration/next_gpu_run.sh OUT [CALL_S]      # then copy OUT.tgz where the call returns files
#   TESTS=0 bash reports/calibration/next_gpu_run.sh OUT        # kernels unchanged since their last GPU check: skip 1.
#
# 1. every kernel test on the GPU, then the engine's GPU tests one at a time (each holds a model's weights, KV and a
#    float64 reference);
# 2. the whole calibration run (`python3 -m calibration.measure`, about a minute): the raw rows a refit of `h200`
#    reads (`python -m granisim.calibration.shipped OUT/calib`, on a CPU);
# 3. Llama-3.1-8B validation units under granikv, token and paged16 on multi_agent_16k, control_short and
#    multi_turn_150 (reports/validation/next_gpu_run.sh; run it again with DONE for the rest).
# Read-only on the GPU: no clock or power setting is changed.
set -u
OUT=${1:?usage: next_gpu_run.sh OUT [CALL_S]}
CALL_S=${2:-560}
source "$(dirname "$0")/../gpu_steps.sh"
[ "${TESTS:-1}" = 0 ] || gpu_tests
step calibration 150 python3 -m calibration.measure --gpu h200 --model llama-3.1-8b --out "$OUT/calib" \
  --budget-s 120
if [ "$(left)" -gt 200 ]; then
  mkdir -p "$OUT/done" && touch "$OUT/done/sustained_load.json"  # no sustained-load benchmark in this call
  MODELS=llama-3.1-8b POLICIES="granikv token paged16" ONLY="multi_agent_16k control_short multi_turn_150" \
    bash reports/validation/next_gpu_run.sh "$OUT/validation" "$OUT/done" "$(( $(left) - 15 ))" \
    > "$OUT/validation.txt" 2>&1
  tail -3 "$OUT/validation.txt"
fi
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
echo "done in $(( $(date +%s) - start )) s: $OUT.tgz"
