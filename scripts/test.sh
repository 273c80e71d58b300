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
# --durations: CI must stay under 30 minutes on 2 cores; the slowest tests are named in every run.
python3 -m pytest -q -m "not lab" --durations=10 "$@"
python3 -m pytest -q -m lab --durations=30 "$@"
