"""The stack file of `sparkdeploy up --stack` (deploy/stack/converge.py): its model, its validation against the
inventory and the recipes (every problem at once, one line each), and the memory each deployment's engines get.

Memory (unified memory: vLLM reserves gpu_memory_utilization x total at start): engines sharing a node must fit
together (`fits`); `memory: auto` splits what the fixed shares leave on each node. `budget` refuses before
anything changes, with each engine's share and settings that would fit. Pure: local files only.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from sparkdeploy.config.inventory import Inventory, Node, load_inventory
from sparkdeploy.config.schema import Number, Whole, problems_from_validation
from sparkdeploy.config.secrets import Secrets, load_secrets
from sparkdeploy.config.userfile import load_yaml_file
from sparkdeploy.errors import ConfigError, Invalid, Problem
from sparkdeploy.names import KINDS, DeploymentName, NodeName, OneLine, one_line
from sparkdeploy.recipes import budget as memory_budget
from sparkdeploy.recipes.engines.registered import engine_of
from sparkdeploy.recipes.recipe import ResolvedRecipe, resolve
from sparkdeploy.topologies import build_deployment, layout
from sparkdeploy.topologies.base import ENGINE_PORT
from sparkdeploy.topologies.deployment import Deployment, Listen
from sparkdeploy.topologies.ports import Owner, PortMap
from sparkdeploy.topologies.running_stack import RESERVED, state_dir_of, sub_inventory

NAME = KINDS["deployment"].pattern  # matched in full (names.py)
MULTI_NODE = ("cluster", "replicas")  # one engine over several nodes: Ray / torchrun ports per node
GATEWAY_PORT = "gateway.port"  # the gateway's port setting (the port map names it)
GIB = 1024
# On-demand members (issue 40, docs/stack.md): stopped after this much idle time unless the stack file says.
IDLE_TIMEOUT_DEFAULT_S = 600
IDLE_TIMEOUT_MIN_S = 10  # shorter: the member would stop between the requests of one conversation
IDLE_TIMEOUT_MAX_S = 7 * 24 * 3600
# How long the gateway holds a request for an on-demand member that does not serve yet (its start): the stack's
# `gateway.hold`, or a member's `start_timeout` (its own cold start: a bigger model loads longer); then 503.
HOLD_DEFAULT_S = 300
HOLD_MIN_S = 1
HOLD_MAX_S = 3600
_DURATION = re.compile(r"([0-9]+)\s*(s|m|h)?")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, None: 1}


def idle_seconds(value: int | str) -> int:
    """An idle timeout as seconds: a whole number of seconds, or `90s`, `10m`, `2h`; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return value
    m = _DURATION.fullmatch(value.strip())
    if m is None:
        raise ValueError(value)
    return int(m.group(1)) * _UNIT_S[m.group(2)]


def _duration(v: int | str, low: int, high: int, example: str) -> int:
    """A duration field's seconds, within [low, high]; Invalid (one line: what, and the fix) otherwise."""
    try:
        seconds = idle_seconds(v)
    except ValueError:
        fix = f"a whole number of seconds, or 90s, 10m, 2h (e.g. {example})"
        raise Invalid(f"{v!r} is not a duration", fix) from None
    if not low <= seconds <= high:
        high_text = f"{high // 86400} days" if high >= 86400 else f"{high} s"
        raise Invalid(f"{seconds} s is out of range", f"from {low} s to {high_text}, e.g. {example}")
    return seconds


def _duration_as_written(v: object) -> object:
    """A duration field as the file gives it: a whole number of seconds or one line of text (checked by
    _duration); anything else is one problem, not one per branch of the union."""
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    if isinstance(v, str):
        return one_line(v)
    raise Invalid(f"{v!r} is not a duration", "a whole number of seconds, or 90s, 10m, 2h (e.g. 600)")


Duration = Annotated[int | str | None, BeforeValidator(_duration_as_written)]


# -- the file -------------------------------------------------------------------------------------------


