# Sourced by the reports' GPU scripts: from the repository root, the simulator importable, and on a bare device
# machine the wheels carried in .whl/ (simpy, pydantic) installed into /tmp/site.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
# the code's commit for the runs' metadata: a COMMIT file at the root (the device copy has no .git), else git's HEAD
[ -n "${COMMIT:-}" ] || export COMMIT=$(cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -d .whl ] && ! python3 -c "import simpy, pydantic" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit 1
fi
