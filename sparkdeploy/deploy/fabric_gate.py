"""The fabric gate (issue 26 item 4): before any engine of a `cluster` or `replicas` topology starts, `up` proves
the fabric and the software stack the engines will share, and refuses before anything starts when they fail.

What it runs are doctor's own checks (doctor/registry.py, one check model), over `up`'s connections and facts:
  - image.same_id: one image ID per tag on every node;
  - image.torch_nccl: torch, CUDA and NCCL inside the serving image equal on every node;
  - gpu.same_driver: one NVIDIA driver on every node (nvidia-smi, the fact layer);
  - nccl.allreduce's probe (doctor/nccl_probe.py `measure`): the all-reduce sweep in the serving image, one rank
    per node, rendezvous at the head's fabric IP, judged by the same verdict as `doctor --nccl`. On a real pair a
    busbw under 25 % of the CX7's figure fails; in the lab (a SIMULATED image, no GPU) the probe runs gloo on CPU
    over the fabric IPs: the rendezvous and the link are real, the figure is not a GB10's and says SIMULATED.
The version checks run first: with mixed builds the probe would hang, so it is not run.

When: only where the plan (re)starts an engine container of a gated topology (an unchanged deployment skips it,
saying so); `--no-fabric-gate` skips it and the output says so; `up --dry-run` shows a plan line, runs nothing.
`decide` is the pure decision (tests/deploy/test_fabric_gate.py); `gate` is the one hook `up` calls.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sparkdeploy.checks import FAIL, SKIP, WARN, Result
from sparkdeploy.config.inventory import Node
from sparkdeploy.deploy.plan import Plan, StepKind
from sparkdeploy.deploy.preflight import PreflightRun
from sparkdeploy.deploy.progress import Reporter
from sparkdeploy.deploy.up_result import UpResult
from sparkdeploy.doctor import nccl_probe
from sparkdeploy.doctor.check_context import SessionContext
from sparkdeploy.doctor.doctor_run import NodeSession, Options, _Memo
from sparkdeploy.doctor.registry import BY_ID
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.facts import NodeFacts, add_resources
from sparkdeploy.runtime.session import Session
from sparkdeploy.topologies.deployment import Deployment

GATED = ("cluster", "replicas")  # topologies whose engines all-reduce over the fabric
CHECKS = ("image.same_id", "image.torch_nccl", "gpu.same_driver")  # doctor's, in this order, before the probe
PROBE = "nccl.allreduce"
TIMEOUT_S = 40.0  # the probe's own --timeout: a rank that cannot reach the head ends within it (+20 s for SSH)
# Another probe timeout, in seconds, from the environment: for a test that breaks the fabric on purpose and
# would otherwise wait the whole TIMEOUT_S for the refusal it expects (tests/deploy/test_fabric_gate_lab.py).
TIMEOUT_ENV = "SPARKDEPLOY_FABRIC_GATE_TIMEOUT_S"
MAX_BYTES_SIMULATED = 4 * 2**20  # gloo on CPU: the rendezvous and a few sizes, quick on 2 cores
MAX_BYTES_GPU = 64 * 2**20  # NCCL on the CX7: near the peak busbw, a few seconds

RUN, SKIPPED, NOT_APPLICABLE = "run", "skipped", "not applicable"


@dataclass(frozen=True)
class Decision:
    action: str  # RUN | SKIPPED | NOT_APPLICABLE
    reason: str

    @property
    def runs(self) -> bool:
        return self.action == RUN


def decide(topology: str, enabled: bool, changing: Sequence[str]) -> Decision:
    """Whether the gate runs. changing: the engine containers the plan (re)starts, as "node: container"."""
    if topology not in GATED:
        return Decision(NOT_APPLICABLE, f"{topology}: no engine spans nodes, nothing all-reduces over the fabric")
    if not enabled:
        return Decision(SKIPPED, "skipped (--no-fabric-gate): the fabric and the nodes' NCCL/CUDA/driver not checked")
    if not changing:
        return Decision(SKIPPED, "skipped: the deployment is unchanged (no engine container changes)")
    return Decision(RUN, f"all-reduce probe over the fabric + same NCCL/CUDA/driver/image before {', '.join(changing)}")


def engine_changes(plan: Plan) -> list[str]:
    """The engine containers the plan starts or replaces ("node: container")."""
    return [
        f"{s.node}: {s.target}"
        for s in plan.steps
        if s.kind == StepKind.START_CONTAINER and s.change and (s.container is None or s.container.is_engine)
    ]


@dataclass
class GateRun(PreflightRun):
    """What doctor's checks look at, from `up`: its facts (PreflightRun) plus its open connections for the checks
    that run commands (the image's versions, the probe)."""

    sessions: dict[str, NodeSession] = field(default_factory=dict)
    memo: _Memo = field(default_factory=_Memo)
    extra: dict[str, Any] = field(default_factory=dict)
    options: Options = field(default_factory=Options)

    def session(self, node: Node) -> NodeSession:
        return self.sessions[node.name]


def failures(rows: Sequence[Result]) -> list[Result]:
    return [r for r in rows if r.status == FAIL]


def _rows(check_id: str, out: Result | list[Result], node: Node | None) -> list[Result]:
    rows = out if isinstance(out, list) else [out]
    for r in rows:
        r.check = check_id
        r.node = r.node if r.node is not None else (node.name if node else None)
    return [r for r in rows if r.status != SKIP]


def probe_timeout_s() -> float:
    """TIMEOUT_S, or the environment's TIMEOUT_ENV (seconds above 0; anything else is refused, exit 2)."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(
            Problem(
                "environment",
                TIMEOUT_ENV,
                f"{raw!r} is not a number of seconds above 0",
                f"unset it (the gate then waits {TIMEOUT_S:g} s) or set seconds, e.g. 20",
            )
        )
    return value


def run_checks(ctx: SessionContext, timeout_s: float = TIMEOUT_S) -> list[Result]:
    """doctor's version checks, then (when they pass) the probe; one row per node or per cluster check."""
    rows: list[Result] = []
    for check_id in CHECKS:
        check = BY_ID[check_id]
        if check.scope == "node":
            for node in ctx.nodes:
                rows += _rows(check_id, check.fn(ctx, node), node)
        else:
            rows += _rows(check_id, check.fn(ctx), None)
    if failures(rows):
        rows.append(Result(FAIL, "not run: the nodes' builds differ (rows above)", "", "fix those first", check=PROBE))
        return rows
    rows += _rows(PROBE, nccl_probe.measure(cast(Any, ctx), timeout_s), None)  # a GateRun offers what it reads
    return rows


def gate(
    dep: Deployment,
    session: Session,
    facts: dict[str, NodeFacts | Exception],
    plan: Plan,
    out: Reporter,
    result: UpResult,
    dry_run: bool,
    enabled: bool,
    simulated: bool,
    who: str = "",
) -> None:
    """`up`'s hook between preflight and the apply of its steps: decide, run, report into result.fabric_gate,
    and raise StepFailed (nothing changed yet) when a check fails. who: a stack deployment's name (`up --stack`
    gates each of its deployments before any of them changes)."""
    at = f"{who}: " if who else ""
    decision = decide(dep.topology, enabled, engine_changes(plan))
    report: dict[str, Any] = {"status": decision.action, "reason": decision.reason, "simulated": simulated}
    result.fabric_gate = report
    if decision.action == NOT_APPLICABLE:
        return
    if not decision.runs:
        out.line(f"{at}fabric gate: {decision.reason}", "yellow")
        return
    if dry_run:
        report["status"] = "planned"
        out.line(f"{at}fabric gate: will run before any engine starts: {decision.reason}")
        return
    started = time.monotonic()
    out.progress(f"{at}fabric gate: {decision.reason}")
    lacking = {n for n, f in facts.items() if isinstance(f, NodeFacts) and not f.has("gpu")}
    if lacking:  # the driver (nvidia-smi) is a resources fact, read only where something started
        add_resources(session, facts, lacking, dep.inventory.cluster.hf_cache, dep.recipe.recipe.model)
    ctx = GateRun(
        dep,
        facts,
        simulated,
        sessions={n.name: NodeSession(n, session.conn(n), connected=True) for n in dep.inventory.nodes},
        options=Options(nccl=True, nccl_max_bytes=MAX_BYTES_SIMULATED if simulated else MAX_BYTES_GPU),
    )
    rows = run_checks(ctx, probe_timeout_s())
    seconds = time.monotonic() - started
    failed = failures(rows)
    report.update(
        status="failed" if failed else "passed",
        seconds=round(seconds, 2),
        checks=[r.to_dict() for r in rows],
    )
    probe = next((r for r in rows if r.check == PROBE), None)
    sim = " SIMULATED" if simulated else ""
    if failed:
        out.preflight(rows)
        first = failed[0]
        raise StepFailed(
            f"{at}fabric gate failed{sim} ({len(failed)} check(s); first: {first.check}"
            + (f" on {first.node}" if first.node else "")
            + f": {first.measured}; expected: {first.expected or '-'}"
            + (f"; fix: {first.fix}" if first.fix else "")
            + "). No engine was started; nothing was changed on any node. "
            "`--no-fabric-gate` skips the gate (at your own risk)."
        )
    for r in rows:
        if r.status == WARN:
            out.warn(f"{at}fabric gate: {r.check}{' on ' + r.node if r.node else ''}: {r.measured} (fix: {r.fix})")
    out.line(
        f"{at}fabric gate passed in {seconds:.1f} s: {len(rows)} checks"
        + (f"; {probe.measured}" if probe is not None else ""),
        "green",
    )
