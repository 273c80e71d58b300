#!/usr/bin/env bash
# Installs what sparkdeploy and its tests need on a fresh Debian/Ubuntu machine (run as root or with sudo):
# the Docker engine (started if it is not running), shellcheck, debootstrap, and the Python packages.
# Idempotent: a second run changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pair in shellcheck:shellcheck debootstrap:debootstrap dockerd:docker.io ip:iproute2 ping:iputils-ping zstd:zstd ssh:openssh-client; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need_apt+=("${pair#*:}")
done
if ((${#need_apt[@]})); then
  echo "setup: installing ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

bash .ci/start-docker.sh

python3 -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
python3 -m pip install --quiet --disable-pip-version-check --no-deps -e .
