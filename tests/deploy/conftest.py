"""Fixtures for tests/deploy: hand-built deployments and facts for the fast suite (no node, no image
definition needed), and for the lab tests the ONE shared session lab (the default LabSpec, as
tests/lab/conftest.py brings it up: `lab up` is idempotent, so this reuses the same lab, never a second one).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from deploy_helpers import make_deployment


@pytest.fixture
def deployment():
    return make_deployment


# -- the lab (tests marked lab) ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def lab():
    """The shared session lab: the default lab of tests/lab/conftest.py (same LabSpec, same containers)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "lab" / "conftest.py"
    spec = importlib.util.spec_from_file_location("sparkdeploy_tests_lab_conftest", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.ensure_engine()
    from sparkdeploy.lab import LabSpec, up

    lab = module.Lab(up(LabSpec()))
    for node in lab.nodes:
        _install_memlock_shim(lab, node)  # left in place: every `up` in the shared lab needs it (see below)
    return lab


# The rendered run scripts say `--ulimit memlock=-1` (what a Spark needs for RDMA). This host cannot grant
# CAP_SYS_RESOURCE, so no container here (lab node or inner container) can raise RLIMIT_MEMLOCK above its hard
# limit (8 MiB) and runc refuses the container. Until the lab simulates that itself (images/lab-node), these
# tests put a `docker` wrapper first in the nodes' PATH that turns `--ulimit memlock=-1` into the node's hard
# limit (logged as SIMULATED); it stays (the nodes are the lab's, recreated by `lab up --rebuild`), since every
# deployment in the shared lab needs it. Nothing else changes; the rendered files stay what a real Spark gets.
MEMLOCK_SHIM = "/usr/local/bin/docker"
_SHIM = r"""#!/bin/bash
# SIMULATED memlock (sparkdeploy tests/deploy): this host cannot raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE),
# so `--ulimit memlock=-1` becomes the node's hard limit. Everything else goes to the real docker unchanged.
hard=$(ulimit -H -l)
out=()
while [ $# -gt 0 ]; do
  if [ "$hard" != unlimited ] && [ "$1" = --ulimit ] && [ "${2:-}" = memlock=-1 ]; then
    out+=(--ulimit "memlock=$((hard * 1024)):$((hard * 1024))")
    echo "$(date -u +%FT%TZ) SIMULATED memlock=-1 -> ${hard} KiB" >> /tmp/sparkdeploy-lab-memlock.log 2>/dev/null
    shift 2
    continue
  fi
  out+=("$1"); shift
done
exec /usr/bin/docker "${out[@]}"
"""


def _install_memlock_shim(lab, node) -> bool:
    """Install the wrapper if the node needs it and has no docker wrapper of its own. True if installed."""
    probe = lab.docker_exec(node, "bash", "-c", "ulimit -H -l; test -e " + MEMLOCK_SHIM + " && echo present",
                            check=False).stdout.split()
    if not probe or probe[0] == "unlimited" or "present" in probe:
        return False
    lab.docker_exec(node, "bash", "-c", f"cat > {MEMLOCK_SHIM}.tmp <<'SHIM'\n{_SHIM}SHIM\n"
                                        f"chmod 0755 {MEMLOCK_SHIM}.tmp && mv {MEMLOCK_SHIM}.tmp {MEMLOCK_SHIM}")
    return True
