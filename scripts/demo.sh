#!/usr/bin/env bash
# The main job on the built-in lab: install what is needed, bring up a virtual two-Spark cluster, serve
# openai-gpt-oss-120b on it with the recipe's default topology, show the status, and ask it one question.
# The lab's GPUs are simulated (vllm-sim): everything else (SSH, Docker, Ray, LiteLLM) is real.
set -euo pipefail
cd "$(dirname "$0")/.."
recipe="${1:-openai-gpt-oss-120b}"

bash scripts/setup.sh --runtime
source scripts/venv.sh
sparkdeploy lab up
run-recipe "$recipe" --inventory lab
sparkdeploy status --inventory lab
python3 scripts/chat.py --inventory lab "What is a DGX Spark?"
