"""The node facts most checks share, read in ONE command per node.

The engine, gpu, roce and network groups each declare a constant bash part; they run in parallel subshells
of one `bash -s` over the node's SSH connection, so a node costs one channel and one round trip for all of
them instead of one per group. Argument layout every part may use: $1 the managed-container label,
$2 the nvidia-smi query fields, $3... the inventory's fabric interfaces.
"""

from __future__ import annotations

from sparkdeploy.deployment import MANAGED_LABEL
from sparkdeploy.inventory import Node

from .parsers import Section
from .session import DoctorRun, NodeSession

TIMEOUT_S = 30


def _base(session: NodeSession) -> dict[str, Section]:
    from . import engine, gpu, network, roce

    args = [MANAGED_LABEL, ",".join(gpu.FIELDS), *session.node.fabric_ifaces]
    return session.script_parts([engine.SCRIPT, gpu.SCRIPT, roce.SCRIPT, network.LINK_SCRIPT], args,
                                timeout=TIMEOUT_S)


def base(run: DoctorRun, node: Node) -> dict[str, Section]:
    return run.facts(node, "base", _base)