class StackDeployment(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: DeploymentName = Field(description="a label: in container names, labels and the state dir")
    recipe: OneLine = Field(max_length=256)
    topology: OneLine | None = Field(default=None, max_length=32)
    backend: OneLine | None = Field(default=None, max_length=32)
    nodes: list[NodeName] | None = Field(default=None, min_length=1, description="node names; default: every node")
    port: Whole | None = Field(default=None, ge=1, le=65535, description="its engines' port; default vllm_port + index")
    memory: Number | Literal["auto"] | None = Field(
        default=None, description="gpu_memory_utilization of its engines, or auto (split what is free)"
    )
    set: list[OneLine] = Field(default_factory=list, description="--set overrides, e.g. vllm.max_model_len=8192")
    on_demand: StrictBool = Field(
        default=False, description="started by the gateway on its first request, stopped after idle_timeout"
    )
    idle_timeout: Duration = Field(
        default=None,
        description=f"on_demand only: idle time before it stops (600, 90s, 10m; default {IDLE_TIMEOUT_DEFAULT_S} s)",
    )

    start_timeout: Duration = Field(
        default=None,
        description="on_demand only: how long the gateway holds a request for its start before a 503 "
        "(default: the stack's gateway.hold)",
    )

    @field_validator("idle_timeout")
    @classmethod
    def _idle(cls, v: int | str | None) -> int | str | None:
        if v is not None:
            _duration(v, IDLE_TIMEOUT_MIN_S, IDLE_TIMEOUT_MAX_S, "10m")
        return v

    @field_validator("start_timeout")
    @classmethod
    def _start(cls, v: int | str | None) -> int | str | None:
        if v is not None:
            _duration(v, HOLD_MIN_S, HOLD_MAX_S, "5m")
        return v

    @model_validator(mode="after")
    def _idle_needs_on_demand(self) -> StackDeployment:
        if self.idle_timeout is not None and not self.on_demand:
            raise Invalid.at(
                "idle_timeout",
                "set, but the deployment is not on_demand (an always-on deployment never stops)",
                "add `on_demand: true`, or remove idle_timeout",
            )
        if self.start_timeout is not None and not self.on_demand:
            raise Invalid.at(
                "start_timeout",
                "set, but the deployment is not on_demand (an always-on deployment is never started by a request)",
                "add `on_demand: true`, or remove start_timeout",
            )
        return self

    @property
    def idle_timeout_s(self) -> int | None:
        """On demand: its idle timeout in seconds; None: always on."""
        if not self.on_demand:
            return None
        return IDLE_TIMEOUT_DEFAULT_S if self.idle_timeout is None else idle_seconds(self.idle_timeout)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v in RESERVED:
            raise Invalid(
                f"{v!r} is reserved",
                f"a name other than {' or '.join(map(repr, RESERVED))}",
            )
        return v

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: float | str | None) -> float | str | None:
        if isinstance(v, float) and not 0.05 <= v <= 0.95:
            raise Invalid(
                f"{v:g} is not a gpu_memory_utilization",
                "a fraction from 0.05 to 0.95, or auto",
            )
        return v


# The gateway's proxy worker processes when the stack file says `num_workers: auto` (the default): one per CPU of
# the head node, at most 4. A request's LiteLLM path is ~3 ms of one core; answers of one batch arrive together,
# and one worker handles them one after another (at c64 in the lab, 1 worker lost 11 % of the engine's
# throughput, 2 lost 4-5 %: docs/gateway.md). Each worker is a LiteLLM process of ~350 MiB, taken from the
# memory the budget keeps for the OS (budget.OS_RESERVE_BYTES), hence the cap.
GATEWAY_WORKERS_MAX = 4


def gateway_workers(setting: int | str, head_cpus: int | None) -> int:
    """The gateway's num_workers: the stack file's number, or `auto` from the head node's CPUs (1 if unknown)."""
    if isinstance(setting, int):
        return setting
    return max(1, min(GATEWAY_WORKERS_MAX, head_cpus or 1))


class GatewaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    port: Whole | None = Field(default=None, ge=1, le=65535, description="default: the inventory's proxy_port")
    num_workers: Whole | Literal["auto"] = Field(
        default="auto", description=f"proxy processes; auto: the head node's CPUs, at most {GATEWAY_WORKERS_MAX}"
    )

    hold: Duration = Field(
        default=None,
        description=f"how long a request for a starting on-demand member is held before a 503 "
        f"(default {HOLD_DEFAULT_S} s; a member's start_timeout overrides it)",
    )

    @field_validator("hold")
    @classmethod
    def _hold(cls, v: int | str | None) -> int | str | None:
        if v is not None:
            _duration(v, HOLD_MIN_S, HOLD_MAX_S, "5m")
        return v

    @field_validator("num_workers")
    @classmethod
    def _workers(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 64:
            raise Invalid(
                f"{v} workers",
                "a number from 1 to 64, or auto",
            )
        return v


class StackFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    deployments: list[StackDeployment] = Field(min_length=1)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)


