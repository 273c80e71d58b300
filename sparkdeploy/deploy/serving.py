"""What serves on the nodes, for the commands that would break it (issue 43 item 4): nothing that serves is broken
without warning.

`setup network` (apply, --replace, --restore) changes the fabric under any engine whose ranks talk over it (cluster,
replicas); `lab down` removes the nodes, `lab up` replaces a node whose container must be made again; `images build
--on NODE` loads that node's CPU and memory with a build beside its engines (the memory guard may then stop them).
Each names what serves there and refuses (exit 1), unless told `--stop-deployments`: then those deployments are
stopped cleanly first (restart policy `no`, so neither Docker, a reboot nor the watcher starts them again, then
`docker stop`: SIGTERM, SIGKILL after the grace time), and `sparkdeploy up` starts them again afterwards (the plan
sees them stopped).

What stays allowed: `images push`/`pull` and `models pull` add layers and files; a running container keeps its
image ID and the weights it loaded, and a restart (by the watcher) starts the same container.

Read through the fact layer (the `state` set: our containers and their labels), one round trip per node.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.errors import StepFailed
from sparkdeploy.facts import ContainerFact, NodeFacts, gather_facts
from sparkdeploy.labels import DEPLOYMENT_LABEL, NOT_ENGINES, WATCHERS_LABEL
from sparkdeploy.runtime.remote import on_nodes
from sparkdeploy.runtime.session import Session

STOP_GRACE_S = 10
FLAG = "--stop-deployments"
MULTI_NODE = ("cluster", "replicas")


@dataclass
class Running:
    """One deployment that serves: the single one (`deployment` None) or one of a stack."""

    deployment: str | None
    what: str  # recipe / topology[ / backend]
    fabric: bool  # an engine over several nodes: its ranks talk over the fabric
    containers: dict[str, list[str]] = field(default_factory=dict)  # node -> its containers there

    @property
    def name(self) -> str:
        where = ", ".join(sorted(self.containers))
        label = f"stack deployment {self.deployment} ({self.what})" if self.deployment else self.what
        return f"{label} on {where}"


def _spans_nodes(c: ContainerFact) -> bool:
    return len((c.labels.get(WATCHERS_LABEL) or "").split()) > 1 or c.topology in MULTI_NODE


def find(facts: dict[str, NodeFacts | Exception], nodes: Sequence[str], fabric_only: bool = False) -> list[Running]:
    """The deployments with a running container on one of `nodes` (fabric_only: those whose engine spans nodes),
    each with all its containers on every node."""
    found: dict[str | None, Running] = {}
    for node, f in facts.items():
        if not isinstance(f, NodeFacts):
            continue
        for c in f.containers:
            if c.role == "guard" or not (c.running or c.restarting):
                continue
            key = c.labels.get(DEPLOYMENT_LABEL)
            what = " / ".join(x for x in (c.recipe, c.topology, c.label("backend")) if x and x != "none")
            run = found.setdefault(key, Running(key, what, False))
            if c.role not in NOT_ENGINES:
                run.what = what or run.what
                run.fabric = run.fabric or _spans_nodes(c)
            run.containers.setdefault(node, []).append(c.name)
    return [
        r for r in found.values() if any(n in nodes for n in r.containers) and (r.fabric or not fabric_only) and r.what
    ]


def read(inv: Inventory, nodes: Sequence[Node] | None = None) -> dict[str, NodeFacts | Exception]:
    with Session.open(inv) as session:
        return gather_facts(session, list(nodes if nodes is not None else inv.nodes))


def guard(
    inv: Inventory,
    doing: str,
    nodes: Sequence[str],
    stop_deployments: bool,
    say: Callable[[str], None],
    fabric_only: bool = False,
) -> list[Running]:
    """Before `doing` changes `nodes`: what serves there is refused (StepFailed naming each, nothing changed), or
    with stop_deployments stopped cleanly first. Returns what was stopped."""
    if not nodes:
        return []
    running = find(read(inv), nodes, fabric_only)
    if not running:
        return []
    why = " (its ranks talk over the fabric)" if fabric_only else ""
    if not stop_deployments:
        raise StepFailed(
            "; ".join(f"{doing} would break {r.name}{why}" for r in running)
            + f". Nothing was changed. Fix: {FLAG} stops it cleanly first (`sparkdeploy up` starts it again "
            "afterwards), or `sparkdeploy down` it yourself"
        )
    for r in running:
        stop(inv, r)
        say(f"stopped {r.name} before {doing} (restart policy no); `sparkdeploy up` starts it again")
    return running


def stop(inv: Inventory, run: Running) -> None:
    """Stop a deployment's containers on every node at once, cleanly: restart policy `no` first (nothing starts them
    again: Docker, a reboot or the watcher), then `docker stop` (SIGTERM, SIGKILL after STOP_GRACE_S)."""
    script = 'docker update --restart no "$@" >/dev/null && docker stop -t "$GRACE" "$@" >/dev/null'
    nodes = [inv.node(n) for n in run.containers]
    with Session.open(inv) as session:

        def one(node: Node) -> None:
            names = run.containers[node.name]
            r = session.conn(node).run(
                ["env", f"GRACE={STOP_GRACE_S}", "bash", "-c", script, "sparkdeploy-stop", *names],
                check=False,
                timeout=STOP_GRACE_S + 60,
            )
            if r.exit_code != 0:
                raise session.conn(node).failed(r, f"{node.name}: stopping {shlex.join(names)} failed")

        for o in on_nodes(nodes, one):
            if not o.ok:
                raise StepFailed(f"{o.node.name}: could not stop {run.name}: {o.error}; nothing else was changed")
