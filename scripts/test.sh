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
# The fast suite runs BESIDE the lab suite: each keeps about one core of a 2-core machine busy (the lab suite
# mostly waits on nodes, engines and SSH), so together they take little more than the lab suite alone
# (docs/benchmarks.md, "CI's time"). The fast suite's output goes to a file, shown after the lab suite's; both
# must pass. --durations: CI must stay under 30 minutes on 2 cores; the slowest tests and the seconds per lab
# module (tests/support/module_times.py) are printed in every run.
fast_log="$(mktemp -t sparkdeploy-fast-suite.XXXXXX)"
python3 -m pytest -q -m "not lab" --durations=10 "$@" >"$fast_log" 2>&1 &
fast_pid=$!
trap 'kill "$fast_pid" 2>/dev/null || true' EXIT  # a lab suite stopped early does not leave the fast suite running
lab_rc=0
python3 -m pytest -q -m lab --durations=30 "$@" || lab_rc=$?
fast_rc=0
wait "$fast_pid" || fast_rc=$?
trap - EXIT
echo "=============================== the fast suite (run beside the lab suite) ==============================="
cat "$fast_log"
rm -f "$fast_log"
((lab_rc == 0)) || echo "test.sh: the lab suite failed (exit $lab_rc)" >&2
((fast_rc == 0)) || echo "test.sh: the fast suite failed (exit $fast_rc)" >&2
((lab_rc == 0 && fast_rc == 0))