def load_file(path: str) -> StackFile:
    """The stack file through the one door (userfile.py) and its strict schema: one line per problem."""
    raw = load_yaml_file(path, "stack file", "fix the syntax (see docs/stack.md)")
    if not isinstance(raw, dict):
        raise ConfigError(Problem(path, "", "not a mapping", "write `deployments:` with a list of deployments"))
    try:
        return StackFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, path, StackFile)) from None


# -- memory ---------------------------------------------------------------------------------------------


def fits(utilizations: Sequence[float], total_mb: float) -> tuple[bool, float]:
    """Whether engines with these gpu_memory_utilization values fit on one node of `total_mb` together, and the
    most their sum may be (the one budget's formula: budget.shared_room)."""
    room = memory_budget.shared_room(total_mb * 2**20)
    return sum(utilizations) <= room + 1e-9, room


def _floor2(x: float) -> float:
    return math.floor(x * 100 + 1e-9) / 100


@dataclass
class Member:
    """One deployment of the stack, resolved (recipe, nodes, port); its Deployment once memory is known."""

    entry: StackDeployment
    inventory: Inventory  # its nodes only (the first is its head), its port and state dir
    resolved: ResolvedRecipe
    port: int
    deployment: Deployment | None = None
    sets: list[str] = field(default_factory=list)  # its --set values with its memory share (history records them)
    share: float | None = None  # its memory share once the budget ran (build)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def state_dir(self) -> str:
        return self.inventory.cluster.state_dir

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.inventory.nodes]

    @property
    def model(self) -> str:
        return self.resolved.recipe.public_name

    @property
    def on_demand(self) -> bool:
        return self.entry.on_demand

    def utilization(self) -> float | None:
        """Its fixed share (the stack's memory, else the recipe's after --set); None: auto."""
        if self.entry.memory == "auto":
            return None
        if isinstance(self.entry.memory, float):
            return self.entry.memory
        recipe = self.resolved.recipe
        share = engine_of(recipe).reservation(recipe).fraction
        # no share of its own (llama.cpp): what the budget counts it takes on a DGX Spark
        return float(share if share is not None else memory_budget.nominal(recipe, 1).util)

    def engine_nodes(self) -> list[str]:
        """Nodes where one of its engines runs (solo: its first node)."""
        return self.node_names[:1] if self.resolved.topology == "solo" else self.node_names


@dataclass
class Stack:
    path: str
    inventory: Inventory
    file: StackFile
    members: list[Member]
    secrets: Secrets
    gateway_port: int
    warnings: list[str] = field(default_factory=list)
    head_cpus: int | None = None  # the head node's `cpus` fact, once read (the gateway's `auto` workers)
    totals: dict[str, int | None] = field(default_factory=dict)  # node -> MiB, once read (the budget's)

    @property
    def gateway_workers(self) -> int:
        return gateway_workers(self.file.gateway.num_workers, self.head_cpus)

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    @property
    def head(self) -> Node:
        return self.inventory.head

    @property
    def endpoint(self) -> str:
        return f"http://{self.head.url_host}:{self.gateway_port}/v1"


