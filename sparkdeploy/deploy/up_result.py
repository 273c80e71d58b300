"""What `up` returns and how far a run got (deploy/up.py; `up --stack` runs the same phases per deployment).

`UpResult` is the `up --json` contract as typed fields: `as_dict()` writes the keys set so far, in the order `up`
reaches them, masked. `Progress` is how far the run got: its `phase` says what a failure's per-node lines say
(deploy/up.py `failure_lines`), beside the facts, plan and health gate those lines read."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sparkdeploy.deploy.health import GateResult
from sparkdeploy.deploy.plan import Plan
from sparkdeploy.deploy.progress import mask_data
from sparkdeploy.facts import NodeFacts

JsonDict = dict[str, Any]  # one JSON object of the contract (a row, a report): built by its own module's as_dict


class Phase(StrEnum):
    """How far a run got, in flow order. A failure's lines per node depend on it."""

    CONNECT = "connect"  # connected and locked; no fact read yet
    PREFLIGHT = "preflight"  # facts read: preflight (and the model check) judge them; nothing changes
    FABRIC_GATE = "fabric_gate"  # preflight passed: the fabric gate decides, before any engine starts
    APPLY = "apply"  # the plan's steps are applied on every node
    HEALTH = "health"  # every step applied: the health gate answered (or was stopped)


@dataclass
class Progress:
    """How far one run (or one deployment of a stack) got, and what it saw on the way."""

    phase: Phase = Phase.CONNECT
    facts: Mapping[str, NodeFacts | Exception] | None = None
    plan: Plan | None = None  # set when its steps start to be applied
    gate: GateResult | None = None

    def reach(self, phase: Phase) -> None:
        self.phase = phase


@dataclass(frozen=True)
class Deployed:
    """What the run deploys, known once the recipe and the inventory are rendered (the first keys of --json)."""

    recipe: str
    topology: str
    backend: str | None
    image: str
    endpoint: str
    backends: list[str]
    metrics_url: str | None


@dataclass
class UpResult:
    """`up`'s result: the `up --json` contract. A field that is None was not reached (its key is absent)."""

    rolled_back_to: str | None = None  # `rollback`: the record brought back
    deployed: Deployed | None = None
    dry_run: bool = False
    ok: bool = False
    registry_image: JsonDict | None = None  # a registry image pulled once and spread (deploy/registry_image.py)
    replaces: str | None = None  # the deployment the nodes ran before (deploy/up.py `replaces`)
    pushed: list[JsonDict] | None = None  # images pushed before preflight ran again (deploy/up.py `push_missing`)
    preflight: list[JsonDict] | None = None
    fabric_gate: JsonDict | None = None
    steps: list[JsonDict] | None = None
    changes: int | None = None  # --dry-run: the steps that would change something
    changed: int | None = None
    counts: dict[str, int] | None = None
    health: JsonDict | None = None
    history_id: str | None = None
    mask: Callable[[str], str] | None = field(default=None, repr=False)  # the deployment's secrets, masked out

    def as_dict(self) -> JsonDict:
        """The --json object: only what the run reached, in flow order, every string masked."""
        data: JsonDict = {}
        if self.rolled_back_to is not None:
            data["rolled_back_to"] = self.rolled_back_to
        if self.deployed is not None:
            d = self.deployed
            data.update(
                recipe=d.recipe,
                topology=d.topology,
                backend=d.backend,
                image=d.image,
                endpoint=d.endpoint,
                backends=d.backends,
                metrics_url=d.metrics_url,
                dry_run=self.dry_run,
                ok=self.ok,
            )
        later: JsonDict = {
            "registry_image": self.registry_image,
            "replaces": self.replaces,
            "pushed": self.pushed,
            "preflight": self.preflight,
            "fabric_gate": self.fabric_gate,
            "steps": self.steps,
            "changes": self.changes,
            "changed": self.changed,
            "counts": self.counts,
            "health": self.health,
            "history_id": self.history_id,
        }
        data.update({k: v for k, v in later.items() if v is not None})
        masked: JsonDict = mask_data(self.mask, data) if self.mask is not None else data
        return masked
