"""Read a set of facts from one node in ONE SSH command, and parse its output into NodeFacts (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sparkdeploy.errors import StepFailed
from sparkdeploy.remote import NodeConnection

from .base import FactArgs, script
from .catalog import ACCESS, DAYZERO, DOCTOR, DOWN, FACTS, LEFTOVERS, RESOURCES, STATE
from .node import NodeFacts, hub_folder
from .parsers import parse_sections

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
}


def parse(node: str, text: str) -> NodeFacts:
    """Turn the script's output into NodeFacts: each section through its fact's parser (pure: unit-tested
    without a node). A fact not in the output leaves its field at the default."""
    sections = parse_sections(text)
    f = NodeFacts(node=node)
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
    if not facts.home:
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
