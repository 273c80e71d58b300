"""What ran, and going back: every successful `up` is one line of the local state's history, and `rollback`
brings an earlier one back.

A record holds what makes a deployment that deployment: the recipe's own text and the `--set` values (so the
same values render again whatever the recipe file says today), its hash, the topology and backend, the image
(tag, image ID, registry digest), the model and the commit the nodes hold (the hub revision, when the model was
pulled by sparkdeploy), the vLLM version the image carries, each node's NVIDIA driver (nvidia-smi), the nodes,
each container's config hash and the time. The file is JSON lines (`history/deployments.jsonl` in the local
state, sparkdeploy.paths.state_folder), one object per line, written by the serializer and appended whole.

Records are per cluster: each holds the cluster's identity (`cluster`: the nodes' pinned host keys, read from
the known_hosts files on this machine, or where a node has none pinned the inventory's cluster name and its
nodes' management addresses) and the inventory's absolute path. `history -i INV` lists that cluster's;
`rollback` takes the one before the newest of the inventory's cluster and refuses, in one line, a record made
on another cluster.

`rollback [ID]` (the deployment before the newest one by default) first checks that the record's image (by image
ID) and model (by commit) are still on its nodes; then it re-runs the deploy library with the recorded recipe
text, `--set` values, topology and backend. Anything missing is named with the command that restores it, and
nothing is changed (exit 1).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sparkdeploy import names, paths
from sparkdeploy.config.inventory import Inventory, Node, load_inventory
from sparkdeploy.config.schema import Whole, problems_from_validation
from sparkdeploy.config.userfile import MAX_FILE_BYTES, JsonSyntaxError, parse_json, read_text
from sparkdeploy.deploy.up_result import UpResult
from sparkdeploy.errors import ConfigError, Invalid, Problem, StepFailed
from sparkdeploy.facts import FactArgs, gather
from sparkdeploy.facts.catalog import HISTORY
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.images.image_ref import RegistryImage, is_reference
from sparkdeploy.models import up_check
from sparkdeploy.models.listing import presence
from sparkdeploy.models.ops import model_ref
from sparkdeploy.names import OneLine
from sparkdeploy.recipes.recipe import MODEL_NAME, BackendName, TopologyName
from sparkdeploy.runtime import localfiles
from sparkdeploy.runtime.remote import NodeConnection, on_nodes, pinned_fingerprints
from sparkdeploy.topologies.deployment import Deployment

FOLDER = "history"
FILE = "deployments.jsonl"


def cluster_identity(inventory: Inventory) -> str:
    """What makes the cluster that cluster: its nodes' pinned host keys (a copy of the inventory, another path to
    it or a renamed cluster is the same cluster; a reinstalled node is a new one); where a node has no key pinned,
    the inventory's cluster name and the nodes' management addresses (Inventory.cluster_id)."""
    prints = pinned_fingerprints(inventory)
    if prints and all(prints.values()):
        digest = hashlib.sha256(json.dumps(sorted(str(p) for p in prints.values())).encode()).hexdigest()[:16]
        return f"hostkeys-{digest}"
    return f"name-{inventory.cluster_id}"


def of_cluster(records: list[dict[str, Any]], cluster: str) -> list[dict[str, Any]]:
    """The records made on `cluster` (records from before clusters were recorded have none: never listed)."""
    return [r for r in records if r.get("cluster") == cluster]


HISTORY_ENV = "SPARKDEPLOY_HISTORY"  # another folder for the history (the test suite keeps its own)


def history_folder() -> Path:
    env = os.environ.get(HISTORY_ENV)
    return Path(env).expanduser() if env else paths.state_dir() / FOLDER


# The history grows by one record (a few KB: the recipe's text) per `up`: 64 MiB is thousands of deployments.
MAX_HISTORY_BYTES = 64 << 20
HEX64 = r"\A[0-9a-f]{64}\z"  # pydantic patterns are Rust regexes: \z is the very end


class Record(BaseModel):
    """One line of the history as read back: the file is in the local state, but a hand-edited or foreign line
    must not crash `history`, reach the terminal raw or steer `rollback` (a recipe name is a file name)."""

    model_config = ConfigDict(extra="allow")  # fields a newer sparkdeploy records are kept, unread

    id: Whole = Field(ge=1)
    time: OneLine = Field(max_length=64)
    recipe: names.PlainName
    recipe_hash: str | None = Field(default=None, pattern=HEX64)
    recipe_text: str | None = Field(default=None, max_length=MAX_FILE_BYTES)
    sets: list[str] = Field(default_factory=list)
    topology: TopologyName
    backend: BackendName | None = None
    image: OneLine | None = Field(default=None, max_length=512)
    image_tag: OneLine | None = Field(default=None, max_length=512)
    image_id: OneLine | None = Field(default=None, max_length=128)
    image_digest: OneLine | None = Field(default=None, max_length=128)
    vllm_version: OneLine | None = Field(default=None, max_length=64)
    model: str | None = None
    model_commit: str | None = Field(default=None, pattern=r"\A[0-9a-f]{40}\z")
    drivers: dict[names.NodeName, str | None] = Field(default_factory=dict)
    simulated: bool = False
    nodes: list[names.NodeName]
    inventory: OneLine | None = Field(default=None, max_length=4096)
    config_hashes: dict[str, str] = Field(default_factory=dict)
    stack: OneLine | None = Field(default=None, max_length=4096)
    deployment: names.DeploymentName | None = None
    cluster: OneLine | None = Field(default=None, max_length=256)  # cluster_identity()

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        if v is not None and not MODEL_NAME.fullmatch(v):
            raise Invalid(
                f"{v[:80]!r} is not a model name",
                "restore the line as `up` wrote it",
            )
        return v


ROLLBACK_NEEDS = ("recipe_hash", "recipe_text", "image", "image_tag")  # what `rollback` reads of a record


def history_file() -> Path:
    return history_folder() / FILE


def recipe_hash(text: str, sets: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps([text, list(sets)]).encode()).hexdigest()


def read_records() -> list[dict[str, Any]]:
    """Every record, oldest first, through the one door (userfile.py) and the Record schema: a line that is not
    JSON is skipped (a cut write); a line that is JSON but not a record (duplicate keys, too deep, a field of the
    wrong type) is refused, naming its line."""
    path = history_file()
    if not path.exists() and not path.is_symlink():
        return []
    fix = f"restore the line as `up` wrote it, or move {path} away (the history starts again)"
    text = read_text(path, "history", fix, limit=MAX_HISTORY_BYTES)
    out = []
    problems: list[Problem] = []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{path}: line {number}"
        try:
            data = parse_json(line, str(path), f"line {number}", fix)
        except JsonSyntaxError:
            continue
        except ConfigError as exc:
            problems += exc.problems
            continue
        if not isinstance(data, dict):
            problems.append(Problem(where, "", "is not a record (a JSON object)", fix))
            continue
        try:
            Record.model_validate(data)
        except ValidationError as exc:
            problems += problems_from_validation(exc, where, Record)
            continue
        out.append(data)
    if problems:
        raise ConfigError(problems)
    return out


def _append(data: dict[str, Any]) -> None:
    folder = paths.state_folder(path=history_folder())
    with open(folder / FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(data, sort_keys=True) + "\n")


def _node_facts(conns: dict[str, NodeConnection], nodes: list[Node], tag: str) -> dict[str, dict[str, str]]:
    """The image ID of `tag` and the GPU driver of each node: the facts set HISTORY, one command per node
    ("" where the node could not be read)."""

    def read(node: Node) -> dict[str, str]:
        f = gather(conns[node.name], HISTORY, FactArgs(images=(tag,)), timeout=30)
        first = f.gpu.gpus[0] if f.gpu is not None and f.gpu.gpus else {}
        return {"image_id": f.images.get(tag) or "", "driver": first.get("driver_version") or ""}

    out: dict[str, dict[str, str]] = {}
    for o in on_nodes(nodes, read):
        out[o.node.name] = o.value if o.ok else {"image_id": "", "driver": ""}
    return out


def record_deployment(
    dep: Deployment,
    conns: dict[str, NodeConnection],
    sets: Sequence[str],
    inventory_arg: str | None,
    simulated: bool = False,
    stack: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """After a successful `up`: append its record to the history and return it. stack: (stack file, deployment
    name) for a deployment of `up --stack` (recorded; `rollback` refuses it: the stack file says what runs)."""
    text = read_text(dep.recipe.source, "recipe")
    nodes = [nd.node for nd in dep.nodes]
    facts = _node_facts(conns, nodes, dep.image_tag)
    ref = up_check.model_of(dep)
    engines = up_check.engine_nodes(dep)
    commits: set[str] = set()
    if ref is not None and engines:
        commits = {p.commit for p in presence(conns, engines, dep.inventory.cluster.hf_cache, ref) if p.commit}
    image = dep.image
    image_ids = {f["image_id"] for f in facts.values() if f["image_id"]}
    previous = read_records()
    data: dict[str, Any] = {
        "id": (max(r["id"] for r in previous) + 1) if previous else 1,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "recipe": dep.recipe.name,
        "recipe_hash": recipe_hash(text, sets),
        "recipe_text": text,
        "recipe_file": str(dep.recipe.source),
        "sets": list(sets),
        "topology": dep.topology,
        "backend": dep.backend or None,
        "image": image.reference if isinstance(image, RegistryImage) else image.name,
        "image_tag": dep.image_tag,
        "image_id": sorted(image_ids)[0] if len(image_ids) == 1 else None,
        "image_digest": image.digest if isinstance(image, RegistryImage) else None,
        "vllm_version": image.vllm_version,
        "model": dep.recipe.recipe.model,
        "model_commit": sorted(commits)[0] if len(commits) == 1 else None,
        "drivers": {n: f["driver"] or None for n, f in facts.items()},
        "simulated": simulated,  # a lab stand-in ran: its driver is the simulated nvidia-smi's
        "nodes": [n.name for n in nodes],
        # absolute: `rollback` finds it from any directory (`inventory_arg` only for an inventory made in memory)
        "inventory": str(dep.inventory.path) if dep.inventory.path else inventory_arg,
        "cluster": cluster_identity(dep.inventory),
        "cluster_name": dep.inventory.cluster.name,
        "config_hashes": {f"{nd.node.name}/{c.name}": c.config_hash for nd in dep.nodes for c in nd.containers},
    }
    if stack is not None:
        data["stack"], data["deployment"] = stack
    _append(data)
    return data


def find(record_id: str | None, cluster: str | None = None) -> dict[str, Any]:
    """The record named by ID; with no ID, the one before the newest of `cluster` (None: of the newest record's
    cluster): what `rollback` undoes to."""
    records = read_records()
    if record_id is None:
        if cluster is None and records:
            cluster = records[-1].get("cluster")
        mine = of_cluster(records, cluster) if cluster is not None else records
        if len(mine) < 2:
            raise StepFailed(
                f"nothing to roll back to: the history holds {len(mine)} deployment(s) of this cluster "
                "(see sparkdeploy history -i INVENTORY)"
            )
        return mine[-2]
    for r in records:
        if str(r["id"]) == record_id.strip():
            return r
    known = ", ".join(str(r["id"]) for r in records[-10:]) or "none yet"
    raise ConfigError(
        Problem(str(history_file()), "ID", f"no deployment {record_id!r} in the history", f"one of {known}")
    )


def refuse_other_cluster(rec: dict[str, Any], inventory: Inventory) -> None:
    """A record made on another cluster than the inventory's: one line (exit 2), naming both."""
    cluster = rec.get("cluster")
    if cluster is None or cluster == cluster_identity(inventory):
        return
    where = rec.get("inventory") or "another inventory"
    raise ConfigError(
        Problem(
            inventory.source,
            "--inventory",
            f"deployment {rec['id']} ran on another cluster ({rec.get('cluster_name') or '?'}, {where}) than "
            f"this inventory's ({inventory.cluster.name})",
            f"pass the inventory it ran with: --inventory {shlex.quote(str(where))}"
            if rec.get("inventory")
            else "pick a deployment of this cluster: sparkdeploy history -i INVENTORY",
        )
    )