def load_stack(path: str, inventory_path: str | None = None, recipes_dir: str | None = None) -> Stack:
    """The stack file, validated against the inventory and recipes: every problem at once, one line each."""
    inv = load_inventory(inventory_path)
    stack = load_file(path)
    problems: list[Problem] = []
    members: list[Member] = []
    known = [n.name for n in inv.nodes]
    seen_names: dict[str, int] = {}
    for i, entry in enumerate(stack.deployments):
        where = f"deployments[{i}]"
        if entry.name in seen_names:
            problems.append(
                Problem(
                    path,
                    f"{where}.name",
                    f"{entry.name!r} is also deployments[{seen_names[entry.name]}]'s name",
                    "give each deployment its own name",
                )
            )
            continue
        seen_names[entry.name] = i
        names = entry.nodes or known
        bad = [n for n in names if n not in known]
        if bad:
            problems.append(
                Problem(
                    path,
                    f"{where}.nodes",
                    f"no node named {', '.join(bad)} in {inv.source}",
                    f"known: {', '.join(known)}",
                )
            )
            continue
        if len(set(names)) != len(names):
            problems.append(Problem(path, f"{where}.nodes", "a node is listed twice", "list each node once"))
            continue
        port = entry.port or inv.cluster.vllm_port + i
        try:
            resolved = resolve(entry.recipe, entry.topology, entry.backend, entry.set, recipes_dir)
        except ConfigError as exc:
            problems += [dataclasses.replace(p, file=f"{path}: {where} ({p.file})") for p in exc.problems]
            continue
        sub = sub_inventory(inv, names, port, state_dir_of(inv, entry.name))
        members.append(Member(entry, sub, resolved, port))
    gateway_port = stack.gateway.port or inv.cluster.proxy_port
    ports, port_problems = _port_map(path, inv, members, gateway_port)
    problems += port_problems + _conflicts(path, members, ports.clashing())
    if problems:
        raise ConfigError(problems)
    secrets = load_secrets(inv.local_path(inv.cluster.secrets_file))
    return Stack(path, inv, stack, members, secrets, gateway_port)


def _port_map(path: str, inv: Inventory, members: list[Member], gateway_port: int) -> tuple[PortMap, list[Problem]]:
    """Every port the stack's containers would listen on, per node (ports.py: the deployments rendered as they
    will run, and the gateway on the head): one line per port two of them want on one node."""
    ports = PortMap()
    ports.add(inv.head.name, Listen(gateway_port, "the gateway", GATEWAY_PORT))
    problems: list[Problem] = []
    index = {m.name: i for i, m in enumerate(members)}
    for m in members:
        try:
            ports.add_deployment(build_deployment(m.inventory, m.resolved, Secrets(), stack_name=m.name), m.name)
        except ConfigError as exc:
            where = f"deployments[{index[m.name]}]"
            problems += [dataclasses.replace(p, file=f"{path}: {where} ({p.file})") for p in exc.problems]

    def setting(o: Owner) -> str:
        if o.listen.setting == GATEWAY_PORT or not o.deployment:
            return o.listen.setting
        if o.listen.setting == ENGINE_PORT:
            return f"deployments[{index[o.deployment]}].port"
        return f"{o.listen.setting} of {inv.source}"

    return ports, problems + ports.problems(path, setting)


def _conflicts(path: str, members: list[Member], clashing: set[frozenset[str]]) -> list[Problem]:
    """Two deployments serving the same model name (the gateway routes by it); two multi-node engines on one
    node (Ray and torchrun use more ports there than the ones they listen on first), unless the port map
    already refused the pair (`clashing`)."""
    problems = []
    index = {m.name: i for i, m in enumerate(members)}
    for i, a in enumerate(members):
        where = f"deployments[{index[a.name]}]"
        for b in members[:i]:
            shared = sorted(set(a.node_names) & set(b.node_names))
            if a.model == b.model:
                problems.append(
                    Problem(
                        path,
                        f"{where}.recipe",
                        f"{b.name} and {a.name} both serve the model {a.model}: the gateway routes by model name",
                        "serve each model once (or one deployment on more nodes)",
                    )
                )
            clash = frozenset((a.name, b.name)) in clashing
            if shared and a.resolved.topology in MULTI_NODE and b.resolved.topology in MULTI_NODE and not clash:
                problems.append(
                    Problem(
                        path,
                        f"{where}.nodes",
                        f"{b.name} and {a.name} are both multi-node engines on "
                        f"{', '.join(shared)} (their Ray / torchrun ports would collide)",
                        "give them disjoint nodes, or make one solo / 2xsolo",
                    )
                )
    return problems


MIN_SHARE = 0.05  # the least memory: a stack file accepts (StackDeployment._memory)


@dataclass(frozen=True)
class MemoryFix:
    """Changes to the stack file's entries that make the memory budget fit, found by re-running the budget's own
    checks on them: deployment -> {"memory": share} and/or {"nodes": [node]} (a solo engine moved)."""

    changes: dict[str, dict[str, float | list[str]]]

    def text(self) -> str:
        def one(name: str, change: dict[str, float | list[str]]) -> str:
            parts = [f"nodes: [{', '.join(v)}]" if isinstance(v, list) else f"{k}: {v:g}" for k, v in change.items()]
            return f"{' and '.join(parts)} on {name}"

        return "; ".join(one(name, change) for name, change in self.changes.items())


