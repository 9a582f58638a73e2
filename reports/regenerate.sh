#!/usr/bin/env bash
# Regenerate the tables of reports/validation, reports/engine and reports/fleet from raw runs kept outside git.
#
#   reports/regenerate.sh RAW [validation|engine|fleet ...]
#
# RAW is laid out as reports/README.md ("Raw runs") describes:
#   RAW/validation/runA1/h200_run ... RAW/validation/runE1/h200_run, runG1, runH1, runI1 (granisim validation gpu-run
#   validate; runI1/idle_pairs: the idle-effect runs)
#   RAW/engine/speedup_2048                                            (granisim validation gpu-run speedup)
#   RAW/engine/paper_setting                                           (granisim validation gpu-run paper)
#   RAW/fleet_validation/machineL/16384_hot_aware ...                  (reports/fleet/run_fleet_validation.sh)
# The engine fits of each run go to RAW/validation/fits/. Nothing here needs a GPU. The validation part runs
# about 30 reports of 20-60 s each on one core (each re-prices and re-simulates three workloads);
# the engine part a few minutes. The shipped profile (granisim/config/profiles/h200-engine.json) is not
# refitted here: reports/validation/README.md gives that command.
set -euo pipefail

usage() { echo "usage: $0 RAW [validation|engine|fleet ...]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
RAW=$1; shift
PARTS=("$@"); [[ ${#PARTS[@]} -gt 0 ]] || PARTS=(validation engine fleet)
cd "$(dirname "$0")/.."
G=${GRANISIM:-granisim}
SHIPPED=granisim/config/profiles/h200-engine.json
V=reports/validation
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT

need() { [[ -d $1 ]] || { echo "error: $1: no such raw-run folder (see reports/README.md, \"Raw runs\")" >&2; exit 2; }; }

validation() {
  local pairs=(A1:A2 A2:A1 B1:B2 B2:B1 C1:C2 C2:C1 D1:D2 D2:D1) x y
  for r in A1 A2 B1 B2 C1 C2 D1 D2 E1 G1 H1; do need "$RAW/validation/run$r/h200_run"; done
  mkdir -p "$RAW/validation/fits"
  for r in A1 A2 B1 B2 C1 C2 D1 D2 E1; do   # each run's own fit (on all its workloads)
    $G validation report "$RAW/validation/run$r/h200_run" --out "$SCRATCH/$r" \
      --profile-out "$RAW/validation/fits/fit_run$r.json" >/dev/null
  done
  for p in "${pairs[@]}"; do                 # each run judged by the other run of its machine
    x=${p%%:*}; y=${p##*:}
    $G validation report "$RAW/validation/run$x/h200_run" --out "$V/runs/run$x" \
      --check-profile "$RAW/validation/fits/fit_run$y.json" >/dev/null
  done
  $G validation report "$RAW/validation/runE1/h200_run" --out "$V/runs/runE1" >/dev/null
  for r in D1 D2 E1; do                      # runs the shipped profile was not fitted on
    $G validation report "$RAW/validation/run$r/h200_run" --out "$V/runs/run$r/shipped" \
      --check-profile "$SHIPPED" >/dev/null
  done
  for pol in granikv token; do               # machine G: seven workloads, two policies
    $G validation report "$RAW/validation/runG1/h200_run" --policy $pol --out "$V/runs/runG1/$pol" \
      --check-profile "$SHIPPED" >/dev/null
  done
  for pm in granikv:qwen-2.5-14b token:qwen-2.5-14b paged16:llama-3.1-8b; do  # machine H: the second model, paged16
    $G validation report "$RAW/validation/runH1/h200_run" --policy ${pm%%:*} --model ${pm##*:} \
      --out "$V/runs/runH1/${pm%%:*}-${pm##*:}" --check-profile "$SHIPPED" >/dev/null
  done
  for m in llama-3.1-8b qwen-2.5-14b; do     # machine I: paged16 on the rest
    $G validation report "$RAW/validation/runI1/h200_run" --policy paged16 --model $m \
      --out "$V/runs/runI1/paged16-$m" --check-profile "$SHIPPED" >/dev/null
  done
  for pm in J1:granikv K1:granikv K1:token; do  # machines J and K: Qwen-2.5-14B again
    $G validation report "$RAW/validation/run${pm%%:*}/h200_run" --policy ${pm##*:} --model qwen-2.5-14b \
      --out "$V/runs/run${pm%%:*}/${pm##*:}-qwen-2.5-14b" --check-profile "$SHIPPED" >/dev/null
  done
  for pol in granikv token; do               # machine N: Llama-3.1-8B on the arXiv replays
    $G validation report "$RAW/validation/runN1/h200_run" --policy $pol --out "$V/runs/runN1/$pol-llama-3.1-8b" \
      --check-profile "$SHIPPED" >/dev/null
  done
  for pol in granikv token; do               # machine R: Llama-3.1-8B on the multi-turn workloads
    $G validation report "$RAW/validation/runR1/h200_run" --policy $pol --out "$V/runs/runR1/$pol" \
      --check-profile "$SHIPPED" >/dev/null
  done
  local d name pol model r
  for d in "$V"/runs/run{S1,T1,U1,V1,W1}/*/; do   # machines S-W: one report folder per policy (and model)
    name=$(basename "$d"); pol=${name%%-*}; model=llama-3.1-8b
    [[ $name == *-* ]] && model=${name#*-}
    r=$(basename "$(dirname "$d")")
    need "$RAW/validation/$r/h200_run"
    $G validation report "$RAW/validation/$r/h200_run" --policy "$pol" --model "$model" --out "${d%/}" \
      --check-profile "$SHIPPED" >/dev/null
  done
  $G validation step-parts "$RAW/validation/runJ1" "$RAW/validation/runK1" --out "$V/step_parts.json" >/dev/null
  $G validation sensitivity --out "$V/sensitivity.json" --table "$V/sensitivity.md" >/dev/null
  $G validation summary --reports "$V"/runs/run{G1,H1,I1,J1,K1,N1,R1,S1,T1,U1,V1,W1}/*/h200.json "$V"/runs/run{D1,D2,E1}/shipped/h200.json \
    --out "$V/summary.json" --table "$V/summary.md" >/dev/null
  P=validation/runI1/idle_pairs  # relative to RAW: the paths the JSON records
  (here=$PWD && cd "$RAW" && $G validation idle-effect --idle $P/idle-{b,c,d} --no-idle $P/noidle-{a,b,c,d} \
    --out "$here/$V/idle_effect.json") > "$V/idle_effect.md"
  mkdir -p "$V/targets"
  for m in A B C D; do $G validation targets ${m}1 ${m}2 --root "$V/runs" > "$V/targets/machine_$m.md"; done
  $G validation targets D1 D2 E1 --root "$V/runs" --profile-check shipped > "$V/targets/shipped_profile.md"
  $G validation loro A1 A2 B1 B2 C1 C2 --root "$RAW/validation" --out "$V/loro" >/dev/null
  $G validation runs "$RAW/validation" --runs runA1 runA2 runB1 runB2 runC1 runC2 \
    --sensitivity 0.98 0.99 1.01 1.02 --out "$V/runs" >/dev/null
  $G validation replay "$RAW"/validation/run{A1,A2,B1,B2,C1,C2} > "$V/replay.md"
  echo "wrote $V/runs/*, $V/targets/*.md, $V/loro/, $V/runs.md, $V/replay.md, $V/summary.json, $V/idle_effect.md"
}

engine() {
  need "$RAW/engine/speedup_2048"
  $G validation speedups "$RAW/engine/speedup_2048" --out reports/engine/speedups >/dev/null
  $G validation engine-vs-sim "$RAW/engine/speedup_2048" --profiles h200,h200-engine \
    --out reports/engine/sim_vs_measured >/dev/null
  need "$RAW/engine/paper_setting"
  local P=reports/engine/paper_setting
  $G validation paper-setting "$RAW/engine/paper_setting" --sensitivity 0.98 0.99 1.01 1.02 \
    --out $P/sim_vs_measured.json --table $P/sim_vs_measured.md >/dev/null
  echo "wrote reports/engine/speedups.{json,_table.md}, reports/engine/sim_vs_measured.{json,md}, $P/sim_vs_measured.{json,md}"
}

fleet() {
  need "$RAW/fleet_validation"
  local d
  for d in "$RAW"/fleet_validation/machine*/*_*/; do  # runs made before `granisim validate` kept their scenario
    [[ -e $d/scenario.toml ]] || cp "reports/fleet/validation/$(basename "$(dirname "$d")")/$(basename "$d")/scenario.toml" "$d"
  done
  $G validation fleet-summary "$RAW"/fleet_validation/machine*/*_*/ --out reports/fleet/validation/summary.json \
    --table reports/fleet/validation/summary.md >/dev/null
  echo "wrote reports/fleet/validation/summary.{json,md}"
}

for part in "${PARTS[@]}"; do
  case $part in
    validation) validation ;;
    engine) engine ;;
    fleet) fleet ;;
    *) echo "error: part $part: not one of validation, engine, fleet" >&2; exit 2 ;;
  esac
done
