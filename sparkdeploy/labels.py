"""The labels sparkdeploy puts on its containers, and the roles that hold no engine: what a deployment writes
(topologies) and what the facts read back (facts/), so both sides name them from here."""

from __future__ import annotations

LABEL_PREFIX = "io.sparkdeploy"
MANAGED_LABEL = f"{LABEL_PREFIX}.managed"
DEPLOYMENT_LABEL = f"{LABEL_PREFIX}.deployment"  # only on a stack's containers (deploy/stack/converge.py): its name
ROLE_LABEL = f"{LABEL_PREFIX}.role"  # the container's role (ContainerSpec.role)
# An engine container's group (one engine, over one node or several: the unit the node-side watcher restarts,
# nodeside/guard/watch.py, which keeps a copy of these names: tests/guard checks they agree): its name, its rank,
# every rank's node and watcher address (NODE@IP:PORT, rank order) and rank 0's health port.
GROUP_LABEL = f"{LABEL_PREFIX}.group"
RANK_LABEL = f"{LABEL_PREFIX}.rank"
WATCHERS_LABEL = f"{LABEL_PREFIX}.group-watchers"
HEALTH_PORT_LABEL = f"{LABEL_PREFIX}.health-port"
# The container roles that hold no engine (the memory guard, the LiteLLM proxy, Prometheus); every other role
# serves or shares a model. nodeside/guard/run.py (stdlib only) keeps a copy: tests/guard checks they agree.
NOT_ENGINES = ("guard", "proxy", "metrics")
