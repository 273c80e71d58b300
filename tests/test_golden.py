"""Golden files: the dry run of every recipe x supported topology x backend, byte for byte.

Image tags and config hashes are content hashes of files that change often (image definitions), so they
are normalised; everything else must match. Regenerate after an intended change with:
    UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py
and review the diff like code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from sparkdeploy.topologies.dryrun import as_text, describe
from tests.test_render import all_deployments, deployment

GOLDEN = Path(__file__).parent / "golden"
HASHES = [
    (re.compile(r"(sparkdeploy/[a-z0-9-]+):[0-9a-f]{12}"), r"\1:<content-hash>"),
    (re.compile(r"(io\.sparkdeploy\.config-hash=)[0-9a-f]{16}"), r"\1<config-hash>"),
]


def normalise(text: str) -> str:
    for pattern, repl in HASHES:
        text = pattern.sub(repl, text)
    return text


def golden_name(recipe: str, topo: str, backend: str | None) -> str:
    return f"{recipe}__{topo}" + (f"__{backend}" if backend else "") + ".txt"


@pytest.mark.parametrize("recipe,topo,backend", all_deployments(), ids=lambda v: str(v) if v is not None else "-")
def test_dry_run_matches_golden(recipe, topo, backend):
    text = normalise(as_text(describe(deployment(topo, backend, recipe=recipe))))
    path = GOLDEN / golden_name(recipe, topo, backend)
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.is_file(), f"missing golden file {path.name}: run with UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text()


def test_no_stale_golden_files():
    expected = {golden_name(*combo) for combo in all_deployments()}
    assert {p.name for p in GOLDEN.glob("*.txt")} == expected
