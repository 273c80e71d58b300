#!/bin/sh
# Entry point of the LiteLLM proxy image: `docker run IMAGE --config c.yaml --port 4000` runs
# `litellm --config ...`, while `docker run IMAGE bash script` (how sparkdeploy starts it) runs the command.
# Either way the compromised-release check runs first: it takes a fraction of a second.
set -eu
/opt/litellm/bin/python -S -I /opt/sparkdeploy/litellm/check_litellm.py
case "${1:-}" in
    "" | -*) exec /opt/litellm/bin/litellm "$@" ;;
    *) exec "$@" ;;
esac
