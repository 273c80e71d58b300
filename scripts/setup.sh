#!/usr/bin/env bash
# Installs what sparkdeploy and its tests need on a fresh Debian/Ubuntu machine (run as root or with sudo):
# the Docker engine (started if it is not running), shellcheck, debootstrap, and the project's own Python
# environments:
#   .venv/          sparkdeploy (editable), its pinned dependencies (requirements.txt) and, unless --runtime,
#                   the test and bench tools (requirements-test.txt)
#   .venv-litellm/  the LiteLLM proxy for host-side runs (benchmarks/calibrate_sim.py), installed from the
#                   proxy image's hash-locked requirements; kept apart because its pins differ from ours
# Nothing is installed into the system interpreter: a package someone installed there by hand can never be
# what makes a test pass (tests/conftest.py checks it). Idempotent: a second run changes nothing and skips pip
# when the requirement files have not changed since the last install (a stamp in the venv holds their hash).
# Callers then put the venv first on PATH: `source scripts/venv.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."

profile="test"  # --runtime: only what sparkdeploy needs to run (scripts/demo.sh), not the test and bench tools
case "${1:-}" in
  --runtime) profile="runtime" ;;
  "") ;;
  *) echo "usage: scripts/setup.sh [--runtime]" >&2; exit 2 ;;
esac

need_apt=()
for pair in shellcheck:shellcheck debootstrap:debootstrap dockerd:docker.io ip:iproute2 ping:iputils-ping zstd:zstd ssh:openssh-client; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need_apt+=("${pair#*:}")
done
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
if ((${#need_apt[@]})); then
  echo "setup: installing ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# The engine starts in the background while pip works (the lab needs it only after setup).
bash .ci/start-docker.sh &
docker_pid=$!

pip_quiet=(--quiet --disable-pip-version-check --no-input)

# stamp_of INPUTS...: the hash that a venv's stamp must hold for these requirement files to count as installed.
stamp_of() { cat "$@" | sha256sum | cut -c1-64; }
installed() { [ -x "$1/bin/python" ] && [ "$(cat "$1/.sparkdeploy-$2" 2>/dev/null)" = "$3" ]; }

# .venv: sparkdeploy (editable) and its runtime pins; with the test set (the default) also the test and bench
# tools. The test set includes requirements.txt, so an installed test set satisfies the runtime one too.
runtime_hash=$(stamp_of requirements.txt pyproject.toml setup.py)
test_hash=$(stamp_of requirements.txt requirements-test.txt requirements-bench.txt pyproject.toml setup.py)
if [ "$profile" = runtime ]; then
  if ! installed .venv runtime "$runtime_hash" && ! installed .venv test "$test_hash"; then
    echo "setup: installing .venv (runtime: requirements.txt)" >&2
    [ -x .venv/bin/python ] || python3 -m venv .venv
    .venv/bin/python -m pip install "${pip_quiet[@]}" -r requirements.txt
    .venv/bin/python -m pip install "${pip_quiet[@]}" --no-deps -e .
    echo "$runtime_hash" >.venv/.sparkdeploy-runtime
  fi
else
  if ! installed .venv test "$test_hash"; then
    echo "setup: installing .venv (tests: requirements-test.txt)" >&2
    [ -x .venv/bin/python ] || python3 -m venv .venv
    .venv/bin/python -m pip install "${pip_quiet[@]}" -r requirements-test.txt
    .venv/bin/python -m pip install "${pip_quiet[@]}" --no-deps -e .
    echo "$test_hash" >.venv/.sparkdeploy-test
    echo "$runtime_hash" >.venv/.sparkdeploy-runtime
  fi
  # LiteLLM for host-side runs (benchmarks/calibrate_sim.py): the same hash-locked set the proxy image installs
  # (never 1.82.7 / 1.82.8: the lock is checked by tests/images and images/litellm-proxy/check_litellm.py).
  litellm_hash=$(stamp_of images/litellm-proxy/requirements.txt)
  if ! installed .venv-litellm litellm "$litellm_hash"; then
    echo "setup: installing .venv-litellm (images/litellm-proxy/requirements.txt)" >&2
    [ -x .venv-litellm/bin/python ] || python3 -m venv .venv-litellm
    .venv-litellm/bin/python -m pip install "${pip_quiet[@]}" --only-binary=:all: --require-hashes --no-deps \
      -r images/litellm-proxy/requirements.txt
    echo "$litellm_hash" >.venv-litellm/.sparkdeploy-litellm
  fi
fi

wait "$docker_pid"
