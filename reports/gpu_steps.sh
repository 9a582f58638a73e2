# Sourced by the reports' one-call GPU scripts after they set OUT and CALL_S: the call's clock and its steps.
start=$(date +%s)
left() { echo $(( CALL_S - ($(date +%s) - start) )); }  # seconds left of the call
step() {  # NAME NEEDS_S COMMAND...: run it if NEEDS_S seconds are left (for at most what is left), output in OUT/NAME.txt
  local name=$1 needs=$2; shift 2
  if [ "$(left)" -lt "$needs" ]; then echo "skipped $name: $(left) s left" | tee -a "$OUT/skipped.txt"; return; fi
  echo "== $name ($(left) s left)"
  timeout "$(left)" "$@" > "$OUT/$name.txt" 2>&1; echo "$name: exit $?" | tee -a "$OUT/exits.txt"
  tail -5 "$OUT/$name.txt"
}
