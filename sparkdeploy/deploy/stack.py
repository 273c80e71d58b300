"""Several deployments on one cluster behind one gateway: `sparkdeploy up --stack stack.yaml`.

A stack file lists deployments, each a recipe with its topology, nodes, engine port, memory share and `--set`
overrides. Each deployment is rendered by the ordinary topology code (topologies.build_deployment) with its name
in its container names and labels (`sparkdeploy-NAME-vllm`, label io.sparkdeploy.deployment=NAME) and its own
state dir (`<state_dir>-NAME` beside the single deployment's), so each is planned against only its own
containers and files: changing or removing one leaves the others' containers untouched, and a second `up`
changes nothing. 2xsolo and replicas start no proxy of their own: the stack's one gateway (the LiteLLM proxy on
the head node, deployment `gateway`) routes by model name to every engine, several engines of one deployment
being one model group. The gateway reloads its model list from its config file when `up` rewrites it
(sparkdeploy/gateway_hook.py), so adding or removing a deployment restarts no proxy.

Memory (unified memory: vLLM reserves gpu_memory_utilization x total at start): engines sharing a node must fit
together (`fits`); `memory: auto` splits what the fixed shares leave on each node. `up` refuses before anything
changes, with each engine's share and settings that would fit.

Each deployment goes through the single `up`'s phases (deploy/up.py: preflight with the image push and the
model check, the fabric gate, apply, health gate, the per-node lines after a failure, the history record); none
of them is written twice. Order of `up --stack`: every deployment that starts something passes preflight and
(cluster / replicas) the fabric gate before anything changes; then the guards (ONE per engine node, their own
unit `guard`: each stops every engine of its node at the hard line), the deployments that are new or changed
(each: apply, health gate), the gateway's config (the new models appear), and last the deployments no longer in
the file are removed (after the gateway forgot them). Each changed deployment is recorded in `history`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sparkdeploy import __version__, health, healthcheck, preflight
from sparkdeploy import budget as memory_budget
from sparkdeploy.apply import Interrupt, Session, gather_facts, inventory_lock, node_locks
from sparkdeploy.deploy import DEFAULT_TIMEOUT_S, fabric_gate, history
from sparkdeploy.deploy.report import Reporter, mask_data, plan_summary
from sparkdeploy.deploy.up import apply_phase, failure_lines, health_phase, refusal, run_preflight, simulated
from sparkdeploy.deployment import (
    DEPLOYMENT_LABEL,
    LABEL_PREFIX,
    MANAGED_LABEL,
    NOT_ENGINES,
    ROLE_LABEL,
    ContainerSpec,
    Deployment,
    FileSpec,
    NodeDeployment,
    config_hash,
    health_path,
)
from sparkdeploy.errors import ConfigError, Problem, SparkdeployError, StepFailed
from sparkdeploy.facts import NodeFacts
from sparkdeploy.images import push
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.inventory import Inventory, Node, load_inventory
from sparkdeploy.plan import CHANGED, Plan, StepKind, _restart_together, describe, plan_node, plan_removal
from sparkdeploy.recipes import LiteLLMSettings, ResolvedRecipe, resolve
from sparkdeploy.render import render
from sparkdeploy.running_stack import GATEWAY, GUARD, RESERVED, deployments_on, state_dir_of, sub_inventory
from sparkdeploy.secrets import Secrets, digest_key, keyed_digest, load_secrets, refuse_missing
from sparkdeploy.topologies import build_deployment
from sparkdeploy.topologies import guard as guard_deploy
from sparkdeploy.topologies.base import Context
from sparkdeploy.topologies.twosolo import PROXY_IMAGE

GATEWAY_CONTAINER = f"sparkdeploy-{GATEWAY}-litellm"
NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,22}[a-z0-9])?$")
MULTI_NODE = ("cluster", "replicas")  # one engine over several nodes: Ray / torchrun ports per node
HOOK_SOURCE = Path(__file__).resolve().parent.parent / "gateway_hook.py"
SPEND_SOURCE = HOOK_SOURCE.with_name("gateway_spend.py")  # the hook's token counts (keys --max-budget)
SPEND_VOLUME = ("spend", "/sparkdeploy-spend")  # the gateway's writable state: spend.sqlite (gateway_spend.DB)
GIB = 1024


# -- the file -------------------------------------------------------------------------------------------


class StackDeployment(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="a label: in container names, labels and the state dir")
    recipe: str = Field(max_length=256)
    topology: str | None = None
    backend: str | None = None
    nodes: list[str] | None = Field(default=None, min_length=1, description="node names; default: every node")
    port: int | None = Field(default=None, ge=1, le=65535, description="its engines' port; default vllm_port + index")
    memory: float | Literal["auto"] | None = Field(
        default=None, description="gpu_memory_utilization of its engines, or auto (split what is free)"
    )
    set: list[str] = Field(default_factory=list, description="--set overrides, e.g. vllm.max_model_len=8192")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME.match(v) or v in RESERVED:
            raise ValueError(
                f"{v!r} is not a deployment name (lowercase letters, digits and '-', at most 24; not "
                f"{' or '.join(map(repr, RESERVED))}) | fix: e.g. coder"
            )
        return v

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: float | str | None) -> float | str | None:
        if isinstance(v, float) and not 0.05 <= v <= 0.95:
            raise ValueError(f"{v:g} is not a gpu_memory_utilization | fix: a fraction from 0.05 to 0.95, or auto")
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

    port: int | None = Field(default=None, ge=1, le=65535, description="default: the inventory's proxy_port")
    num_workers: int | Literal["auto"] = Field(
        default="auto", description=f"proxy processes; auto: the head node's CPUs, at most {GATEWAY_WORKERS_MAX}"
    )

    @field_validator("num_workers")
    @classmethod
    def _workers(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 64:
            raise ValueError(f"{v} workers | fix: a number from 1 to 64, or auto")
        return v


class StackFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    deployments: list[StackDeployment] = Field(min_length=1)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)


def _pydantic_problems(source: str, exc: ValidationError) -> list[Problem]:
    out = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg, _, fix = str(err["msg"]).removeprefix("Value error, ").partition(" | fix: ")
        out.append(Problem(source, where, msg, fix or "see docs/stack.md"))
    return out


def load_file(path: str) -> StackFile:
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(Problem(path, "", f"cannot read: {exc.strerror}", "pass the path of a stack file")) from None
    except yaml.YAMLError as exc:
        raise ConfigError(Problem(path, "", f"not YAML: {str(exc).splitlines()[0]}", "fix the syntax")) from None
    if not isinstance(raw, dict):
        raise ConfigError(Problem(path, "", "not a mapping", "write `deployments:` with a list of deployments"))
    try:
        return StackFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_pydantic_problems(path, exc)) from None


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

    def utilization(self) -> float | None:
        """Its fixed share (the stack's memory, else the recipe's after --set); None: auto."""
        if self.entry.memory == "auto":
            return None
        if isinstance(self.entry.memory, float):
            return self.entry.memory
        return float(self.resolved.recipe.vllm.gpu_memory_utilization)

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
    problems += _conflicts(path, members, inv.head.name, gateway_port)
    if problems:
        raise ConfigError(problems)
    secrets = load_secrets(inv.local_path(inv.cluster.secrets_file))
    return Stack(path, inv, stack, members, secrets, gateway_port)


def _ports_of(m: Member) -> set[int]:
    ports = {m.port}
    if m.resolved.topology in MULTI_NODE:
        ports |= {m.inventory.cluster.master_port, m.inventory.cluster.ray_port}
    return ports


def _conflicts(path: str, members: list[Member], head: str, gateway_port: int) -> list[Problem]:
    """Two deployments on one node with the same port, two serving the same model name, one on the gateway's
    port, two multi-node engines on one node (their Ray / torchrun ports would collide)."""
    problems = []
    index = {m.name: i for i, m in enumerate(members)}
    for i, a in enumerate(members):
        where = f"deployments[{index[a.name]}]"
        if head in a.node_names and gateway_port in _ports_of(a):
            problems.append(
                Problem(
                    path,
                    f"{where}.port",
                    f"{a.name}'s port {a.port} is the gateway's port on {head}",
                    "give it another port: (or gateway.port)",
                )
            )
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
            if shared and a.port == b.port:
                problems.append(
                    Problem(
                        path,
                        f"{where}.port",
                        f"{b.name} and {a.name} both use port {a.port} on {', '.join(shared)}",
                        f"set port: on {a.name} (e.g. {max(m.port for m in members) + 1})",
                    )
                )
            if shared and a.resolved.topology in MULTI_NODE and b.resolved.topology in MULTI_NODE:
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


def budget(stack: Stack, totals: dict[str, int | None]) -> dict[str, float]:
    """Each deployment's gpu_memory_utilization (auto ones computed), or ConfigError with every node that does
    not fit: each engine's share and settings that would. totals: node name -> memory total in MiB."""
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
    problems = []
    for n, ms in sorted(on_node.items()):
        total = totals.get(n)
        if not total or len(ms) < 1:
            continue
        ok, room = fits([util[m.name] for m in ms], total)
        if ok and all(util[m.name] >= 0.05 for m in ms):
            continue
        listed = ", ".join(f"{m.name} {util[m.name]:g} ({util[m.name] * total / GIB:.1f} GiB)" for m in ms)
        even = _floor2(room / len(ms))
        problems.append(
            Problem(
                stack.path,
                "deployments.memory",
                f"{n} ({total / GIB:.1f} GiB, {memory_budget.OS_RESERVE_BYTES / 2**30:g} GiB kept for the "
                f"OS): the engines there need {sum(util[m.name] for m in ms):.2f} of it together ({listed}), "
                f"at most {room:.2f} fits",
                f"e.g. memory: {even:g} on each of {', '.join(m.name for m in ms)}, or memory: auto",
            )
        )
    if problems:
        raise ConfigError(problems)
    return util


