"""What each node holds (`models list`) and the check `up` runs before starting any engine.

A model counts as complete on a node only when sparkdeploy recorded it there (after verifying every file)
and every file still verifies: blobs re-hashed when their size, mtime or inode changed since (verify=True
re-hashes all of them).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkdeploy.config.inventory import Node
from sparkdeploy.models import ops
from sparkdeploy.models.ops import Json, ModelRef
from sparkdeploy.runtime.remote import NodeConnection, on_nodes


@dataclass
class Presence:
    node: str
    state: str  # complete | corrupt | absent | unreachable
    detail: str
    commit: str = ""


def node_models(
    conns: dict[str, NodeConnection], nodes: list[Node], hf_cache: str, verify: bool = False
) -> dict[str, Json | str]:
    """{node name: status dict (nodeside status) or the error text}."""
    outcomes = on_nodes(nodes, lambda n: ops.status(conns[n.name], hf_cache, None, verify))
    return {o.node.name: (o.value if o.ok else str(o.error)) for o in outcomes}


def presence(conns: dict[str, NodeConnection], nodes: list[Node], hf_cache: str, ref: ModelRef) -> list[Presence]:
    """Is `ref` complete and verified on each node?"""
    out = []
    for o in on_nodes(nodes, lambda n: ops.status(conns[n.name], hf_cache, ref.repo)):
        name = o.node.name
        if not o.ok:
            out.append(Presence(name, "unreachable", str(o.error)))
            continue
        m = ops.recorded(o.value, ref)
        if m is None:
            out.append(Presence(name, "absent", f"{ref} is not in {hf_cache} (or was not pulled by sparkdeploy)"))
        elif m["bad"]:
            out.append(Presence(name, "corrupt", f"{ref}: {ops.describe_bad(m['bad'])}", m["commit"]))
        else:
            out.append(
                Presence(
                    name,
                    "complete",
                    f"{ref} complete and verified ({m['files']} files, "
                    f"{m['size'] / 1e9:.2f} GB, commit {m['commit'][:12]})",
                    m["commit"],
                )
            )
    return out
