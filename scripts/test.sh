#!/usr/bin/env bash
# The test command (README): installs what the tests need, then runs the fast suite and the lab suite.
# The lab suite brings up the lab (building its images once) and shares it across the end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python3 -m pytest -q -m "not lab" "$@"
python3 -m pytest -q -m lab "$@"