def build(stack: Stack, util: dict[str, float]) -> None:
    """Render each member's Deployment with its memory share (pure)."""
    for m in stack.members:
        sets = m.sets = [*m.entry.set, f"vllm.gpu_memory_utilization={util[m.name]:g}"]
        resolved = resolve(m.entry.recipe, m.entry.topology, m.entry.backend, sets, None)
        m.deployment = build_deployment(m.inventory, resolved, stack.secrets, stack_name=m.name)


# -- the gateway ------------------------------------------------------------------------------------------


def gateway_models(stack: Stack) -> list[dict[str, Any]]:
    """LiteLLM's model_list: one entry per engine; a deployment's engines share its model name (one group)."""
    out = []
    for m in stack.members:
        dep = m.deployment
        assert dep is not None  # built before the gateway
        urls = dep.backends or [dep.endpoint]
        for i, url in enumerate(urls):
            out.append(
                {
                    "model_name": m.model,
                    "litellm_params": {"model": f"hosted_vllm/{m.model}", "api_base": url, "api_key": "EMPTY"},
                    "model_info": {"id": f"{m.name}-{i}"},
                }
            )
    return out


def gateway_config(stack: Stack) -> dict[str, Any]:
    lite = LiteLLMSettings()
    return {
        "model_list": gateway_models(stack),
        "router_settings": {
            "routing_strategy": lite.routing_strategy,
            "num_retries": lite.num_retries,
            "timeout": lite.timeout,
            "allowed_fails": lite.allowed_fails,
            "cooldown_time": lite.cooldown_time,
        },
        # the hook's token counter only: no Prometheus callback (`up --stack` has no --metrics, and it cost about
        # 10 % of the proxy's CPU per answer, py-spy); LiteLLM's own `/metrics` is not scraped by anything here
        "litellm_settings": {"callbacks": ["gateway_hook.spend_tracker"]},
        "general_settings": {
            "master_key": "os.environ/LITELLM_MASTER_KEY",
            # keys and model-list reload: sparkdeploy/gateway_hook.py, beside this file in the state dir
            "custom_auth": "gateway_hook.user_api_key_auth",
        },
    }


