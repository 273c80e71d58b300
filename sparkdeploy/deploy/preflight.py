"""`up`'s checks before anything changes anywhere: the deploy-critical subset of the doctor registry.

The checks are doctor's own (doctor/registry.py PREFLIGHT: the entries with a `preflight` name), the same
functions and formulas, run here over the facts `up` already read (one round trip per node) instead of a
doctor session: reachable over SSH, Docker usable by the SSH user, the state dir ours, no foreign container
holding one of our names, the images present with one image ID on every node, the ports free or ours, the
memory budget (sparkdeploy/recipes/budget.py) and disk. Any failure aborts the whole run; a missing image carries
`missing_image`, which `up`'s image step pushes (and reads those nodes again) before the checks judge again.
With `up`'s one plan given, the checks read what starts from it (`starts_engine`) and plan nothing themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkdeploy.checks import SKIP, Check, Result, fail, ok
from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.deploy.plan import Plan, StepKind, plan_node
from sparkdeploy.doctor.check_context import CheckContext
from sparkdeploy.doctor.image import image_definition_name
from sparkdeploy.doctor.registry import PREFLIGHT
from sparkdeploy.errors import SparkdeployError, StepFailed
from sparkdeploy.facts import NodeFacts
from sparkdeploy.topologies.deployment import Deployment, NodeDeployment

__all__ = ["PREFLIGHT", "PreflightRun", "Result", "failures", "image_definition_name", "run"]


@dataclass
class PreflightRun:
    """What a check looks at, from `up`'s facts: the same attributes a doctor run offers its checks."""

    deployment: Deployment
    facts: dict[str, NodeFacts | Exception]
    simulated_image: bool = False
    plan: Plan | None = None  # `up`'s one plan over these facts (None: each node planned where a check asks)

    @property
    def inventory(self) -> Inventory:
        return self.deployment.inventory

    @property
    def nodes(self) -> list[Node]:
        return list(self.inventory.nodes)

    def peers(self, node: Node) -> list[Node]:
        return [n for n in self.nodes if n.name != node.name]

    def reachable(self, node: Node) -> bool:
        return isinstance(self.facts.get(node.name), NodeFacts)

    def node_deployment(self, node: Node) -> NodeDeployment | None:
        return next((nd for nd in self.deployment.nodes if nd.node.name == node.name), None)

    def node_facts(self, node: Node) -> NodeFacts:
        f = self.facts.get(node.name)
        if not isinstance(f, NodeFacts):
            raise StepFailed(f"{node.name}: facts not read ({f or 'not checked'})")
        return f

    def starts_engine(self, node: Node) -> bool:
        """Whether the plan (re)starts an engine here: an engine running unchanged holds its memory already."""
        nd = self.node_deployment(node)
        if nd is None:
            return False
        engines = {c.name for c in nd.containers if c.is_engine}
        if self.plan is None:
            steps = plan_node(self.deployment, nd, self.node_facts(node)).steps
        else:  # a rank restarting only with its group: its own engine was as wanted (plan_node's view)
            steps = [s for s in self.plan.node(node.name).steps if not s.with_group]
        return any(s.kind == StepKind.START_CONTAINER and s.change and s.target in engines for s in steps)

    def ssh_check(self, node: Node) -> Result:
        f = self.facts.get(node.name)
        if isinstance(f, NodeFacts):
            return ok(f"{node.ssh.user or ''}@{node.mgmt_ip}".lstrip("@"), "reachable over SSH, known host key")
        return fail(str(f) if f else "not checked", "reachable over SSH, known host key", _ssh_fix(f))


def _ssh_fix(error: Exception | None) -> str:
    text = str(error or "")
    if "sparkdeploy trust" in text:
        return ""  # the message already names the command
    if "authentication" in text:
        return "check ssh.user and ssh.key in the inventory"
    return "check that the node is on, sshd runs, and mgmt_ip and ssh.port are right"


def _call(check: Check, ctx: CheckContext, node: Node | None) -> list[Result]:
    try:
        out = check.fn(ctx, node) if node is not None else check.fn(ctx)
    except SparkdeployError as exc:  # a node's engine answered something else than expected: that row fails
        out = fail(str(exc), "", f"see the error above; sparkdeploy doctor --only {check.id}")
    rows = out if isinstance(out, list) else [out]
    for r in rows:
        r.check = check.preflight or check.id
        r.node = r.node if r.node is not None else (node.name if node else None)
    return [r for r in rows if r.status != SKIP]


def run(
    dep: Deployment, facts: dict[str, NodeFacts | Exception], simulated: bool = False, plan: Plan | None = None
) -> list[Result]:
    """Every preflight check (doctor/registry.py PREFLIGHT) for every node of the inventory, in registry order;
    a failed gate check (no SSH, no Docker) skips the node's later checks. `facts[name]` is the node's facts
    or why they are missing; `plan`: the plan made from them (what starts where), when the caller has it."""
    ctx: CheckContext = PreflightRun(dep, facts, simulated, plan)  # what a preflight check takes: no session
    rows: list[Result] = []
    for node in ctx.nodes:
        for check in (c for c in PREFLIGHT if c.scope == "node"):
            got = _call(check, ctx, node)
            rows.extend(got)
            if check.gate and any(not r.ok for r in got):
                break
    for check in (c for c in PREFLIGHT if c.scope == "cluster"):
        rows.extend(_call(check, ctx, None))
    return rows


def failures(checks: list[Result]) -> list[Result]:
    return [c for c in checks if not c.ok]
