"""Read a set of facts from one node in ONE SSH command, and parse its output into NodeFacts (pure); read them on
every node of a run in parallel (`gather_facts`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import cast

from sparkdeploy.config.inventory import Node
from sparkdeploy.errors import StepFailed
from sparkdeploy.runtime.remote import NodeConnection, on_nodes
from sparkdeploy.runtime.session import Session

from .catalog import (
    ACCESS,
    CRASHES_SET,
    DAYZERO,
    DOCTOR,
    DOWN,
    FACTS,
    GUARD,
    HISTORY,
    IMAGE_STORE_SET,
    LEFTOVERS,
    PULL,
    PULL_DRY,
    RESOURCES,
    STATE,
    STORE_SET,
    TOP,
)
from .node import NodeFacts, hub_folder
from .parsers import parse_sections
from .script import FactArgs, script

FACTS_TIMEOUT_S = 60
SETS = {
    "state": STATE,
    "resources": RESOURCES,
    "all": tuple(dict.fromkeys((*STATE, *RESOURCES))),
    "doctor": DOCTOR,
    "dayzero": DAYZERO,
    "access": ACCESS,
    "down": DOWN,
    "leftovers": LEFTOVERS,
    "history": HISTORY,
    "top": TOP,
    "guard": GUARD,
    "image_store": IMAGE_STORE_SET,
    "crashes": CRASHES_SET,
    "store": STORE_SET,
    "pull": PULL,
    "pull_dry": PULL_DRY,
}


def parse(node: str, text: str) -> NodeFacts:
    """Turn the script's output into NodeFacts: each section through its fact's parser (pure: unit-tested
    without a node). A fact not in the output stays unread: reading its fields raises UnreadFact."""
    sections = parse_sections(text)
    f = NodeFacts.unread(node)
    for name, fact in FACTS.items():  # the registry's order: the state dir's files before their sums
        if name in sections:
            fact.store(f, fact.process(sections[name]))
    return f


def command(names: Iterable[str], args: FactArgs) -> list[str]:
    """The one command that reads the facts `names` (a set name of SETS, or fact names); `home` always."""
    if isinstance(names, str):
        names = SETS[names]
    wanted = [FACTS[n] for n in dict.fromkeys(("home", *names))]
    return ["bash", "-c", script(wanted), "sparkdeploy-facts", *args.argv()]


def gather(conn: NodeConnection, names: Iterable[str], args: FactArgs, timeout: float = FACTS_TIMEOUT_S) -> NodeFacts:
    """The facts `names` of the node behind `conn`, in one command (read-only)."""
    result = conn.run(command(names, args), check=False, timeout=timeout)
    facts = parse(conn.node.name, result.stdout)
    if not facts.has("home") or not facts.home:
        reason = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise StepFailed(
            f"{conn.node.name}: could not read the node's state (exit {result.exit_code}"
            + (": " + " | ".join(reason) if reason else "")
            + ")"
        )
    return facts


def read_facts(
    conn: NodeConnection,
    state_dir: str,
    images: Sequence[str] = (),
    hf_cache: str = "~",
    model: str = "",
    what: str = "state",
) -> NodeFacts:
    """Read the node's state in one SSH command (read-only). what: a set of SETS (state, resources, all, ...)."""
    args = FactArgs(
        state_dir=state_dir,
        hf_cache=hf_cache,
        model_folder=hub_folder(model) if model else "",
        fabric_ifaces=tuple(conn.node.fabric_ifaces),
        images=tuple(images),
    )
    return gather(conn, what, args)


def gather_facts(
    session: Session,
    nodes: list[Node],
    images_for: Callable[[Node], list[str]] = lambda n: [],
    hf_cache: str = "~",
    model: str = "",
    what: str = "state",
    state_dir: str | None = None,
) -> dict[str, NodeFacts | Exception]:
    """Facts of every node in parallel: the node's NodeFacts, or the exception that stopped the reading.
    state_dir: another state dir than the inventory's (a stack's deployment has its own)."""
    state_dir = state_dir or session.inventory.cluster.state_dir

    def one(node: Node) -> NodeFacts:
        return read_facts(session.conn(node), state_dir, images_for(node), hf_cache, model, what)

    return {o.node.name: cast("NodeFacts | Exception", o.value if o.ok else o.error) for o in on_nodes(nodes, one)}


def add_resources(
    session: Session, facts: dict[str, NodeFacts | Exception], names: set[str], hf_cache: str, model: str
) -> None:
    """Read memory, disk and the model cache on the named nodes (those where something starts)."""
    have = {name: f for name, f in facts.items() if name in names and isinstance(f, NodeFacts)}
    nodes = [n for n in session.inventory.nodes if n.name in have]
    for name, res in gather_facts(session, nodes, hf_cache=hf_cache, model=model, what="resources").items():
        if isinstance(res, NodeFacts):
            have[name].add_resources(res)
        else:
            facts[name] = res