def gateway_node(stack: Stack) -> NodeDeployment:
    """The gateway's files and container on the head node. Its config hash leaves out the model list: a
    deployment added or removed rewrites litellm-config.yaml, which the running proxy reloads."""
    inv = stack.inventory
    head = stack.head
    name = GATEWAY_CONTAINER
    nd = NodeDeployment(node=head, state_dir=state_dir_of(inv, GATEWAY))
    master = stack.secrets.get("LITELLM_MASTER_KEY")
    node_env = render("node.env.j2", node=head, env={}, recipe_name=GATEWAY, topology="stack")
    secrets_env = render("secrets.env.j2", node=head, secrets={"LITELLM_MASTER_KEY": master} if master else {})
    config = FileSpec(
        "litellm-config.yaml",
        render(
            "litellm-config.yaml.j2",
            config=gateway_config(stack),
            recipe_name=GATEWAY,
            topology="stack",
            routing_strategy=LiteLLMSettings().routing_strategy,
        ),
    )
    common = {"name": name, "node": head, "recipe_name": GATEWAY, "topology": "stack", "backend": ""}
    entry = FileSpec(
        "litellm.entry.sh",
        render("entry-litellm.sh.j2", **common, port=stack.gateway_port, num_workers=stack.gateway_workers),
        mode=0o755,
    )
    hook = FileSpec("gateway_hook.py", HOOK_SOURCE.read_text(encoding="utf-8"))
    spend = FileSpec("gateway_spend.py", SPEND_SOURCE.read_text(encoding="utf-8"))
    files = [
        FileSpec("node.env", node_env),
        FileSpec("secrets.env", secrets_env, mode=0o600, secret=True),
        entry,
        hook,
        spend,
    ]
    image = load_definition(PROXY_IMAGE).tag
    run_vars: dict[str, Any] = dict(
        common,
        image=image,
        restart="unless-stopped",
        gpus=False,
        entry=entry.name,
        hf_cache=None,
        container_hf_home="/root/.cache/huggingface",
        healthcheck=healthcheck.for_port(stack.gateway_port, health_path("proxy")),
        state_volumes=[SPEND_VOLUME],
    )
    key = digest_key(inv.cluster_id)
    digests = [f.name + ":" + (keyed_digest(key, f.content) if f.secret else f.sha256) for f in files]
    settings = sorted((k, str(v)) for k, v in run_vars.items() if k != "node")
    chash = config_hash(__version__, image, repr(settings), *digests)
    labels = {
        MANAGED_LABEL: "true",
        f"{LABEL_PREFIX}.recipe": GATEWAY,
        f"{LABEL_PREFIX}.topology": "stack",
        f"{LABEL_PREFIX}.backend": "none",
        f"{LABEL_PREFIX}.role": "proxy",
        f"{LABEL_PREFIX}.config-hash": chash,
        DEPLOYMENT_LABEL: GATEWAY,
    }
    run = FileSpec("litellm.run.sh", render("container-run.sh.j2", labels=labels, **run_vars), mode=0o755)
    nd.files = [*files, config, run]
    nd.containers.append(
        ContainerSpec(
            name=name,
            role="proxy",
            image=image,
            run_script=run.name,
            config_hash=chash,
            ports=(stack.gateway_port,),
            health_port=stack.gateway_port,
        )
    )
    return nd


