# Sourced by the reports' one-call GPU scripts after they set OUT and CALL_S: the device environment (from the
# repository root), OUT made and the GPU recorded in OUT/gpu.txt, the call's clock, and its steps.
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$OUT/gpu.txt"
start=$(date +%s)
left() { echo $(( CALL_S - ($(date +%s) - start) )); }  # seconds left of the call
step() {  # NAME NEEDS_S COMMAND...: run it if NEEDS_S seconds are left (for at most what is left), output in OUT/NAME.txt
  local name=$1 needs=$2; shift 2
  if [ "$(left)" -lt "$needs" ]; then echo "skipped $name: $(left) s left" | tee -a "$OUT/skipped.txt"; return; fi
  echo "== $name ($(left) s left)"
  timeout "$(left)" "$@" > "$OUT/$name.txt" 2>&1; echo "$name: exit $?" | tee -a "$OUT/exits.txt"
  tail -5 "$OUT/$name.txt"
}
gpu_tests() {  # every kernel test on the GPU, then the engine's GPU tests one at a time (each holds a model's
  # weights, KV and a float64 reference: two at once may not fit an 80 GB card)
  step kernel_tests 150 python3 -m pytest -q -p no:cacheprovider tests/gpu_backend/kernels -n 4
  step engine_tests 240 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/gpu_backend/test_engine_gpu.py
}