@dataclass
class Missing:
    node: str
    what: str
    fix: str

    def line(self) -> str:
        return f"{self.node}: {self.what}; restore: {self.fix}"


def _image_fix(rec: dict[str, Any], node: str) -> str:
    image = str(rec["image"])
    if is_reference(image):
        return f"sparkdeploy images pull {shlex.quote(image)} --on {shlex.quote(node)}"
    try:
        now = load_definition(image).tag
    except ConfigError:
        now = ""
    if now == rec["image_tag"]:
        return f"sparkdeploy images push {shlex.quote(image)} --to {shlex.quote(node)}"
    return (
        f"the definition {image} now builds {now or 'nothing'}: check out the commit that built "
        f"{rec['image_tag']}, then sparkdeploy images push {shlex.quote(image)} --to {shlex.quote(node)}"
    )


def missing(rec: dict[str, Any], inventory: Inventory) -> list[Missing]:
    """What the record needs that its nodes no longer hold: its image (by image ID) and model (by commit)."""
    try:
        nodes = [inventory.node(n) for n in rec["nodes"]]
    except ConfigError:
        raise ConfigError(
            Problem(
                inventory.source,
                "nodes",
                f"deployment {rec['id']} ran on {', '.join(rec['nodes'])}, not all in this inventory",
                f"pass the inventory it ran with: --inventory {rec.get('inventory') or 'PATH'}",
            )
        ) from None
    tag, image_id = rec["image_tag"], rec.get("image_id")
    out: list[Missing] = []
    conns = {n.name: NodeConnection(n, inventory) for n in nodes}
    try:
        for o in on_nodes(nodes, lambda n: _node_facts(conns, [n], tag)[n.name]["image_id"]):
            if not o.ok:
                out.append(Missing(o.node.name, f"unreachable ({o.error})", "bring the node back"))
            elif not o.value or (image_id and o.value != image_id):
                have = f" (it has {o.value[7:19]})" if o.value else ""
                out.append(
                    Missing(
                        o.node.name,
                        f"image {tag} {str(image_id or '')[7:19]} is gone{have}",
                        _image_fix(rec, o.node.name),
                    )
                )
        commit = rec.get("model_commit")
        if commit:
            ref = model_ref(rec["model"], commit)
            for p in presence(conns, nodes, inventory.cluster.hf_cache, ref):
                if p.state != "complete" or p.commit != commit:
                    inv = f" --inventory {shlex.quote(rec['inventory'])}" if rec.get("inventory") else ""
                    out.append(
                        Missing(
                            p.node,
                            f"model {rec['model']} at commit {commit[:12]} is not there ({p.detail})",
                            f"sparkdeploy models pull {shlex.quote(rec['model'])} --revision {commit}{inv}",
                        )
                    )
    finally:
        for conn in conns.values():
            conn.close()
    return out