def gateway_about(stack: Stack) -> dict[str, Any]:
    return {
        "recipe": GATEWAY,
        "topology": "stack",
        "backend": None,
        "model": None,
        "endpoint": stack.endpoint,
        "backends": [e["litellm_params"]["api_base"] for e in gateway_models(stack)],
        "deployment": GATEWAY,
        "models": sorted({m.model for m in stack.members}),
        "workers": stack.gateway_workers,
    }


# -- the guards ---------------------------------------------------------------------------------------------


def guard_nodes(stack: Stack) -> list[NodeDeployment]:
    """ONE memory guard on each node where any deployment of the stack runs an engine (topologies/guard.py): a guard
    stops every engine of its node at the hard line, so one per node watches them all. Pure; the deployments
    are built first."""
    inv = stack.inventory
    deps = [cast(Deployment, m.deployment) for m in stack.members]
    engines = {nd.node.name for dep in deps for nd in dep.nodes if nd.runs_engine}
    nodes = [NodeDeployment(node=n, state_dir=state_dir_of(inv, GUARD)) for n in inv.nodes if n.name in engines]
    first = stack.members[0].resolved
    # labels and names of the guard unit: recipe `guard`, topology `stack` (as the gateway's)
    resolved = dataclasses.replace(first, recipe=first.recipe.model_copy(update={"name": GUARD}), topology="stack")
    ctx = Context(inv, resolved, deps[0].image, deps[0].image, stack.secrets, deployment=GUARD)
    guard_deploy.stack_guards(ctx, nodes, simulated(deps[0]))
    return [nd for nd in nodes if nd.containers]  # none when cluster.guard.enabled is false: removed everywhere


def guard_about(stack: Stack) -> dict[str, Any]:
    """The guards' manifest: nothing of the deployments they watch (adding one rewrites no guard's manifest)."""
    about = {"recipe": GUARD, "topology": "stack", "backend": None, "model": None, "endpoint": stack.endpoint}
    return about | {"deployment": GUARD}


# -- planning ---------------------------------------------------------------------------------------------


def only(f: NodeFacts, name: str) -> NodeFacts:
    """The node's facts as one deployment sees them: its own containers only."""
    return dataclasses.replace(f, containers=[c for c in f.containers if c.labels.get(DEPLOYMENT_LABEL) == name])


@dataclass
class Unit:
    """What one plan converges: a deployment of the stack, the gateway, or a deployment that goes."""

    name: str
    kind: Literal["guard", "deployment", "gateway", "remove"]
    plan: Plan
    member: Member | None = None
    facts: dict[str, NodeFacts] = field(default_factory=dict)  # a deployment's: its own containers, resources

    @property
    def changes(self) -> int:
        return self.plan.changes

    def as_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.name,
            "action": self.kind,
            "changes": self.changes,
            "steps": [s.as_dict() for s in self.plan.steps],
        }


