"""This machine's side of the node programs (nodeside/models.py, nodeside/hub_client.py): the argv that runs
them, their JSON, their errors as one line."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from sparkdeploy.config.inventory import Node
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.nodeside import ship
from sparkdeploy.recipes.engines.registered import engine_of
from sparkdeploy.runtime.remote import NodeConnection
from sparkdeploy.topologies.deployment import Deployment

Json = dict[str, Any]  # an answer of nodeside's models program or the hub client, as JSON decoded it

REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
REVISION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")


@dataclass(frozen=True)
class ModelRef:
    repo: str
    revision: str = "main"
    include: tuple[str, ...] = ()  # file patterns: only these files of the repo (one quant of a GGUF repo)

    def __str__(self) -> str:
        return self.repo if self.revision == "main" else f"{self.repo}@{self.revision}"


def model_ref(
    repo: str, revision: str | None, source: str = "--revision", include: tuple[str, ...] | list[str] = ()
) -> ModelRef:
    problems = []
    for pattern in include:
        if not pattern or len(pattern) > 256 or pattern.startswith("-") or any(ord(c) < 32 for c in pattern):
            problems.append(
                Problem("models", "--include", f"{pattern!r} is not a file pattern", "e.g. --include 'Q4_K_M/*'")
            )
    if not REPO_RE.fullmatch(repo) or ".." in repo:
        problems.append(
            Problem(
                "models",
                repo,
                "is not a Hugging Face model id",
                "give ORG/NAME (e.g. openai/gpt-oss-120b) or a recipe name",
            )
        )
    rev = revision or "main"
    if not REVISION_RE.fullmatch(rev) or ".." in rev:
        problems.append(Problem("models", source, f"{rev!r} is not a revision", "a branch, tag or commit hash"))
    if problems:
        raise ConfigError(problems)
    return ModelRef(repo, rev, tuple(include))


def recipe_ref(dep: Deployment, revision: str | None = None, include: tuple[str, ...] = ()) -> ModelRef:
    """The recipe's model with the files its engine reads (llama.cpp: one GGUF quant; `include` overrides)."""
    recipe = dep.recipe.recipe
    files = include or tuple(engine_of(recipe).model_files(recipe))
    return model_ref(recipe.model, revision, include=files)


def hub_image_tag(dep: Deployment) -> str:
    """The image the hub client runs in on the download node: the engine's own (vLLM's carry huggingface_hub),
    or the one its engine names (llama.cpp's image has no Python: the LiteLLM proxy's, which has it)."""
    name = engine_of(dep.recipe.recipe).hub_image
    return load_definition(name).tag if name else dep.image_tag


def recipe_refs(
    model: str,
    draft: str | None,
    draft_revision: str | None,
    revision: str | None = None,
    include: tuple[str, ...] = (),
) -> list[ModelRef]:
    """What a recipe needs in the HF cache: its model, then its speculative draft (issue 39: the draft is part of
    the model; pulled, checked and counted with it). A name that is no hub id (a local path) has nothing to pull;
    a draft that is the model itself (mtp from the model's own layers) is not counted twice."""
    refs = []
    wanted = ((model, revision, "--revision", include), (draft, draft_revision, "speculative.revision", ()))
    for repo, rev, source, files in wanted:  # `include`: the files of the model its engine reads (one GGUF quant)
        if not repo:
            continue
        try:
            ref = model_ref(repo, rev, source, include=files)
        except ConfigError:
            if REPO_RE.fullmatch(repo) and ".." not in repo:
                raise  # a hub id with a bad revision: the revision's problem
            continue
        if ref not in refs:
            refs.append(ref)
    return refs


def folder(repo: str) -> str:
    """The hub cache's folder name of a model (models--ORG--NAME)."""
    return "models--" + repo.replace("/", "--")


def nodeside_argv(cmd: str, hf_cache: str, *args: str) -> list[str]:
    """nodeside's `models` program (nodeside/models.py), shipped whole in the command."""
    return ship.argv("models", cmd, hf_cache, *args)


def run_json(
    conn: NodeConnection, argv: list[str], what: str, stdin: str | None = None, timeout: float | None = 600
) -> Json:
    result = conn.run(argv, check=False, stdin=stdin, timeout=timeout)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("{")]
    if result.exit_code != 0 and not lines:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise StepFailed(f"{conn.node.name}: {what} failed (exit {result.exit_code}): {tail[0]}")
    try:
        data: Json = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise StepFailed(f"{conn.node.name}: {what} gave no answer: {result.stdout[-200:]!r}") from None
    data["_exit"] = result.exit_code
    return data


def status(conn: NodeConnection, hf_cache: str, repo: str | None = None, verify: bool = False) -> Json:
    argv = nodeside_argv("status", hf_cache, *([repo] if repo else []), *(["--verify"] if verify else []))
    return run_json(conn, argv, "reading the model cache", timeout=None if verify else 600)


def have(conn: NodeConnection, hf_cache: str, repo: str) -> Json:
    return run_json(conn, nodeside_argv("have", hf_cache, repo), "listing the model's blobs")


def finish(conn: NodeConnection, hf_cache: str, manifest: Json) -> Json:
    return run_json(
        conn, nodeside_argv("finish", hf_cache), "verifying the model", stdin=json.dumps(manifest), timeout=None
    )


def complete_commit(state: Json, ref: ModelRef) -> Json | None:
    """The recorded model matching `ref` (its revision or commit) whose files all verified, if any."""
    for m in state.get("models", []):
        if m["repo"] == ref.repo and ref.revision in (m["revision"], m["commit"]) and not m["bad"]:
            model: Json = m
            return model
    return None


def recorded(state: Json, ref: ModelRef) -> Json | None:
    for m in state.get("models", []):
        if m["repo"] == ref.repo and ref.revision in (m["revision"], m["commit"]):
            model: Json = m
            return model
    return None


def describe_bad(bad: dict[str, str], limit: int = 3) -> str:
    words = {"missing": "missing", "size": "wrong size", "digest": "content does not match its digest"}
    items = [f"{path} ({words.get(state, state)})" for path, state in sorted(bad.items())]
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def pull_command(ref: ModelRef, inventory_arg: str | None) -> str:
    argv = ["sparkdeploy", "models", "pull", ref.repo]
    if ref.revision != "main":
        argv += ["--revision", ref.revision]
    if inventory_arg:
        argv += ["--inventory", inventory_arg]
    return shlex.join(argv)


def recipe_pull_command(recipe: str, inventory_arg: str | None) -> str:
    """`models pull RECIPE`: the recipe's model and its speculative draft."""
    return shlex.join(
        ["sparkdeploy", "models", "pull", recipe, *(["--inventory", inventory_arg] if inventory_arg else [])]
    )


def engine_nodes_text(nodes: list[Node]) -> str:
    return ", ".join(n.name for n in nodes)
