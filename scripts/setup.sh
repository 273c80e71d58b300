#!/usr/bin/env bash
# Installs what sparkdeploy and its tests need on a fresh Debian/Ubuntu machine (run as root or with sudo):
# the Docker engine (started if it is not running), shellcheck, debootstrap, and the project's own Python
# environments:
#   .venv/          sparkdeploy (editable), its pinned dependencies, the test and bench tools
#   .venv-litellm/  the LiteLLM proxy for host-side runs (benchmarks/calibrate_sim.py), installed from the
#                   proxy image's hash-locked requirements; kept apart because its pins differ from ours
# Nothing is installed into the system interpreter: a package someone installed there by hand can never be
# what makes a test pass (tests/test_environment.py checks it). Idempotent: a second run changes nothing and
# skips pip when the requirement files have not changed since the last install.
# Callers then put the venv first on PATH: `source scripts/venv.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."

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

# make_venv DIR INSTALL_FN INPUTS...: create DIR and run INSTALL_FN in it, only when the inputs changed since the
# last successful install (a stamp in the venv records their hash).
make_venv() {
  local dir=$1 install=$2; shift 2
  local stamp="$dir/.sparkdeploy-installed" want
  want=$(cat "$@" | sha256sum | cut -c1-64)
  if [ -x "$dir/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  echo "setup: installing $dir (from $*)" >&2
  [ -x "$dir/bin/python" ] || python3 -m venv "$dir"
  rm -f "$stamp"
  "$install" "$dir/bin/python"
  echo "$want" >"$stamp"
}

install_project() {
  "$1" -m pip install "${pip_quiet[@]}" -r requirements-test.txt
  # The package itself, editable, without touching the pinned dependencies above.
  "$1" -m pip install "${pip_quiet[@]}" --no-deps -e .
}

# LiteLLM: the same hash-locked set the proxy image installs (never 1.82.7 / 1.82.8: the lock is checked by
# tests/images and images/litellm-proxy/check_litellm.py).
install_litellm() {
  "$1" -m pip install "${pip_quiet[@]}" --only-binary=:all: --require-hashes -r images/litellm-proxy/requirements.txt
}

make_venv .venv install_project requirements-test.txt requirements-bench.txt pyproject.toml setup.py
make_venv .venv-litellm install_litellm images/litellm-proxy/requirements.txt

wait "$docker_pid"