def plan_unit(
    inv: Inventory,
    name: str,
    facts: dict[str, NodeFacts],
    nodes: list[NodeDeployment],
    about: dict[str, Any],
    groups: Sequence[list[str]] = (),
) -> Plan:
    by = {nd.node.name: nd for nd in nodes}
    plans = []
    for node in inv.nodes:
        if node.name not in facts:  # unreachable (down): reported by the caller
            continue
        f = only(facts[node.name], name)
        if node.name in by:
            plans.append(plan_node(about, by[node.name], f))
        elif f.containers or f.state_dir_mode is not None:
            plans.append(plan_removal(node, f, state_dir_of(inv, name), f"not part of deployment {name}"))
    plan = Plan(plans)
    for group in groups:
        _restart_together(plan, set(group))
    return plan


def plan_stack(stack: Stack, facts: dict[str, dict[str, NodeFacts]], gone: Sequence[str]) -> list[Unit]:
    """facts: state dir -> node -> facts. Units in the order they apply: the guards first (engines start
    watched), the deployments, the gateway, the deployments that go."""
    inv = stack.inventory
    guards = guard_nodes(stack)
    sd = state_dir_of(inv, GUARD)
    units = [Unit(GUARD, "guard", plan_unit(inv, GUARD, facts[sd], guards, guard_about(stack)))]
    for m in stack.members:
        units.append(Unit(m.name, "deployment", _plan_member(stack, m, facts), m))
    gw = gateway_node(stack)
    units.append(Unit(GATEWAY, "gateway", plan_unit(inv, GATEWAY, facts[gw.state_dir], [gw], gateway_about(stack))))
    for name in gone:
        units.append(Unit(name, "remove", plan_unit(inv, name, facts[state_dir_of(inv, name)], [], {})))
    return units


# -- up ---------------------------------------------------------------------------------------------------


def _read(
    session: Session,
    inv: Inventory,
    state_dir: str,
    what: str = "state",
    dep: Deployment | list[NodeDeployment] | None = None,
) -> dict[str, NodeFacts]:
    """Every node's facts as seen from one state dir (with the image IDs `dep` needs)."""
    nds = dep.nodes if isinstance(dep, Deployment) else dep or []
    wanted = {nd.node.name: sorted({c.image for c in nd.containers}) for nd in nds}
    facts = gather_facts(session, inv.nodes, lambda n: wanted.get(n.name, []), state_dir=state_dir, what=what)
    bad = {n: f for n, f in facts.items() if not isinstance(f, NodeFacts)}
    if bad:
        raise StepFailed("; ".join(f"{n}: UNREACHABLE, nothing changed: {e}" for n, e in bad.items()))
    return cast("dict[str, NodeFacts]", facts)


def _gateway_check(stack: Stack, deadline: float) -> tuple[bool, str]:
    """The gateway lists every model of the stack (its /v1/models, with the master key)."""
    key = stack.secrets.get("LITELLM_MASTER_KEY")
    want = {m.model for m in stack.members}
    last = ""
    while time.monotonic() < deadline:
        try:
            code, body = health.http_request(
                f"{stack.endpoint}/models",
                deadline=min(deadline, time.monotonic() + 5),
                headers={"Authorization": f"Bearer {key}"} if key else None,
            )
            if code == 200:
                have = {d.get("id") for d in json.loads(body).get("data", [])}
                if have == want:
                    return True, f"/v1/models lists {', '.join(sorted(want))}"
                last = f"/v1/models lists {', '.join(sorted(str(h) for h in have))}"
            else:
                last = f"HTTP {code}"
        except health.HTTP_ERRORS as exc:  # not up yet: asked again until the deadline
            last = f"{exc.__class__.__name__}: {exc}"
        time.sleep(0.5)
    return False, last


def up(
    path: str,
    inventory: str | None = None,
    recipes_dir: str | None = None,
    dry_run: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
    reporter: Reporter | None = None,
    result: dict[str, Any] | None = None,
    fabric_gate_on: bool = True,
) -> dict[str, Any]:
    """Converge the cluster to the stack file; return the `up --stack --json` result (masked).
    fabric_gate_on: False is `--no-fabric-gate` (deploy/fabric_gate.py), for every deployment of the stack."""
    out = reporter if reporter is not None else Reporter()
    result = result if result is not None else {}
    stack = load_stack(path, inventory, recipes_dir)
    if not dry_run:
        refuse_missing(stack.secrets)
    stack.secrets.require("LITELLM_MASTER_KEY", "the stack gateway's master key")
    out.use_mask(stack.secrets.mask)
    inv = stack.inventory
    result.update({"stack": path, "endpoint": stack.endpoint, "dry_run": dry_run, "ok": False})
    try:
        with (
            inventory_lock(inv),
            Interrupt(out.progress) as interrupt,
            Session.open(inv, mask=stack.secrets.mask) as session,
            node_locks(session, dry_run, out.warn),
        ):
            _up(stack, session, interrupt, out, result, dry_run, timeout, fabric_gate_on, inventory)
    finally:
        result.update(mask_data(stack.secrets.mask, result))
    return result


