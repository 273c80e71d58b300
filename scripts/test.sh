#!/usr/bin/env bash
# The test command (README): installs what the tests need (the Docker engine, the project's own .venv), then
# runs the fast suite and the lab suite with the venv's interpreter. The lab suite brings up the lab (building
# its images once) and shares it across the end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/venv.sh
# Lint and types first (seconds; docs/CONVENTIONS.md "Lint and types"): each names the command that shows why.
lint_paths=(sparkdeploy tests benchmarks scripts images)
python3 -m ruff check "${lint_paths[@]}" \
  || { echo "test.sh: ruff check failed (see above; python3 -m ruff check --fix for the safe fixes)" >&2; exit 1; }
python3 -m ruff format --check "${lint_paths[@]}" \
  || { echo "test.sh: ruff format --check failed (python3 -m ruff format ${lint_paths[*]} rewrites them)" >&2; exit 1; }
python3 -m mypy || { echo "test.sh: mypy failed (see above)" >&2; exit 1; }
# The lab suite runs as two pytest processes at once, each on a lab of its own (shard 1: the default lab; shard 2: a
# second instance, subnets and state folder derived from the first's), its modules split by their seconds in
# tests/support/lab_module_seconds.json (tests/support/lab_shards.py, which also says how a module not listed there
# is placed). They mostly wait on nodes, engines and SSH, so on a 2-core machine the two take little more than one
# half. The fast suite runs AFTER them, on a quiet machine: beside both shards it got too little CPU for its few
# timed checks (docs/benchmarks.md, "CI's time"). SPARKDEPLOY_LAB_SHARDS=1 runs the lab suite as one process on
# the default lab, as before (use it with test paths in "$@": each shard adds its own modules to them). Shard 1's
# output is shown as it runs, shard 2's after it, then the fast suite's; every one must pass. --durations: CI must
# stay under 30 minutes on 2 cores; the slowest tests and the seconds per module (tests/support/module_times.py)
# are printed. --tb=short: a failure's every frame in a line or two (a client library's frames were pages), so
# what CI shows of its output reaches the failing line and its error.
shards="${SPARKDEPLOY_LAB_SHARDS:-2}"
[[ "$shards" == 1 || "$shards" == 2 ]] \
  || { echo "test.sh: SPARKDEPLOY_LAB_SHARDS=$shards: use 1 (one lab suite) or 2 (two at once; the default)" >&2; exit 2; }
shard2_log="$(mktemp -t sparkdeploy-lab-shard2.XXXXXX)"
shard2_pid=""
if ((shards == 2)); then
  python3 -m tests.support.lab_shards run 2 2 --durations=30 --tb=short "$@" >"$shard2_log" 2>&1 &
  shard2_pid=$!
fi
# a lab suite stopped early does not leave the other running
trap 'kill $shard2_pid 2>/dev/null || true' EXIT
lab_rc=0
python3 -m tests.support.lab_shards run 1 "$shards" --durations=30 --tb=short "$@" || lab_rc=$?
shard2_rc=0
[[ -z "$shard2_pid" ]] || wait "$shard2_pid" || shard2_rc=$?
trap - EXIT
if [[ -n "$shard2_pid" ]]; then
  echo "============================ the lab suite's shard 2 (run beside shard 1, on its own lab) ============================"
  cat "$shard2_log"
fi
rm -f "$shard2_log"
echo "=============================== the fast suite (after the lab suite) ==============================="
fast_rc=0
python3 -m pytest -q -m "not lab" --durations=10 "$@" || fast_rc=$?
((lab_rc == 0)) || echo "test.sh: the lab suite's shard 1 failed (exit $lab_rc)" >&2
((shard2_rc == 0)) || echo "test.sh: the lab suite's shard 2 failed (exit $shard2_rc)" >&2
((fast_rc == 0)) || echo "test.sh: the fast suite failed (exit $fast_rc)" >&2
((lab_rc == 0 && shard2_rc == 0 && fast_rc == 0))
