# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/demo.sh (after scripts/setup.sh): the project's own virtual environment
# first on PATH, so `python3`, `sparkdeploy`, `run-recipe` and pytest are the venv's.
_sd_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VIRTUAL_ENV="$_sd_root/.venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"
# The LiteLLM proxy for host-side runs lives in its own venv (its pins differ from ours).
export SPARKDEPLOY_LITELLM="$_sd_root/.venv-litellm/bin/litellm"
unset PYTHONHOME _sd_root
