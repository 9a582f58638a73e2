#!/usr/bin/env bash
# The host tier on the real engine (reports/host_tier/README.md), resumable: run it again with the same OUT until
# it prints "all done".
#
#   bash reports/host_tier/run_validation.sh OUT [CALL_S]
#
# Llama-3.1-8B on one H200, ROLES (default 64) agent roles with PREFIX-token prefixes (default 4096: 256K prefix tokens
# against a KV budget of KV_TOKENS, default 160,000: prefixes are evicted and come back; a 16K-token prefix of
# Llama-3.1-8B takes 2.1 GB of host memory), NUM requests (default 450) at RATE req/s
# (default 12), `granisim validate` with the h200-engine profile: granikv with the tier (HOST_GB of host memory,
# default 40: every prefix fits; HOT slabs and COLD pages to host), token with it (pages), granikv without it.
# HOST_WRITE=reused writes back only the runs read again since they were cached (policy.host_write; default: all).
# ADMISSION=prefix lets a queued request whose prefix is resident go first (scheduler.admission; default: fcfs).
# Each unit in OUT/<unit>/ (validation.json marks it done).
# CALL_S: seconds this call may take (default 540); no unit starts unless LONGEST_S (default 300: a unit with the tier) still fits.
set -u
OUT=${1:?usage: run_validation.sh OUT [CALL_S]}
CALL_S=${2:-540}
LONGEST_S=${LONGEST_S:-300}
source "$(dirname "$0")/../device_env.sh"
mkdir -p "$OUT/scenarios"
start=$(date +%s)
for unit in ${UNITS:-granikv_tier token_tier granikv_none}; do
  [ -e "$OUT/$unit/validation.json" ] && continue
  if [ $(( CALL_S - ($(date +%s) - start) )) -lt "$LONGEST_S" ]; then
    echo "call budget used; run again with the same OUT"; exit 0
  fi
  policy=${unit%%_*}; toml="$OUT/scenarios/host_tier_$unit.toml"
  tier=""
  [ "${unit#*_}" = tier ] && tier="host_kv_gb = ${HOST_GB:-40}"$'\n'
  {
    printf 'name = "host_tier_%s"\nseed = 7\n[model]\nname = "llama-3.1-8b"\n' "$unit"
    printf '[hardware]\nprofile = "h200-engine"\nkv_budget_tokens = %s\n%s' "${KV_TOKENS:-160000}" "$tier"
    printf '[policy]\nname = "%s"\nhot_fraction = 0.3\n' "$policy"
    [ -n "$tier" ] && printf 'host_tier = "slabs+pages"\n'
    [ -n "$tier" ] && [ -n "${HOST_WRITE:-}" ] && printf 'host_write = "%s"\n' "$HOST_WRITE"
    [ -n "${ADMISSION:-}" ] && printf '[scheduler]\nadmission = "%s"\n' "$ADMISSION"
    printf '[workload]\nkind = "multi_agent"\nroles = %s\nprefix_len = %s\nnum_requests = %s\nrate = %s\n' \
      "${ROLES:-64}" "${PREFIX:-4096}" "${NUM:-450}" "${RATE:-12.0}"
  } > "$toml"
  t=$(date +%s)
  python3 -m granisim.cli validate "$toml" --out "$OUT/$unit" > "$OUT/$unit.log" 2>&1
  echo "$unit: exit $? in $(( $(date +%s) - t )) s"; tail -n 30 "$OUT/$unit.log"
done
echo "all done"
