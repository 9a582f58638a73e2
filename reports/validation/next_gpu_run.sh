#!/usr/bin/env bash
# The next validation run on one H200, resumable: run it again (same DONE) until it prints "all done".
#
#   bash reports/validation/next_gpu_run.sh OUT [DONE] [CALL_S]
#
# OUT: where this call writes (raw units: <unit>/ folders, validation_<unit>.json, gpu_log.csv, sustained/).
# DONE: a folder holding the validation_*.json (and sustained_load.json) of earlier calls: those units are
#       skipped. CALL_S: seconds this call may take (default 540, inside a 10-minute limit). No unit starts
#       unless the longest one ($LONGEST_S, default 180 s) still fits.
# Priority order: the sustained-load benchmark, then each of $MODELS (default: llama-3.1-8b qwen-2.5-14b) under each
# of $POLICIES (default: granikv token paged16), every workload each, or those named in $ONLY (space-separated
# VALIDATION names; reports/validation/README.md, "Next GPU run"). $PROFILE (default h200) sizes the units' KV pools and
# policies: h100-sxm on an H100 (an H200's pool does not fit an 80 GB card).
# Read-only on the GPU: the clock/power log only queries nvidia-smi; no clock or power setting is changed.
set -u
OUT=${1:?usage: next_gpu_run.sh OUT [DONE] [CALL_S]}
DONE=${2:-}
CALL_S=${3:-540}
LONGEST_S=${LONGEST_S:-180}  # the longest unit, s (the short workloads: ~60)
source "$(dirname "$0")/../device_env.sh"
mkdir -p "$OUT"
start=$(date +%s)
left() { echo $(( CALL_S - ($(date +%s) - start) - LONGEST_S )); }

if [ ! -e "$OUT/sustained/sustained_load.json" ] && { [ -z "$DONE" ] || [ ! -e "$DONE/sustained_load.json" ]; }; then
  if [ "$(left)" -gt 0 ]; then
    python3 -m gpu_backend.bench.sustained_load --out "$OUT/sustained" --idle-s 20 --load-s 60 --probe-every-s 5 \
      || echo "sustained-load benchmark failed; going on with the validation units"
  fi
fi
for model in ${MODELS:-llama-3.1-8b qwen-2.5-14b}; do
  for policy in ${POLICIES:-granikv token paged16}; do
    b=$(left)
    if [ "$b" -le 0 ]; then echo "call budget used; run again with DONE holding this call's JSON files"; exit 0; fi
    set -o pipefail
    python3 -m granisim.validation.gpu_runs validate --out "$OUT" ${DONE:+--done "$DONE"} --budget-s "$b" \
      --models "$model" --policies "$policy" ${ONLY:+--only $ONLY} --profile "${PROFILE:-h200}" --log-gpu 2>&1 | tee "$OUT/last_pass.log" || exit 1
    if grep -q "budget reached" "$OUT/last_pass.log"; then
      echo "call budget used; run again with DONE holding this call's JSON files"; exit 0
    fi
  done
done
echo "all done"