def _up(
    stack: Stack,
    session: Session,
    interrupt: Interrupt,
    out: Reporter,
    result: dict[str, Any],
    dry_run: bool,
    timeout: float,
    fabric_gate_on: bool = True,
    inventory_arg: str | None = None,
) -> None:
    inv = stack.inventory
    out.progress(f"reading facts on {', '.join(n.name for n in inv.nodes)}")
    base = _read(session, inv, inv.cluster.state_dir, what="all")
    totals = {n: f.total_memory_mb for n, f in base.items()}
    stack.head_cpus = base[stack.head.name].cpus
    util = budget(stack, totals)  # refuses (exit 2) before anything changes
    build(stack, util)
    result["memory"] = {m.name: util[m.name] for m in stack.members}
    for m in stack.members:
        assert m.deployment is not None
        for w in m.deployment.warnings:
            out.warn(f"{m.name}: {w}")
    running = deployments_on(cast("dict[str, NodeFacts | Exception]", base))
    wanted = {m.name for m in stack.members} | set(RESERVED)
    gone = sorted(running - wanted)
    unlabelled = sorted({c.name for f in base.values() for c in f.containers if not c.labels.get(DEPLOYMENT_LABEL)})
    if unlabelled:
        raise StepFailed(
            f"a single deployment runs on the nodes ({', '.join(unlabelled)}): run `sparkdeploy down` first "
            "(a stack never removes what `up` without --stack made). Nothing was changed."
        )
    facts = {m.state_dir: _read(session, inv, m.state_dir, dep=m.deployment) for m in stack.members}
    for name, nds in ((GATEWAY, [gateway_node(stack)]), (GUARD, guard_nodes(stack))):
        sd = state_dir_of(inv, name)  # their images: pushed here (they have no preflight of their own)
        facts[sd] = _read(session, inv, sd, dep=nds)
        if not dry_run and _push_images(inv, nds, facts[sd], out):
            facts[sd] = _read(session, inv, sd, dep=nds)
    for n in gone:
        facts[state_dir_of(inv, n)] = _read(session, inv, state_dir_of(inv, n))
    units = plan_stack(stack, facts, gone)
    result["units"] = [u.as_dict() for u in units]
    _check(stack, session, units, facts, base, out, result, dry_run, fabric_gate_on)  # nothing changed before
    result["units"] = [u.as_dict() for u in units]  # a pushed image re-planned its deployment
    if dry_run:
        for u in units:
            out.line(f"== {u.kind} {u.name}: {u.changes} change(s) ==", "bold")
            out.dry_run(u.plan)
        result["ok"] = True
        return
    for u in units:
        if interrupt.set:
            raise KeyboardInterrupt
        if u.kind == "remove":
            continue
        if u.member is None:  # the guards, the gateway
            _apply(session, u, out, stack, interrupt)
            continue
        dep = u.member.deployment
        assert dep is not None
        seen: dict[str, Any] = {"facts": u.facts, "fabric_gate": True, "plan": u.plan}
        mine: dict[str, Any] = {}
        try:
            _apply(session, u, out, stack, interrupt)
            if any(s.kind == StepKind.START_CONTAINER and s.status == CHANGED for s in u.plan.steps):
                health_phase(dep, session, u.plan, interrupt, timeout, out, mine, seen, who=u.name)
        except (KeyboardInterrupt, StepFailed) as exc:
            failure_lines(u.member.inventory, seen, exc, out, u.name)
            raise
        finally:
            if "health" in mine:
                result.setdefault("health", {})[u.name] = mine["health"]
    ok, detail = _gateway_check(stack, time.monotonic() + timeout)
    result.setdefault("health", {})[GATEWAY] = {"ok": ok, "detail": detail}
    if not ok:
        raise StepFailed(f"gateway: {detail}")
    for u in units:
        if u.kind == "remove":
            _apply(session, u, out, stack, interrupt)
    for u in units:  # what runs now, for `sparkdeploy history` (rollback names the stack file: it says what runs)
        if u.member is not None and u.changes:
            dep = cast(Deployment, u.member.deployment)
            rec = history.record_deployment(
                dep, session.conns, u.member.sets, inventory_arg, simulated(dep), stack=(stack.path, u.name)
            )
            result.setdefault("history_ids", {})[u.name] = rec["id"]
    result["units"] = [u.as_dict() for u in units]
    result["changed"] = sum(1 for u in units for s in u.plan.steps if s.status == CHANGED)
    result["ok"] = True
    out.line(f"{result['changed']} change(s); gateway {stack.endpoint}: {detail}", "green")