def _engine_size(m: Member) -> int:
    """Nodes one engine of the member spans (the weights' divisor): as its topology lays them out."""
    if m.resolved.topology == "cluster":
        return len(m.node_names)
    if m.resolved.topology == "replicas":
        return layout.plan(m.inventory, m.resolved, layout.DEFAULT_REPLICA_TP).tp
    return 1


def _need(m: Member, node: str, total_mb: float) -> float:
    """The least share with which the member's engine starts on a node of total_mb (the one budget's
    start_util; MIN_SHARE when the recipe has no weights_gb to tell)."""
    b = memory_budget.estimate(m.resolved.recipe, _engine_size(m), node, int(total_mb * 2**20), None, "stack")
    return max(MIN_SHARE, b.start_util or MIN_SHARE)


def _engines_on(nodes: list[str], topology: str) -> list[str]:
    return nodes[:1] if topology == "solo" else nodes


def _layout_fits(
    stack: Stack, totals: dict[str, int | None], nodes_of: dict[str, list[str]], util: dict[str, float]
) -> bool:
    """Every node holds its engines' shares together, and each engine starts with its share."""
    on: dict[str, list[Member]] = {}
    for m in stack.members:
        for n in _engines_on(nodes_of[m.name], m.resolved.topology):
            on.setdefault(n, []).append(m)
    for n, ms in on.items():
        total = totals.get(n)
        if not total:
            continue
        if not fits([util[m.name] for m in ms], total)[0]:
            return False
        if any(util[m.name] + 1e-9 < _need(m, n, total) or util[m.name] > 0.95 for m in ms):
            return False
    return True


def _shares_from_needs(
    stack: Stack, totals: dict[str, int | None], nodes_of: dict[str, list[str]], util: dict[str, float], nodes: set[str]
) -> dict[str, float] | None:
    """Shares for the engines on `nodes`: each keeps its share where it starts with it and all fit, else gets its
    need to start plus an equal part of what is left (the least over its nodes); None when the needs alone do not
    fit a node."""
    on: dict[str, list[Member]] = {}
    for m in stack.members:
        for n in _engines_on(nodes_of[m.name], m.resolved.topology):
            on.setdefault(n, []).append(m)
    moved = {m.name for n in nodes for m in on.get(n, [])}
    need = {
        m.name: max(
            (_need(m, n, totals[n] or 0) for n in _engines_on(nodes_of[m.name], m.resolved.topology) if totals.get(n)),
            default=MIN_SHARE,
        )
        for m in stack.members
        if m.name in moved
    }
    kept = {**util, **{name: max(need[name], util[name]) for name in moved}}
    if _layout_fits(stack, totals, nodes_of, kept):
        return kept
    out = dict(util)
    extra: dict[str, float] = {}
    for n in sorted({n for name in moved for n in _engines_on(nodes_of[name], stack.member(name).resolved.topology)}):
        total = totals.get(n)
        if not total:
            continue
        ms = on.get(n, [])
        left = fits([], total)[1] - sum(need[m.name] if m.name in moved else util[m.name] for m in ms)
        if left < -1e-9:
            return None
        share = left / max(1, sum(1 for m in ms if m.name in moved))
        for m in ms:
            if m.name in moved:
                extra[m.name] = min(extra.get(m.name, share), share)
    for name in moved:
        out[name] = min(0.95, _floor2(need[name] + extra.get(name, 0.0)))
    return out


