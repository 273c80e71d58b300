#!/usr/bin/env bash
# Installs what sparkdeploy and its tests need on a fresh Debian/Ubuntu machine (run as root or with sudo):
# the Docker engine (started if it is not running), shellcheck, debootstrap, and the project's own Python
# environments:
#   .venv/          sparkdeploy (editable) and the hashed lock requirements-test.txt (its runtime pins, the test
#                   and bench tools), or with --runtime only the runtime lock requirements.txt
#   .venv-litellm/  the LiteLLM proxy for host-side runs (benchmarks/calibrate_sim.py), installed from the
#                   proxy image's lock; kept apart because its pins differ from ours
# Every lock is made by scripts/lock.py and installed with --require-hashes --no-deps: nothing is resolved
# against the index, so a package released upstream today cannot change or break what installs.
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
# install_lock VENV NAME: the venv gets exactly the files of a hashed lock and nothing resolved against the index
# (scripts/lock.py: it first proves the lock complete, then runs pip with --require-hashes --no-deps).
install_lock() {
  [ -x "$1/bin/python" ] || python3 -m venv "$1"
  "$1/bin/python" scripts/lock.py install "$1/bin/python" "$2"  # the venv's pip vendors the packaging it reads with
}
# sparkdeploy itself, editable, built with the lock's setuptools (an isolated build would fetch it unhashed).
install_editable() { .venv/bin/python -m pip install "${pip_quiet[@]}" --no-deps --no-build-isolation -e .; }

# .venv: sparkdeploy (editable) and the runtime lock; with the test set (the default) the test lock instead,
# which holds the runtime pins too, so an installed test set satisfies the runtime one.
runtime_hash=$(stamp_of requirements.txt pyproject.toml setup.py)
test_hash=$(stamp_of requirements-test.txt pyproject.toml setup.py)
if [ "$profile" = runtime ]; then
  if ! installed .venv runtime "$runtime_hash" && ! installed .venv test "$test_hash"; then
    echo "setup: installing .venv (runtime lock: requirements.txt)" >&2
    install_lock .venv runtime
    install_editable
    echo "$runtime_hash" >.venv/.sparkdeploy-runtime
  fi
else
  if ! installed .venv test "$test_hash"; then
    echo "setup: installing .venv (test lock: requirements-test.txt)" >&2
    install_lock .venv test
    install_editable
    echo "$test_hash" >.venv/.sparkdeploy-test
    echo "$runtime_hash" >.venv/.sparkdeploy-runtime
  fi
  # LiteLLM for host-side runs (benchmarks/calibrate_sim.py): the same lock the proxy image installs (never
  # 1.82.7 / 1.82.8: scripts/lock.py check refuses them, and so does images/litellm-proxy/check_litellm.py).
  litellm_hash=$(stamp_of images/litellm-proxy/requirements.txt)
  if ! installed .venv-litellm litellm "$litellm_hash"; then
    echo "setup: installing .venv-litellm (images/litellm-proxy/requirements.txt)" >&2
    install_lock .venv-litellm litellm-proxy
    echo "$litellm_hash" >.venv-litellm/.sparkdeploy-litellm
  fi
fi

wait "$docker_pid"