def _check(
    stack: Stack,
    session: Session,
    units: list[Unit],
    facts: dict[str, dict[str, NodeFacts]],
    base: dict[str, NodeFacts],
    out: Reporter,
    result: dict[str, Any],
    dry_run: bool,
    fabric_gate_on: bool,
) -> None:
    """`up`'s checks for every deployment of the stack, before anything changes: preflight (with the image push
    and the model check) where it starts something, then the fabric gate (cluster / replicas that change)."""
    inv = stack.inventory
    checks: list[preflight.Result] = []
    for u in units:
        m = u.member
        if m is None:
            continue
        dep = cast(Deployment, m.deployment)

        def own(read: dict[str, NodeFacts], name: str = u.name) -> dict[str, NodeFacts]:
            return {n: _with_resources(only(f, name), base[n]) for n, f in read.items()}

        u.facts = own(facts[m.state_dir])
        if not any(s.kind == StepKind.START_CONTAINER and s.change for s in u.plan.steps):
            continue  # only deployments that start something: ports, images, memory of the engines that change

        def read(m: Member = m, u: Unit = u) -> dict[str, NodeFacts | Exception]:
            facts[m.state_dir] = _read(session, inv, m.state_dir, dep=m.deployment)
            u.facts = own(facts[m.state_dir], u.name)
            u.plan = _plan_member(stack, m, facts)  # a pushed image: its ID changed the plan
            return cast("dict[str, NodeFacts | Exception]", u.facts)

        mine: dict[str, Any] = {}
        cs, _ = run_preflight(
            dep,
            session,
            cast("dict[str, NodeFacts | Exception]", u.facts),
            read,
            out,
            simulated(dep),
            dry_run,
            False,
            mine,
        )
        if mine.get("pushed"):
            result.setdefault("pushed", []).extend(mine["pushed"])
        checks += [dataclasses.replace(c, check=f"{u.name}: {c.check}") for c in cs]
    result["preflight"] = [c.as_row() for c in checks]
    failed = preflight.failures(checks)
    if failed:
        out.preflight(checks)
        raise refusal(failed)
    for u in units:
        if u.member is None:
            continue
        dep = cast(Deployment, u.member.deployment)
        mine = {}
        try:
            fabric_gate.gate(
                dep,
                session,
                cast("dict[str, NodeFacts | Exception]", u.facts),
                u.plan,
                out,
                mine,
                dry_run,
                fabric_gate_on,
                simulated(dep),
                who=u.name,
            )
        except StepFailed as exc:
            failure_lines(u.member.inventory, {"facts": u.facts, "fabric_gate": True}, exc, out, u.name)
            raise
        finally:
            if mine.get("fabric_gate", {}).get("status") not in (None, fabric_gate.NOT_APPLICABLE):
                result.setdefault("fabric_gate", {})[u.name] = mine["fabric_gate"]


def _plan_member(stack: Stack, m: Member, facts: dict[str, dict[str, NodeFacts]]) -> Plan:
    dep = cast(Deployment, m.deployment)
    about = describe(dep) | {"deployment": m.name, "endpoint": stack.endpoint}
    # what renders it again without the stack file (doctor's recipe checks: `rebuild`)
    about["stack"] = {"nodes": m.node_names, "port": m.port, "sets": m.sets}
    return plan_unit(stack.inventory, m.name, facts[m.state_dir], dep.nodes, about, dep.groups)


def _push_images(inv: Inventory, nds: list[NodeDeployment], facts: dict[str, NodeFacts], out: Reporter) -> bool:
    """The images of the gateway or the guards that a node lacks, pushed to it; True when any was."""
    missing: dict[str, list[Node]] = {}
    for nd in nds:
        for c in nd.containers:
            if facts[nd.node.name].images.get(c.image) is None:
                missing.setdefault(preflight.image_definition_name(c.image), []).append(nd.node)
    for name, nodes in sorted(missing.items()):
        out.progress(f"pushing image {name} to {', '.join(n.name for n in nodes)}")
        for o in push.push_image(name, inv, nodes):
            if not o.ok:
                raise StepFailed(f"push of {name} to {o.node.name} failed: {o.error}")
    return bool(missing)


def _with_resources(f: NodeFacts, base: NodeFacts) -> NodeFacts:
    g = dataclasses.replace(f)
    g.add_resources(base)
    return g


def _apply(session: Session, u: Unit, out: Reporter, stack: Stack, interrupt: Interrupt | None = None) -> None:
    if not u.changes:
        return
    mask = stack.secrets.mask
    apply_phase(session, u.plan, interrupt, mask, out, f"{u.kind} {u.name}", {}, f"sparkdeploy up --stack {stack.path}")
    out.line(f"{u.name}: {plan_summary(u.plan)}")


