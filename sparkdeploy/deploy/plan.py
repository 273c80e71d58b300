"""Compare a Deployment with what the nodes have (facts) and list, per node and in order, the steps to converge.

Pure logic: no SSH here (apply.py runs the steps). Every step is listed, also those with nothing to do
(`change=False`: reported `ok`), so each run shows per node what was checked and what changed.

Per node, two phases (apply runs phase 1 on every node before phase 2 starts anywhere):
  1. remove our containers that are not part of this deployment (another recipe or topology: the old one goes
     down first, on every node), the state dir (0700), leftover temp files, the manifest (listing new names
     before they are written), the files (by sha256 and mode), files of ours that are no longer rendered;
  2. (re)start each container whose config-hash label, image ID or state differs, then the final manifest.
A node of the inventory that the deployment does not use gets only removals (what `down` does).

Files are compared by sha256, containers by their config-hash label and image ID: the config hash covers
everything the container is made of, so changing one recipe value restarts only what depends on it. The
ranks of a cluster are one engine: when one rank restarts, every rank restarts.

`up` converges to serving, not only to running: a container whose Docker health check fails is restarted
("unhealthy since HH:MM:SS UTC: engine dead: RankFailure ..."), and a group that lost a rank while it served
restarts whole ("restart group: rank 1 (spark2) exited at HH:MM:SS UTC while the group served"), its head first
(apply.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sparkdeploy.config.guard_settings import GUARD_FOLDER
from sparkdeploy.config.inventory import Node
from sparkdeploy.doctor import DOCTOR_FOLDER
from sparkdeploy.facts import MANIFEST, ContainerFact, NodeFacts, safe_name
from sparkdeploy.facts.catalog import ENGINE_DEAD
from sparkdeploy.nodeside.guard import groups
from sparkdeploy.topologies.deployment import ContainerSpec, Deployment, FileSpec, NodeDeployment

OK, CHANGED, FAILED, SKIPPED, PENDING = "ok", "changed", "failed", "skipped", "pending"
STATE_DIR_MODE = 0o700


class StepKind(StrEnum):
    """What a step does on its node; the values are what --json and the tables show (apply.HANDLERS runs each)."""

    REMOVE_CONTAINER = "remove-container"
    STATE_DIR = "state-dir"
    REMOVE_FILE = "remove-file"
    WRITE = "write"
    CHMOD = "chmod"
    MANIFEST = "manifest"
    START_CONTAINER = "start-container"
    CREATE_CONTAINER = "create-container"  # an on-demand stack member's engine: created, not started (issue 40)
    RMDIR = "rmdir"
    REMOVE_FOLDER = "remove-folder"


# The folder `doctor --nccl` writes in the state dir (its probe, node.env, result.json): sparkdeploy's, so `down`
# removes it with the rest. The one subfolder of the state dir that is ours; any other stays.
OUR_FOLDERS = {DOCTOR_FOLDER: "doctor --nccl's probe files", GUARD_FOLDER: "the memory guard's black box and status"}
# What the stack gateway keeps in its state dir beside `up`'s files: `sparkdeploy keys`' store and the tokens each
# key spent (the gateway's writable volume). Kept by `down` on purpose (a later `up --stack` serves the same keys);
# `down --keys` removes them (plan_removal's `also`).
KEYS_FILE = "keys.json"
SPEND_FOLDER = "spend"
GATEWAY_KEPT = {KEYS_FILE: "the gateway's keys", SPEND_FOLDER: "the tokens each gateway key spent"}


@dataclass(kw_only=True)  # built with keywords: eight of its fields would be easy to swap by position
class Step:
    node: str
    phase: int
    kind: StepKind
    target: str
    change: bool
    reason: str = ""
    file: FileSpec | None = None
    container: ContainerSpec | None = None
    container_id: str | None = None  # an existing container this step removes or replaces
    mode: int | None = None
    status: str = PENDING
    detail: str = ""
    # a change only because another rank of its engine restarts (_restart_together): this node's own state was as
    # wanted (preflight's memory check counts only a node whose own engine changes: `PreflightRun.starts_engine`)
    with_group: bool = False

    @property
    def label(self) -> str:
        return f"{self.kind} {self.target}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "phase": self.phase,
            "step": self.kind,
            "target": self.target,
            "change": self.change,
            "reason": self.reason,
            "status": self.status,
            "detail": self.detail,
        }


@dataclass
class NodePlan:
    node: Node
    state_dir: str  # absolute path on the node
    steps: list[Step] = field(default_factory=list)
    deployment: NodeDeployment | None = None  # None: the node only has things removed

    @property
    def changes(self) -> list[Step]:
        return [s for s in self.steps if s.change]

    def phase(self, n: int) -> list[Step]:
        return [s for s in self.steps if s.phase == n]

    def add(self, *, phase: int, kind: StepKind, target: str, change: bool, reason: str, **more: Any) -> None:
        """A step on this plan's node, appended (more: Step's file, container, container_id or mode)."""
        self.steps.append(
            Step(node=self.node.name, phase=phase, kind=kind, target=target, change=change, reason=reason, **more)
        )


@dataclass
class Plan:
    nodes: list[NodePlan]

    @property
    def steps(self) -> list[Step]:
        return [s for n in self.nodes for s in n.steps]

    @property
    def changes(self) -> int:
        return sum(1 for s in self.steps if s.change)

    def counts(self) -> dict[str, int]:
        out = {OK: 0, CHANGED: 0, FAILED: 0, SKIPPED: 0, PENDING: 0}
        for s in self.steps:
            out[s.status] = out.get(s.status, 0) + 1
        return out

    def failed(self) -> list[Step]:
        return [s for s in self.steps if s.status == FAILED]

    def node(self, name: str) -> NodePlan:
        return next(n for n in self.nodes if n.node.name == name)


def state_dir_path(facts: NodeFacts, state_dir: str) -> str:
    return f"{facts.home.rstrip('/')}/{state_dir}"


def describe(dep: Deployment) -> dict[str, Any]:
    """The deployment a manifest records (a stack's gateway passes its own: deploy/stack/converge.py)."""
    return {
        "recipe": dep.recipe.name,
        "topology": dep.topology,
        "backend": dep.backend or None,
        "model": dep.model_name,
        "endpoint": dep.endpoint,
        "backends": list(dep.backends),
    }


def manifest_text(dep: Deployment | dict[str, Any], nd: NodeDeployment, extra_files: Sequence[str] = ()) -> str:
    """What the manifest says: the files and containers this tool made on the node, and the deployment they
    belong to (what `down` removes and `status` shows). Deterministic, so an unchanged deployment rewrites
    nothing. `extra_files`: names written by an earlier run that are still on the node (kept listed until
    removed, so an interrupted run never loses track of a file)."""
    names = sorted({f.name for f in nd.files} | {n for n in extra_files if safe_name(n) and n != MANIFEST})
    data = {
        "managed_by": "sparkdeploy",
        **(dep if isinstance(dep, dict) else describe(dep)),
        "node": nd.node.name,
        "role": nd.node.role,
        "files": names,
        "containers": [
            {
                "name": c.name,
                "role": c.role,
                "image": c.image,
                "config_hash": c.config_hash,
                "ports": list(c.ports),
                "health_port": c.health_port,
            }
            for c in nd.containers
        ],
    }
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def _manifest_spec(text: str) -> FileSpec:
    return FileSpec(MANIFEST, text, mode=0o644)


def _container_reason(spec: ContainerSpec, facts: NodeFacts) -> str | None:
    """Why the container must be (re)started, or None when it is as wanted."""
    have = facts.container(spec.name)
    if have is None:
        return "missing"
    if have.config_hash != spec.config_hash:
        return f"config-hash {have.config_hash or '(none)'} -> {spec.config_hash}"
    want_id = facts.images.get(spec.image)
    if want_id and have.image_id != want_id:
        return f"image {short_id(have.image_id)} -> {short_id(want_id)}"
    if not have.running:
        return f"{have.status or 'not running'} (exit {have.exit_code})"
    why = facts.engine_errors.get(spec.name) or have.health_output
    if failing(have, facts.engine_errors.get(spec.name, "")):  # running, not serving: converge to serving
        since = f" since {clock(have.failing_since)}" if have.failing_since else ""  # None: Docker counts no streak
        return f"{UNHEALTHY}{since}" + (f": {why}" if why else "")
    return None


def failing(c: ContainerFact, engine_error: str = "") -> bool:
    """Docker marks it unhealthy (3 failed probes, ~15 s); or its last probe got HTTP 503 (an engine answers 503 on
    /health when it is dead, not when it is slow) and it served before (Docker says healthy), or its log says the
    engine died (Docker still says `starting` when it died before Docker's first passing probe)."""
    if c.health == "unhealthy":
        return True
    if not c.health_output.startswith("HTTP Error 503"):
        return False
    return c.health == "healthy" or (c.health == "starting" and re.search(ENGINE_DEAD, engine_error) is not None)


UNHEALTHY = "unhealthy"
RESTART_GROUP = "restart group"


def clock(when: datetime | None) -> str:
    """A time in a plan's reason: HH:MM:SS UTC (the nodes' clocks, as Docker reports them)."""
    return when.astimezone(UTC).strftime("%H:%M:%S UTC") if when is not None else "?"


def short_id(image_id: str | None) -> str:
    if not image_id:
        return "-"
    return image_id.removeprefix("sha256:")[:12]


def plan_removal(
    node: Node,
    facts: NodeFacts,
    state_dir: str,
    why: str = "not part of this deployment",
    also: dict[str, str] | None = None,
) -> NodePlan:
    """Everything of ours goes: containers by label, files listed in the manifest, temp files, the manifest.
    also: more names of the state dir to remove (files or folders) with why (`down --keys`: GATEWAY_KEPT)."""
    also = also or {}
    sd = state_dir_path(facts, state_dir)
    plan = NodePlan(node=node, state_dir=sd)
    for c in facts.containers:
        reason = _other_reason(c, why)
        plan.add(phase=1, kind=StepKind.REMOVE_CONTAINER, target=c.name, change=True, reason=reason, container_id=c.id)
    for name in facts.temp_files:
        plan.add(phase=1, kind=StepKind.REMOVE_FILE, target=name, change=True, reason="leftover temp file")
    for name in facts.manifest_files:
        if name in facts.files and name != MANIFEST:
            plan.add(phase=1, kind=StepKind.REMOVE_FILE, target=name, change=True, reason="listed in the manifest")
    if MANIFEST in facts.files:
        plan.add(phase=1, kind=StepKind.REMOVE_FILE, target=MANIFEST, change=True, reason="ours")
    for name, what in also.items():
        if name in facts.files:
            plan.add(phase=1, kind=StepKind.REMOVE_FILE, target=name, change=True, reason=what)
    for folder, what in {**OUR_FOLDERS, **also}.items():
        if folder in facts.other_entries:
            plan.add(phase=1, kind=StepKind.REMOVE_FOLDER, target=folder, change=True, reason=what)
    if facts.state_dir_mode is not None:
        ours = set(facts.manifest_files) | set(facts.temp_files) | {MANIFEST} | set(also)
        others = [n for n in facts.files if n not in ours] + [
            n + "/" for n in facts.other_entries if n not in OUR_FOLDERS and n not in also
        ]
        if others:  # never remove what we did not write
            kept = f"kept: holds what `up` did not write ({', '.join(sorted(others)[:3])})"
            plan.add(phase=1, kind=StepKind.RMDIR, target=sd, change=False, reason=kept)
        else:
            plan.add(phase=1, kind=StepKind.RMDIR, target=sd, change=True, reason="empty once our files are gone")
    return plan


def _other_reason(c: ContainerFact, why: str) -> str:
    if c.recipe or c.topology:
        return f"{why} ({c.recipe or '?'} / {c.topology or '?'} / {c.role or '?'})"
    return why


def _old_and_state_dir(plan: NodePlan, nd: NodeDeployment, facts: NodeFacts) -> None:
    """Phase 1's start: the old containers go first, the state dir is made 0700, leftover temp files go."""
    add = plan.add
    wanted = {c.name for c in nd.containers}
    for other in facts.containers:
        if other.name not in wanted:
            reason = _other_reason(other, "not part of this deployment")
            add(
                phase=1,
                kind=StepKind.REMOVE_CONTAINER,
                target=other.name,
                change=True,
                reason=reason,
                container_id=other.id,
            )
    sd = plan.state_dir
    if facts.state_dir_mode is None:
        add(phase=1, kind=StepKind.STATE_DIR, target=sd, change=True, reason="missing", mode=STATE_DIR_MODE)
    elif facts.state_dir_mode != STATE_DIR_MODE:
        reason = f"mode {facts.state_dir_mode:04o} -> 0700"
        add(phase=1, kind=StepKind.STATE_DIR, target=sd, change=True, reason=reason, mode=STATE_DIR_MODE)
    else:
        add(phase=1, kind=StepKind.STATE_DIR, target=sd, change=False, reason="exists, 0700")
    for name in facts.temp_files:
        reason = "leftover temp file of an interrupted run"
        add(phase=1, kind=StepKind.REMOVE_FILE, target=name, change=True, reason=reason)


def _file_steps(plan: NodePlan, dep: Deployment | dict[str, Any], nd: NodeDeployment, facts: NodeFacts) -> None:
    """Phase 1's files: new names listed in the manifest first, each file by sha256 and mode, ours no longer
    rendered removed."""
    add = plan.add
    names = {f.name for f in nd.files}
    old = [n for n in facts.manifest_files if n in facts.files]
    if names - set(facts.manifest_files):
        # list new names before writing them: an interrupted run never leaves a file of ours unlisted
        listed = _manifest_spec(manifest_text(dep, nd, old))
        reason = "list the new files before writing them"
        add(phase=1, kind=StepKind.MANIFEST, target=MANIFEST, change=True, reason=reason, file=listed)

    for f in nd.files:  # each step carries the file and its mode
        have_file = facts.files.get(f.name)
        if have_file is None:
            kind, change, reason = StepKind.WRITE, True, "missing"
        elif have_file.sha256 != f.sha256:
            kind, change, reason = StepKind.WRITE, True, "content differs (sha256)"
        elif have_file.mode != f.mode:
            kind, change, reason = StepKind.CHMOD, True, f"mode {have_file.mode:04o} -> {f.mode:04o}"
        else:
            kind, change, reason = StepKind.WRITE, False, "same sha256 and mode"
        add(phase=1, kind=kind, target=f.name, change=change, reason=reason, file=f, mode=f.mode)
    for name in old:
        if name not in names and name != MANIFEST:
            add(phase=1, kind=StepKind.REMOVE_FILE, target=name, change=True, reason="ours, no longer rendered")


def _container_steps(plan: NodePlan, nd: NodeDeployment, facts: NodeFacts) -> None:
    """Phase 2: each container (re)started where its config hash, image or state differs."""
    for c in nd.containers:
        why = _container_reason(c, facts)
        have = facts.container(c.name)
        reason = f"running, config-hash {c.config_hash}" if why is None else why
        plan.add(
            phase=2,
            kind=StepKind.START_CONTAINER,
            target=c.name,
            change=why is not None,
            reason=reason,
            container=c,
            container_id=have.id if have else None,
        )


def _final_manifest(plan: NodePlan, dep: Deployment | dict[str, Any], nd: NodeDeployment, facts: NodeFacts) -> None:
    """Phase 2's last step: the manifest as the node now is (unchanged when phase 1 wrote it already)."""
    have_manifest = facts.files.get(MANIFEST)
    final_spec = _manifest_spec(manifest_text(dep, nd))
    same = have_manifest is not None and have_manifest.sha256 == final_spec.sha256
    pre = next((s for s in plan.steps if s.kind == StepKind.MANIFEST), None)
    if pre is not None and pre.file is not None and pre.file.sha256 == final_spec.sha256:
        plan.add(
            phase=2, kind=StepKind.MANIFEST, target=MANIFEST, change=False, reason="written in phase 1", file=final_spec
        )
        return
    reason = "up to date" if same else "record this deployment"
    plan.add(phase=2, kind=StepKind.MANIFEST, target=MANIFEST, change=not same, reason=reason, file=final_spec)


def plan_node(dep: Deployment | dict[str, Any], nd: NodeDeployment, facts: NodeFacts) -> NodePlan:
    """dep: the deployment, or what its manifest records (describe()) where no Deployment exists (a gateway).
    Phase 1: the old goes first, then the files; phase 2: the containers, then the manifest as it now is."""
    plan = NodePlan(node=nd.node, state_dir=state_dir_path(facts, nd.state_dir), deployment=nd)
    _old_and_state_dir(plan, nd, facts)
    _file_steps(plan, dep, nd, facts)
    _container_steps(plan, nd, facts)
    _final_manifest(plan, dep, nd, facts)
    return plan


def plan_deployment(dep: Deployment, facts: dict[str, NodeFacts]) -> Plan:
    """Steps for every node of the inventory (facts: by node name, one for each)."""
    by_name = {nd.node.name: nd for nd in dep.nodes}
    plans = []
    for node in dep.inventory.nodes:
        f = facts[node.name]
        if node.name in by_name:
            plans.append(plan_node(dep, by_name[node.name], f))
        else:
            plans.append(plan_removal(node, f, dep.inventory.cluster.state_dir))
    plan = Plan(plans)
    for group in dep.groups:
        _restart_together(plan, group, facts)
    return plan


def _restart_together(plan: Plan, group: Sequence[str], facts: dict[str, NodeFacts] | None = None) -> None:
    """The ranks of one engine restart together: a new rank 0 cannot rejoin old ranks (and vice versa). Only the
    engine's containers: the proxy, the guard and Prometheus on a rank's node restart only for their own changes.
    group: its nodes in rank order; with the nodes' facts, a group that lost a rank while it served (a rank's last
    exit after another's current start: nodeside/guard/groups.py, the rule the node-side watcher applies) or
    whose engine stopped answering its health check restarts whole: `restart group: WHY`."""
    order = {name: i for i, name in enumerate(group)}
    starts = sorted(
        (
            s
            for s in plan.steps
            if s.kind == StepKind.START_CONTAINER and s.node in order and s.container and s.container.is_engine
        ),
        key=lambda s: order[s.node],
    )
    lost = _lost_rank(starts, order, facts) if facts is not None else None
    if lost is not None:
        for s in starts:
            s.reason = f"{RESTART_GROUP}: {lost}" + (f" (and: {s.reason})" if s.change else "")
            s.with_group, s.change = not s.change, True
        return
    changed = [s for s in starts if s.change]
    if not changed:
        return
    first = changed[0]
    role = first.container.role if first.container else "rank"
    if first.reason.startswith(UNHEALTHY):
        why = f"{RESTART_GROUP}: {first.node}'s {role} {first.reason}"
        for s in starts:
            s.reason = why + (f" (and: {s.reason})" if s.change and s is not first else "")
            s.with_group, s.change = not s.change, True
        return
    for s in starts:
        if not s.change:
            s.with_group, s.change = True, True
            s.reason = f"restarts with {first.node}'s {role} (one engine across nodes)"


def _lost_rank(starts: list[Step], order: dict[str, int], facts: dict[str, NodeFacts]) -> str | None:
    """`rank N (NODE) exited at HH:MM:SS UTC while the group served (R restarts since)`, or None."""
    ranks, seen = [], {}
    for s in starts:
        f = facts.get(s.node)
        have = f.container(s.target) if f is not None else None
        if have is None:
            continue
        label = f"rank {order[s.node]} ({s.node})"
        seen[label] = have
        ranks.append((label, groups.docker_time(have.started_at), groups.docker_time(have.finished_at), have.running))
    hit = groups.lost_rank(ranks)
    if hit is None:
        return None
    label, at = hit
    have = seen[label]
    after = f"{have.restarts} restart(s) since" if have.running and have.restarts else f"now {have.status}"
    return f"{label} exited at {clock(datetime.fromtimestamp(at, UTC))} while the group served ({after})"


def plan_down(inventory_nodes: list[Node], facts: dict[str, NodeFacts], state_dir: str) -> Plan:
    return Plan([plan_removal(n, facts[n.name], state_dir, "ours") for n in inventory_nodes if n.name in facts])
