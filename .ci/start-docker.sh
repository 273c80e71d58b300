#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine (and that debootstrap is there to make base images).
#
# Idempotent: installs docker.io (and debootstrap) with apt only when missing, starts dockerd in the background
# only when `docker info` does not answer, then waits until it does. Used by .ci/run and the lab tests.
# CI machines start with no engine running; stale lab containers, networks and volumes from earlier runs may
# still be on disk (stopped): `sparkdeploy lab up` copes with them.
set -euo pipefail

log() { echo "start-docker: $*" >&2; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo -n"

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if docker info >/dev/null 2>&1; then
    log "docker engine already running"
    exit 0
fi

# A dockerd already starting (pid file of a live process) is waited for, not started twice. No pgrep: procps
# is not on every fresh machine.
pid=$(cat /var/run/docker.pid 2>/dev/null || true)
if [ -z "$pid" ] || [ ! -d "/proc/$pid" ]; then
    logfile=${DOCKERD_LOG:-/var/log/dockerd-ci.log}
    log "starting dockerd (log: $logfile)"
    # setsid: dockerd must outlive this script and the CI step that ran it.
    $SUDO setsid sh -c 'exec dockerd >>"$1" 2>&1' dockerd "$logfile" </dev/null &
fi

for _ in $(seq 1 120); do
    if docker info >/dev/null 2>&1; then
        log "docker engine ready ($(docker info --format '{{.ServerVersion}} {{.Driver}}'))"
        exit 0
    fi
    sleep 0.5
done
log "dockerd did not answer within 60 s; last lines of its log:"
tail -n 30 "${DOCKERD_LOG:-/var/log/dockerd-ci.log}" >&2 || true
exit 1