# -- down / narrowing -------------------------------------------------------------------------------------


def check_deployment(facts: dict[str, NodeFacts | Exception], deployment: str | None) -> None:
    """--deployment NAME (down, status, logs): a deployment of a stack that runs on the nodes."""
    names = deployments_on(facts)
    if deployment is not None and deployment not in names:
        raise ConfigError(
            Problem(
                "--deployment",
                deployment,
                "no deployment of that name runs on the nodes",
                f"running: {', '.join(sorted(names)) or 'none (a single deployment has no name)'}",
            )
        )


def down_plans(
    session: Session, inv: Inventory, good: dict[str, NodeFacts], deployment: str | None
) -> list[tuple[str, Plan]]:
    """`down`'s removal plans for the stack deployments on the reachable nodes (or only `deployment`), the
    gateway last; each removes its own containers and its state dir's files."""
    check_deployment(cast("dict[str, NodeFacts | Exception]", good), deployment)
    nodes = [n for n in inv.nodes if n.name in good]
    names = {deployment} if deployment else deployments_on(cast("dict[str, NodeFacts | Exception]", good))
    if deployment is None:  # also state dirs whose containers are gone (a single `up` replaced the stack)
        names |= _state_dirs_on(session, inv, nodes)
    ordered = sorted(names - {GATEWAY}) + ([GATEWAY] if GATEWAY in names else [])
    plans = []
    for name in ordered:
        sd = state_dir_of(inv, name)
        read = gather_facts(session, nodes, state_dir=sd)
        facts = {n: f for n, f in read.items() if isinstance(f, NodeFacts)}
        plans.append((name, plan_unit(inv, name, facts, [], {})))
    if deployment is not None and deployment not in RESERVED:  # its nodes' guard goes where no engine is left
        left = {
            n
            for n, f in good.items()
            for c in f.containers
            if c.labels.get(DEPLOYMENT_LABEL) not in (None, deployment, *RESERVED)
            and c.labels.get(ROLE_LABEL) not in NOT_ENGINES
        }
        idle = [n for n in nodes if n.name not in left]
        read = gather_facts(session, idle, state_dir=state_dir_of(inv, GUARD)) if idle else {}
        facts = {n: f for n, f in read.items() if isinstance(f, NodeFacts)}
        if any(only(f, GUARD).containers for f in facts.values()):
            plans.append((GUARD, plan_unit(inv, GUARD, facts, [], {})))
    return plans


# The names of the stack state dirs on a node (`<state_dir>-NAME` holding a manifest of ours). Read-only.
_STATE_DIRS = r"""for d in "$HOME/$1"-*/; do [ -f "$d/manifest.json" ] && basename "$d"; done; exit 0"""


def _state_dirs_on(session: Session, inv: Inventory, nodes: list[Node]) -> set[str]:
    prefix = inv.cluster.state_dir.rsplit("/", 1)[-1] + "-"
    out: set[str] = set()
    for node in nodes:
        r = session.conn(node).run(["bash", "-c", _STATE_DIRS, "sparkdeploy-down", inv.cluster.state_dir], check=False)
        for line in r.stdout.split():
            name = line.removeprefix(prefix)
            if line.startswith(prefix) and (NAME.match(name) or name == GATEWAY):
                out.add(name)
    return out


def health_ports(
    session: Session, inv: Inventory, facts: dict[str, NodeFacts | Exception]
) -> dict[str, dict[str, tuple[Any, Any]]]:
    """node -> container -> (health port, role) from the manifests of the stack deployments that run there
    (status probes them as it probes the single deployment's)."""
    out: dict[str, dict[str, tuple[Any, Any]]] = {}
    nodes = [n for n in inv.nodes if isinstance(facts.get(n.name), NodeFacts)]
    for name in sorted(deployments_on(facts)):
        for node, f in gather_facts(session, nodes, state_dir=state_dir_of(inv, name)).items():
            listed = (f.manifest or {}).get("containers") or [] if isinstance(f, NodeFacts) else []
            for c in listed:
                if isinstance(c, dict):
                    out.setdefault(node, {})[str(c.get("name"))] = (c.get("health_port"), c.get("role"))
    return out


def unlabelled(good: dict[str, NodeFacts]) -> dict[str, NodeFacts]:
    """The facts as the single deployment sees them: containers of no stack deployment."""
    return {
        n: dataclasses.replace(f, containers=[c for c in f.containers if not c.labels.get(DEPLOYMENT_LABEL)])
        for n, f in good.items()
    }


__all__ = ["GATEWAY", "SparkdeployError", "Stack", "budget", "fits", "load_stack", "plan_stack", "up"]
