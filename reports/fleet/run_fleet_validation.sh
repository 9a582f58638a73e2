#!/usr/bin/env bash
# The real fleet on one H200 (reports/fleet/README.md), resumable: run it again with the same OUT until it
# prints "all done".
#
#   bash reports/fleet/run_fleet_validation.sh OUT [CALL_S]
#
# Four Llama-3.1-8B replicas take turns on one GPU (`granisim validate` on a scenario with [fleet]); 16 agent
# roles with prefixes of 16K, 4K and 8K tokens (one scenario each), 200 requests at RATE req/s (default 10),
# behind hot_aware and cache_aware: six units, each in OUT/<prefix>_<router>/ (validation.json marks it done).
# Each replica's KV budget is KV_TOKENS (default 160,000 tokens, 21 GB: four of them and one copy of the weights
# fit in the H200's memory); HOT pool HOT_FRACTION (default 0.45) of it, room for four 16K slabs.
# On an H100 (80 GB): PROFILE=h100-engine KV_TOKENS=100000 HOT_FRACTION=0.66 (four 16K slabs again).
# CALL_S: seconds this call may take (default 540); no unit starts unless LONGEST_S (default 200) still fits.
set -u
OUT=${1:?usage: run_fleet_validation.sh OUT [CALL_S]}
CALL_S=${2:-540}
LONGEST_S=${LONGEST_S:-200}
source "$(dirname "$0")/../device_env.sh"
mkdir -p "$OUT/scenarios"
start=$(date +%s)
for unit in ${UNITS:-16384_hot_aware 16384_cache_aware 4096_hot_aware 4096_cache_aware 8192_hot_aware 8192_cache_aware}; do
  [ -e "$OUT/$unit/validation.json" ] && continue
  if [ $(( CALL_S - ($(date +%s) - start) )) -lt "$LONGEST_S" ]; then
    echo "call budget used; run again with the same OUT"; exit 0
  fi
  L=${unit%%_*}; router=${unit#*_}; toml="$OUT/scenarios/fleet_val_$unit.toml"
  cat > "$toml" <<TOML
name = "fleet_val_$unit"
seed = 3
[model]
name = "llama-3.1-8b"
[hardware]
profile = "${PROFILE:-h200-engine}"
kv_budget_tokens = ${KV_TOKENS:-160000}
[policy]
name = "granikv"
hot_fraction = ${HOT_FRACTION:-0.45}
[workload]
kind = "multi_agent"
roles = 16
prefix_len = $L
num_requests = 200
rate = ${RATE:-10.0}
[fleet]
replicas = 4
router = "$router"
TOML
  t=$(date +%s)
  python3 -m granisim.cli validate "$toml" --out "$OUT/$unit" > "$OUT/$unit.log" 2>&1
  echo "$unit: exit $? in $(( $(date +%s) - t )) s"; tail -n 40 "$OUT/$unit.log"
done
echo "all done"