def memory_fix(stack: Stack, totals: dict[str, int | None], util: dict[str, float], node: str) -> MemoryFix | None:
    """Settings that make `node` (and every other node) fit, checked by the same budget: an equal split, each
    engine's need to start plus an equal part of the rest, or a solo engine moved to a node with room for it.
    None when no such change exists (the engines do not fit the nodes together)."""
    nodes_of = {m.name: list(m.node_names) for m in stack.members}
    ms = [m for m in stack.members if node in _engines_on(nodes_of[m.name], m.resolved.topology)]
    total = totals.get(node) or 0
    even = _floor2(fits([], total)[1] / max(1, len(ms)))
    candidate = {**util, **{m.name: even for m in ms}}
    if even >= MIN_SHARE and _layout_fits(stack, totals, nodes_of, candidate):
        return MemoryFix({m.name: {"memory": even} for m in ms})
    shares = _shares_from_needs(stack, totals, nodes_of, util, {node})
    if shares is not None and _layout_fits(stack, totals, nodes_of, shares):
        return MemoryFix({m.name: {"memory": shares[m.name]} for m in ms})
    ports = {m.name: m.port for m in stack.members}
    solo = sorted((m for m in ms if m.resolved.topology == "solo"), key=lambda m: _need(m, node, total))
    for m in solo:
        for target in sorted(n for n in totals if n != node and totals.get(n)):
            there = [o for o in stack.members if target in _engines_on(nodes_of[o.name], o.resolved.topology)]
            if any(ports[o.name] == m.port for o in there):
                continue
            moved = {**nodes_of, m.name: [target]}
            shares = _shares_from_needs(stack, totals, moved, util, {node, target})
            if shares is not None and _layout_fits(stack, totals, moved, shares):
                changed = [o.name for o in stack.members if shares[o.name] != util[o.name] or o.name == m.name]
                return MemoryFix(
                    {
                        name: ({"nodes": [target]} if name == m.name else {}) | {"memory": shares[name]}
                        for name in changed
                    }
                )
    return None


def budget(stack: Stack, totals: dict[str, int | None]) -> dict[str, float]:
    """Each deployment's gpu_memory_utilization (auto ones computed), or ConfigError with every node that does
    not fit (memory_problems). totals: node name -> MiB."""
    util, found = memory_problems(stack, totals)
    if found:
        raise ConfigError([p for p, _fix in found])
    return util


def memory_problems(
    stack: Stack, totals: dict[str, int | None]
) -> tuple[dict[str, float], list[tuple[Problem, MemoryFix | None]]]:
    """The shares (auto ones computed) and every node that does not fit: the engines there together, or one whose
    share is too small for it to start (weights + peak + one max_model_len sequence of KV, the one budget's
    start_util). Each problem carries settings that fit, found by re-running these checks on them (memory_fix),
    with the fix it prints, or says that none exist."""
    fixed = {m.name: m.utilization() for m in stack.members}
    on_node: dict[str, list[Member]] = {}
    for m in stack.members:
        for n in m.engine_nodes():
            on_node.setdefault(n, []).append(m)
    auto: dict[str, float] = {}
    for m in stack.members:
        if fixed[m.name] is None:
            shares = []
            for n in m.engine_nodes():
                total = totals.get(n)
                if not total:
                    continue
                _ok, room = fits([], total)
                left = room - sum(cast(float, fixed[o.name]) for o in on_node[n] if fixed[o.name] is not None)
                shares.append(left / sum(1 for o in on_node[n] if fixed[o.name] is None))
            auto[m.name] = _floor2(min(shares)) if shares else 0.5
    util = {m.name: cast(float, fixed[m.name]) if fixed[m.name] is not None else auto[m.name] for m in stack.members}
    problems: list[tuple[Problem, MemoryFix | None]] = []
    for n, ms in [scenario for node_ms in sorted(on_node.items()) for scenario in _together(*node_ms)]:
        total = totals.get(n)
        if not total or len(ms) < 1:
            continue
        ok, room = fits([util[m.name] for m in ms], total)
        need = {m.name: _need(m, n, total) for m in ms}
        short = [m for m in ms if util[m.name] + 1e-9 < need[m.name]]
        if ok and not short and all(util[m.name] >= MIN_SHARE for m in ms):
            continue
        where = f"{n} ({total / GIB:.1f} GiB, {memory_budget.OS_RESERVE_BYTES / 2**30:g} GiB kept for the OS)"
        listed = ", ".join(f"{m.name} {util[m.name]:g} ({util[m.name] * total / GIB:.1f} GiB)" for m in ms)
        if sum(need.values()) > room + 1e-9 and len(ms) > 1:
            needs = " + ".join(f"{need[m.name]:g}" for m in ms)
            message = (
                f"{where}: {', '.join(m.name for m in ms)} cannot share it: their engines need {needs} = "
                f"{sum(need.values()):.2f} of it to start (weights + peak + one max_model_len sequence of KV each), "
                f"at most {room:.2f} fits"
            )
        elif short:
            message = (
                f"{where}: "
                + "; ".join(
                    f"{m.name}'s share {util[m.name]:g} is too small for its engine to start "
                    f"(it needs {need[m.name]:g}: weights + peak + one max_model_len sequence of KV)"
                    for m in short
                )
                + (f" (the shares there: {listed}, at most {room:.2f} fits)" if len(ms) > 1 else "")
            )
        else:
            message = (
                f"{where}: the engines there need {sum(util[m.name] for m in ms):.2f} of it together ({listed}), "
                f"at most {room:.2f} fits"
            )
        fix = memory_fix(dataclasses.replace(stack, members=_with(stack.members, ms)), totals, util, n)
        text = _fix_text(fix, alone=all(m.engine_nodes() == [n] for m in ms))
        if all(p.message != message for p, _ in problems):  # always-on engines short in every set: said once
            problems.append((Problem(stack.path, "deployments.memory", message, text), fix))
    return util, problems


