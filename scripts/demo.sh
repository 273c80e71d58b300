#!/usr/bin/env bash
# The main job on the built-in lab: install what is needed, bring up a virtual two-Spark cluster, serve
# openai-gpt-oss-120b on it with the recipe's default topology, show the status, and ask it one question.
# The lab's GPUs are simulated (vllm-sim): everything else (SSH, Docker, Ray, LiteLLM) is real.
# Each step ends with a `demo:` line giving the seconds since the start (benchmarks/demo_time.py reads them).
set -euo pipefail
cd "$(dirname "$0")/.."
recipe="${1:-openai-gpt-oss-120b}"
start=$EPOCHREALTIME
step() { awk -v what="$1" -v now="$EPOCHREALTIME" -v t0="$start" \
           'BEGIN { printf "demo: %-36s done at %6.1f s\n", what, now - t0 }' >&2; }

bash scripts/setup.sh --runtime
step "setup (engine, .venv)"
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
sparkdeploy lab up --no-preload   # run-recipe pushes the one engine image it needs
step "lab up (nodes, no engine image yet)"
run-recipe "$recipe" --inventory lab
step "run-recipe (build, push, serve)"
sparkdeploy status --inventory lab
python3 scripts/chat.py --inventory lab "What is a DGX Spark?"
step "first answer"
