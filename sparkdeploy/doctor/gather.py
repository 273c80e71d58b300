"""The node facts most checks share, read in ONE command per node.

The engine, gpu, roce and network groups each declare a constant bash part; they run in parallel subshells
of one `bash -s` over the node's SSH connection, so a node costs one channel and one round trip for all of
them instead of one per group; the images the recipe needs are inspected in the same command. Argument
layout every part may use: $1 the managed-container label, $2 the nvidia-smi query fields, $3 the
inventory's fabric interfaces (comma separated), $4... the image references to inspect.
"""

from __future__ import annotations

from sparkdeploy.deployment import MANAGED_LABEL
from sparkdeploy.facts.parsers import Section
from sparkdeploy.inventory import Node

from .session import DoctorRun, NodeSession

TIMEOUT_S = 30


def _base(session: NodeSession, images: list[str]) -> dict[str, Section]:
    from . import engine, gpu, image, network, roce

    args = [MANAGED_LABEL, ",".join(gpu.FIELDS), ",".join(session.node.fabric_ifaces), *images]
    parts = [engine.SCRIPT, gpu.SCRIPT, roce.SCRIPT, network.LINK_SCRIPT] + ([image.PRESENT_SCRIPT] if images else [])
    return session.script_parts(parts, args, timeout=TIMEOUT_S)


def base(run: DoctorRun, node: Node) -> dict[str, Section]:
    from . import image

    images = image.required(run, node)
    return run.facts(node, "base", lambda s: _base(s, images))
