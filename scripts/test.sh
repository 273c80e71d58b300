#!/usr/bin/env bash
# The test command (README): installs what the tests need (the Docker engine, the project's own .venv), then
# runs the fast suite and the lab suite with the venv's interpreter. The lab suite brings up the lab (building
# its images once) and shares it across the end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/venv.sh
# --durations: CI must stay under 30 minutes on 2 cores; the slowest tests are named in every run.
python3 -m pytest -q -m "not lab" --durations=10 "$@"
python3 -m pytest -q -m lab --durations=30 "$@"
