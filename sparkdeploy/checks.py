"""What a check is and what it reports: the one check model of doctor AND `up`'s preflight.

A check has an id (`group.name`), a one-line title, a scope (one row per node, or one row for the cluster)
and a timeout. It returns a `Result`: pass / warn / fail / skip, what it measured, what it expected and,
unless it passed, a one-line fix. A check with a `preflight` name is deploy-critical: `up` runs it over the
facts it read before changing anything (sparkdeploy/deploy/preflight.py), the same function doctor runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
STATUSES = (PASS, WARN, FAIL, SKIP)
Scope = Literal["node", "cluster"]


@dataclass
class Result:
    status: str
    measured: str = ""
    expected: str = ""
    fix: str = ""
    detail: str = ""  # more lines for --json / verbose output
    simulated: bool = False  # the fact came from a lab stand-in (printed as SIMULATED)
    data: dict[str, Any] = field(default_factory=dict)  # machine-readable extras (--json)
    missing_image: str | None = None  # an image reference a push would fix (`up` pushes it, then checks again)
    # filled by the runner
    check: str = ""
    node: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Not failed: a warning does not stop `up`."""
        return self.status != FAIL

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not out["data"]:
            out.pop("data")
        if out["missing_image"] is None:
            out.pop("missing_image")
        return out

    def as_row(self) -> dict[str, Any]:
        """`up`'s preflight row (--json): node, check, ok, detail, fix."""
        return {"node": self.node, "check": self.check, "ok": self.ok, "detail": self.measured, "fix": self.fix}


def ok(measured: str, expected: str = "", **kw: Any) -> Result:
    return Result(PASS, measured, expected, **kw)


def warn(measured: str, expected: str, fix: str, **kw: Any) -> Result:
    return Result(WARN, measured, expected, fix, **kw)


def fail(measured: str, expected: str, fix: str, **kw: Any) -> Result:
    return Result(FAIL, measured, expected, fix, **kw)


def skip(reason: str, **kw: Any) -> Result:
    return Result(SKIP, reason, **kw)


def worst(statuses: Iterable[str]) -> str:
    order = {PASS: 0, SKIP: 0, WARN: 1, FAIL: 2}
    best = PASS
    for s in statuses:
        if order[s] > order[best]:
            best = s
    return best


@dataclass(frozen=True)
class Check:
    id: str
    title: str  # what it checks, one line
    fn: Callable[..., Result | list[Result]]
    scope: Scope = "node"
    timeout_s: float = 20.0
    needs_recipe: bool = False  # skipped (with the reason) when no recipe could be rendered
    opt_in: str | None = None  # only with this option (e.g. "nccl" for --nccl)
    preflight: str | None = None  # deploy-critical: `up` runs it before any change, under this short name
    gate: bool = False  # preflight: a failure here skips the node's later checks (no SSH, no Docker)

    @property
    def group(self) -> str:
        return self.id.split(".", 1)[0]