def recipe_target(rec: dict[str, Any]) -> tuple[Path, str]:
    """Where the recorded recipe text goes back (folder, file name): under the local state, named after the
    recipe; checked to stay in that folder before anything is written (paths.confined)."""
    folder = history_folder() / "recipes"
    sub = paths.confined(folder, str(rec["recipe_hash"])[:16], "the record's recipe_hash")
    name = f"{rec['recipe']}.yaml"
    paths.confined(sub, name, "the record's recipe")
    return sub, name


def recipe_file(rec: dict[str, Any]) -> Path:
    """The recorded recipe text, written back under the local state (never through a symlink: localfiles)."""
    folder, name = recipe_target(rec)
    paths.state_folder(path=folder)
    fd = localfiles.open_folder(folder, private=True)
    try:
        localfiles.write_atomic(fd, name, str(rec["recipe_text"]), 0o600, folder / name)
    finally:
        os.close(fd)
    return folder / name


def rollback(
    record_id: str | None,
    inventory: str | None,
    dry_run: bool,
    deploy: Callable[..., UpResult],
    say: Callable[[str], None],
    **deploy_options: Any,
) -> UpResult:
    """Bring deployment `record_id` back. `deploy` is deploy.up.deploy (passed in: up imports this module)."""
    # The cluster: the inventory given (or found: SPARKDEPLOY_INVENTORY, ./inventory.yaml), else the record's.
    here = load_inventory(inventory) if inventory or Path("inventory.yaml").is_file() else None
    rec = find(record_id, cluster_identity(here) if here is not None and record_id is None else None)
    if rec.get("stack"):
        raise ConfigError(
            Problem(
                str(rec["stack"]),
                f"deployments ({rec.get('deployment')})",
                f"deployment {rec['id']} ran as part of this stack: the stack file says what runs there, so "
                "rollback does not bring one of its deployments back",
                f"edit {rec.get('deployment')}'s entry in the stack file (recipe, set) and run "
                f"`sparkdeploy up --stack {shlex.quote(str(rec['stack']))}`",
            )
        )
    lacking = [k for k in ROLLBACK_NEEDS if not rec.get(k)]
    if lacking:
        raise ConfigError(
            Problem(
                f"{history_file()}: deployment {rec['id']}",
                ", ".join(lacking),
                "missing: the record cannot bring the deployment back",
                "roll back to another deployment (sparkdeploy history), or run `up` with the recipe",
            )
        )
    recipe_target(rec)  # the record's names stay in the state folder: checked before anything connects or writes
    inventory_arg = str(here.path) if here is not None and here.path else rec.get("inventory")
    inv = here if here is not None else load_inventory(inventory_arg)
    refuse_other_cluster(rec, inv)
    gone = missing(rec, inv)
    if gone:
        raise StepFailed(
            f"cannot roll back to deployment {rec['id']} ({rec['recipe']} / {rec['topology']}, {rec['time']}): "
            + "; ".join(m.line() for m in gone)
            + ". Nothing was changed."
        )
    say(f"rolling back to deployment {rec['id']}: {rec['recipe']} / {rec['topology']} from {rec['time']}")
    deploy_options.setdefault("result", UpResult()).rolled_back_to = rec["id"]
    return deploy(
        recipe=str(recipe_file(rec)),
        topology=rec["topology"],
        backend=rec.get("backend"),
        inventory=inventory_arg,
        sets=rec.get("sets") or [],
        dry_run=dry_run,
        **deploy_options,
    )
