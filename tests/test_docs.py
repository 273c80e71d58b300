"""The docs name what exists: every repository path written in backticks in README.md and docs/*.md, and every
relative link there, is a file or folder of the checkout."""

from __future__ import annotations

import re

import pytest

from tests.conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# the checkout's own top-level entries (tracked ones: not the venvs or build output)
TOP = {p.name for p in REPO.iterdir()} - {".git", ".venv", ".venv-litellm", "sparkdeploy.egg-info", "build", "dist"}
BACKTICKED = re.compile(r"`([^`\s]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def repo_paths(text: str) -> list[str]:
    """Backticked words that are paths from the repository root: `images/vllm-check/check_image.py`,
    `sparkdeploy/daytwo/top.py:scrape`. Not patterns (`images/<name>/`, `*.yaml`) nor ranges (`run1..5/`)."""
    out = []
    for word in BACKTICKED.findall(text):
        if "/" not in word or word.split("/", 1)[0] not in TOP or re.search(r"[<>*{}$|\[\]]|\.\.", word):
            continue
        out.append(re.split(r"[:#]", word, maxsplit=1)[0])
    return out


def test_repo_paths_finds_paths_and_skips_patterns():
    text = (
        "see `images/vllm-check/check_image.py`, `sparkdeploy/daytwo/top.py:scrape`, `images/<name>/manifest.yaml`, "
        "`docs/figures/run1..5/`, `~/.cache/x`, `vllm serve`, `nodes/spark1.yaml`"
    )
    assert repo_paths(text) == ["images/vllm-check/check_image.py", "sparkdeploy/daytwo/top.py"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_paths_and_links_in_docs_exist(doc):
    text = doc.read_text()
    missing = [f"`{p}`" for p in repo_paths(text) if not (REPO / p).exists()]
    for target in LINK.findall(text):
        target = target.split("#", 1)[0]
        if target and "://" not in target and not target.startswith("mailto:") and not (doc.parent / target).exists():
            missing.append(f"link {target}")
    assert not missing, f"{doc.relative_to(REPO)} names what the checkout lacks: {', '.join(missing)}"


def test_readme_examples_are_the_shipped_files():
    """Issue 30: the README's recipe example differed from the shipped file. Each example marked
    `<!-- the shipped PATH ... -->` must be that file, byte for byte; the recipe and the inventory are marked."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"<!-- the shipped (\S+) [^>]*-->\n```yaml\n(.*?)```\n", text, re.S)
    assert {path for path, _ in blocks} >= {"recipes/openai-gpt-oss-120b.yaml", "inventory.yaml"}, blocks
    for path, body in blocks:
        assert body == (REPO / path).read_text(), f"README's example of {path} differs from the file"


def test_the_readmes_day_zero_commands_are_what_the_bare_lab_prints():
    """`sparkdeploy lab up --bare` prints the README's five day-zero commands for its nodes
    (tests/dayzero/test_bare_lab.py runs them, as the README writes them, on the bare lab)."""
    from sparkdeploy.lab.bare import dayzero_commands
    from tests.support.readme import README_HOSTS, dayzero_commands_in_readme

    assert dayzero_commands_in_readme() == dayzero_commands(README_HOSTS)
