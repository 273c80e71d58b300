"""A fact that was not read is not an empty one (issue 37 item 3): facts parsed from a node hold only what their
set read; reading a field of a fact not asked for raises UnreadFact naming the node, the field and the fact."""

from __future__ import annotations

import pytest

from sparkdeploy.facts import FACTS, NodeFacts, UnreadFact, parse
from sparkdeploy.facts.node import FACT_FIELDS, FIELD_FACT

STATE_ONLY = (
    "@@sparkdeploy-facts@@ home\n/home/spark\n"
    "@@sparkdeploy-facts@@ inspect\n\n@@sparkdeploy-facts@@ inspect.rc 1\n"
    "@@sparkdeploy-facts@@ statedir\n\n@@sparkdeploy-facts@@ statedir.rc 1\n"
)


def test_reading_an_unread_fact_raises_naming_the_fact_and_the_node():
    f = parse("spark2", STATE_ONLY)
    assert f.home == "/home/spark" and f.containers == [] and f.state_dir_mode is None  # read, and empty
    with pytest.raises(UnreadFact) as exc:
        _ = f.gpu  # the resources were never asked for: not "no GPU"
    assert (exc.value.node, exc.value.field, exc.value.fact) == ("spark2", "gpu", "gpu")
    assert "spark2" in str(exc.value) and "'gpu' was not read" in str(exc.value)
    with pytest.raises(UnreadFact, match=r"NodeFacts\.gpu_mem_free_mb"):
        _ = f.free_memory_mb
    assert f.has("inspect") and f.has("statedir") and not f.has("gpu") and not f.has("meminfo")
    assert "gpu=<unread>" in repr(f)


def test_an_unknown_attribute_is_still_an_attribute_error():
    f = parse("spark1", STATE_ONLY)
    with pytest.raises(AttributeError):
        _ = f.no_such_field  # type: ignore[attr-defined]  # the point: not a fact, a plain AttributeError
    assert getattr(f, "__deepcopy__", None) is None


def test_every_field_names_a_registered_fact_and_every_fact_fills_a_field():
    assert set(FIELD_FACT.values()) == set(FACTS) - {"sha"}  # sha fills the sha256 of `files`' FileFacts
    assert set(FIELD_FACT) | {"node"} == set(NodeFacts.__dataclass_fields__)


def test_copies_keep_unread_fields_unread_and_resources_are_taken_whole():
    f = parse("spark1", STATE_ONLY)
    g = f.with_containers([])
    assert g is not f and g == f and not g.has("gpu")
    res = parse("spark1", "@@sparkdeploy-facts@@ home\n/home/spark\n@@sparkdeploy-facts@@ meminfo\n")
    with pytest.raises(UnreadFact):  # meminfo read, the GPU not: taking the resources says so
        f.add_resources(res)


def test_hand_made_facts_count_as_read():
    f = NodeFacts("spark1", home="/home/spark")
    assert f.gpu is None and f.containers == [] and all(f.has(fact) for fact in FACT_FIELDS)


def _as_read_with(names: tuple[str, ...], node: str) -> NodeFacts:
    """A real lab node's facts (every fact's sample) as a reader asking only `names` holds them."""
    from pathlib import Path

    f = parse(node, (Path(__file__).parent / "samples" / "lab-every-fact.txt").read_text())
    for name, fact in FIELD_FACT.items():
        if fact not in names:
            del f.__dict__[name]
    return f


def test_up_s_preflight_reads_only_the_facts_up_asks_for():
    """`up` reads STATE everywhere and RESOURCES where something starts; every preflight check runs over that.
    A check reading a fact outside it read an empty default before (access.docker's user, access.state_dir's
    state_dirs, engine.running's driver, gpu.memory and engine.disk's `resources` flag): now it would raise."""
    from sparkdeploy.deploy import preflight
    from sparkdeploy.facts.catalog import RESOURCES, STATE
    from sparkdeploy.guard.lines import check_lines
    from tests.deploy.deploy_helpers import make_deployment

    dep = make_deployment("cluster")
    facts: dict[str, NodeFacts | Exception] = {
        "spark1": _as_read_with((*STATE, *RESOURCES), "spark1"),  # something starts here
        "spark2": _as_read_with(STATE, "spark2"),  # nothing new: the resources are not read
    }
    rows = preflight.run(dep, facts)
    assert rows and {r.check for r in rows} >= {"docker", "state-dir", "ports"}
    check_lines(dep, facts)  # the guard lines, checked against the memory where it was read