def _together(node: str, ms: list[Member]) -> list[tuple[str, list[Member]]]:
    """The sets of a node's engines that must fit together: all of them when none is on demand; else the always-on
    ones with each on-demand one in turn (on-demand members that do not fit together are started by stopping the
    least recently used idle one: docs/stack.md), or the always-on ones alone."""
    always = [m for m in ms if not m.on_demand]
    demand = [m for m in ms if m.on_demand]
    if not demand:
        return [(node, ms)]
    return [(node, [*always, d]) for d in demand]


def _with(members: list[Member], ms: list[Member]) -> list[Member]:
    """The stack's members that are not engines of this node, and these: what one set of engines must fit with."""
    on_here = {m.name for m in ms}
    return [m for m in members if m.name in on_here or not m.on_demand]


def _fix_text(fix: MemoryFix | None, alone: bool) -> str:
    """The fix as the problem prints it; `alone`: the node's engines run on it only, so `memory: auto` on each
    splits it the same way as an equal share."""
    if fix is None:
        return (
            "no shares or placement of these deployments fits the nodes: serve fewer or smaller models, a shorter "
            "vllm.max_model_len, or a topology that splits the weights (sparkdeploy recipes fit NAME shows each "
            "one's need)"
        )
    shares = {c.get("memory") for c in fix.changes.values()}
    if all(set(c) == {"memory"} for c in fix.changes.values()) and len(shares) == 1:
        return f"e.g. memory: {shares.pop():g} on each of {', '.join(fix.changes)}" + (
            ", or memory: auto" if alone else ""
        )
    return "e.g. " + fix.text()


def hold_s(stack: Stack, m: Member) -> int | None:
    """How long the gateway holds a request for on-demand member `m` while it starts (its start_timeout, else the
    stack's gateway.hold, else HOLD_DEFAULT_S); None: always on (never held)."""
    if not m.on_demand:
        return None
    value = m.entry.start_timeout if m.entry.start_timeout is not None else stack.file.gateway.hold
    return HOLD_DEFAULT_S if value is None else idle_seconds(value)


def on_demand_figures(stack: Stack, m: Member) -> dict[str, object]:
    """What an on-demand member's manifest records for the node-side activator (nodeside/guard/ondemand.py): its
    idle timeout, its share and, per engine node, the most the shares there may sum to (the one budget's
    shared_room, from the node's total as read by this `up`)."""
    room = {
        n: _floor2(fits([], total)[1]) for n in m.engine_nodes() if (total := stack.totals.get(n))
    }  # node -> fraction
    return {"idle_timeout": m.entry.idle_timeout_s, "share": m.share, "room": room}


def build(stack: Stack, util: dict[str, float]) -> None:
    """Render each member's Deployment with its memory share (pure)."""
    for m in stack.members:
        recipe = m.resolved.recipe  # its engine's share setting (SGLang's mem_fraction_static; llama.cpp has none)
        field = engine_of(recipe).reservation(recipe).fraction_field
        m.share = util[m.name]
        sets = m.sets = [*m.entry.set, *([f"{field}={util[m.name]:g}"] if field else [])]
        resolved = resolve(m.entry.recipe, m.entry.topology, m.entry.backend, sets, None)
        m.deployment = build_deployment(m.inventory, resolved, stack.secrets, stack_name=m.name)
