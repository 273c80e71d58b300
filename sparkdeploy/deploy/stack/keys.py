"""Per-user keys of a stack's gateway (`sparkdeploy keys create | list | revoke`).

LiteLLM's own virtual keys need its database client (prisma), whose CLI installs a Node runtime and npm
packages at its first run (litellm_proxy_extras/prisma_toolchain.py): nothing these machines can fetch hashed
from PyPI. So the keys are a file read by the gateway's auth hook (sparkdeploy/nodeside/gateway/gateway_hook.py,
LiteLLM's documented `custom_auth`): `keys.json` in the gateway's state dir on the head node, mode 0600, holding per key
its name, the sha256 of its token, its models, rpm and max budget, never the token. The token (sk-sd-…) is
shown once, at create. The hook re-reads the file when it changes: a revoked key is refused from the next
request; the file is not `up`'s (never in its manifest), so keys survive a gateway restart, `up` and `down`.

The max budget is in tokens (prompt + completion, as each answer's usage counts them): self-hosted models have
no price, and LiteLLM's USD budgets need its database. The hook counts them (gateway_spend.py, a sqlite file on
the gateway's state volume) and refuses a key that has spent its budget (429, "budget exceeded"); `keys list`
reads the counts from inside the gateway container (docs/gateway.md).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sparkdeploy import names
from sparkdeploy.config.inventory import Inventory, load_inventory
from sparkdeploy.config.schema import Number, Whole, problems_from_validation
from sparkdeploy.config.userfile import parse_json
from sparkdeploy.deploy.plan import KEYS_FILE
from sparkdeploy.deploy.stack import routes as gateway_routes
from sparkdeploy.deploy.stack.units import GATEWAY_CONTAINER, SPEND_VOLUME
from sparkdeploy.errors import ConfigError, Invalid, Problem, StepFailed, escape_controls
from sparkdeploy.facts import FactArgs, gather
from sparkdeploy.recipes.recipe import MODEL_NAME
from sparkdeploy.runtime.locks import inventory_lock
from sparkdeploy.runtime.remote import NodeConnection
from sparkdeploy.runtime.session import Session
from sparkdeploy.topologies.running_stack import GATEWAY, state_dir_of

TOKEN_PREFIX = "sk-sd-"
BUDGET = re.compile(r"([0-9]+(?:\.[0-9]+)?)([kKmMgG]?)")
SCALE = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}
MAX_BUDGET = 10**15  # tokens: far beyond any use, small enough for sqlite's integers
SPEND_DB = f"{SPEND_VOLUME[1]}/spend.sqlite"  # inside the gateway container (gateway_spend.DB)


def parse_budget(text: str) -> int:
    """--max-budget: a whole number of tokens, with an optional k / M / G (1000s): "50000", "50k", "1.5M"."""
    m = BUDGET.fullmatch(text.strip())
    tokens = round(float(m.group(1)) * SCALE[m.group(2).lower()]) if m else 0
    if not m or not 1 <= tokens <= MAX_BUDGET:
        raise ConfigError(
            Problem(
                "keys create",
                "--max-budget",
                f"{text!r} is not a budget in tokens",
                "a whole number of tokens (prompt + completion) >= 1, e.g. 200000 or 200k",
            )
        )
    return tokens


RECREATE = "revoke the key and create it again (sparkdeploy keys revoke NAME; keys create NAME)"


class KeyEntry(BaseModel):
    """One key of keys.json as the head node hands it back (written by `keys create`; checked on read: the file
    is on a node, and a hand-edited one must not crash `keys list` or reach the terminal raw)."""

    model_config = ConfigDict(extra="allow")

    name: names.KeyName
    sha256: str = Field(pattern=r"\A[0-9a-f]{64}\z")  # pydantic: Rust regex, \z the very end
    models: list[str] = Field(default_factory=list)
    rpm: Whole | None = Field(default=None, ge=1)
    max_budget: Whole | Number | None = None
    budget_unit: Literal["tokens"] | None = None
    created: str = Field(default="", max_length=64)

    @field_validator("models")
    @classmethod
    def _models(cls, v: list[str]) -> list[str]:
        for m in v:
            if not MODEL_NAME.fullmatch(m):
                raise Invalid(
                    f"{escape_controls(repr(m[:80]))} is not a model name",
                    RECREATE,
                )
        return v

    @field_validator("created")
    @classmethod
    def _created(cls, v: str) -> str:
        if not re.fullmatch(r"[0-9T:.Z+-]*", v):
            raise Invalid(
                f"{escape_controls(repr(v))} is not a time",
                RECREATE,
            )
        return v


class KeysFile(BaseModel):
    model_config = ConfigDict(extra="allow")

    keys: list[KeyEntry] = Field(default_factory=list)


class Manifest(BaseModel):
    model_config = ConfigDict(extra="allow")

    models: list[str] = Field(default_factory=list)


def parse_keys(text: str, source: str) -> list[dict[str, Any]]:
    """keys.json from the head node, through the one door's JSON reader and the schema above."""
    data = parse_json(text, source, fix="restore it, or revoke and create the keys again")
    try:
        return [k.model_dump() for k in KeysFile.model_validate(data).keys]
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, source, KeysFile)) from None


def parse_manifest_models(text: str, source: str) -> list[str]:
    """The models of the gateway's manifest.json (written by `up --stack`), read the same way."""
    data = parse_json(text, source, fix="run `sparkdeploy up --stack FILE` again (it rewrites it)")
    try:
        return list(Manifest.model_validate(data).models)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, source, Manifest)) from None


def check_new(name: str, models: list[str], served: list[str], existing: list[dict[str, Any]]) -> list[Problem]:
    """What is wrong with key `name` for `models` on a gateway serving `served` that has keys `existing`."""
    problems = [
        Problem("keys create", "--models", f"no deployment serves {m}", f"served: {', '.join(served) or 'none'}")
        for m in models
        if m not in served
    ]
    if any(k.get("name") == name for k in existing):
        problems.append(Problem("keys create", name, "a key of that name exists", "revoke it first, or pick a name"))
    return problems


@dataclass
class Gateway:
    inventory: Inventory
    conn: NodeConnection
    state_dir: str

    @property
    def path(self) -> str:
        return f"{self.state_dir}/{KEYS_FILE}"

    def _cat(self, name: str) -> str | None:
        r = self.conn.run(["cat", "--", f"{self.state_dir}/{name}"], check=False)
        if r.ok:
            return r.stdout
        if "No such file" in r.stderr:
            return None
        raise StepFailed(f"{self.conn.node.name}: cannot read {self.state_dir}/{name}: {r.stderr.strip()[-200:]}")

    def _source(self, name: str) -> str:
        return f"{self.conn.node.name}:{self.state_dir}/{name}"

    def models(self) -> list[str]:
        """The models of the stack's deployments (the gateway's routes.json, read through the facts: a deployment
        that `down` removed is not one; one taken out for a while still is)."""
        facts = gather(self.conn, ("routes",), FactArgs(state_dir=self.state_dir))
        routes = gateway_routes.parse(facts.routes)
        if routes is None:
            raise StepFailed(
                f"no stack gateway routes on {self.conn.node.name} (~/{self.state_dir}/{gateway_routes.ROUTES_FILE}): "
                "run `sparkdeploy up --stack FILE` first"
            )
        return routes.models()

    def keys(self) -> list[dict[str, Any]]:
        text = self._cat(KEYS_FILE)
        return parse_keys(text, self._source(KEYS_FILE)) if text else []

    def write(self, keys: list[dict[str, Any]]) -> None:
        self.conn.put(json.dumps({"keys": keys}, indent=1, sort_keys=True) + "\n", self.path, mode=0o600)

    def spend(self) -> dict[str, int] | None:
        """Tokens spent per key sha256, read by the gateway's own python (the sqlite file is the container's,
        owned by root); None when the gateway does not run."""
        r = self.conn.run(
            ["docker", "exec", GATEWAY_CONTAINER, "python3", "-S", "-I", "/sparkdeploy/gateway_spend.py", SPEND_DB],
            check=False,
        )
        if not r.ok:
            return None
        data = parse_json(r.stdout or "{}", f"{self.conn.node.name}: {SPEND_DB}")
        if not isinstance(data, dict):
            return None
        return {
            str(k): v["tokens"]
            for k, v in data.items()
            if isinstance(v, dict) and isinstance(v.get("tokens"), int) and not isinstance(v["tokens"], bool)
        }


def _open(inventory: str | None) -> tuple[Inventory, Session]:
    inv = load_inventory(inventory)
    return inv, Session.open(inv)


def _public(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "sha256"}


def create(
    inventory: str | None,
    name: str,
    models: list[str] | None = None,
    rpm: int | None = None,
    max_budget: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """A new key: (its token, shown once; what keys.json records of it). Exit 2 for a bad name, rpm or budget
    (before connecting), a name in use or a model no deployment of the stack serves (nothing written)."""
    problems = [p for p in [names.problem("key", name, "keys create", "NAME")] if p]
    problems += [
        Problem("keys create", "--models", f"{escape_controls(repr(m))} is not a model name", "as /v1/models lists it")
        for m in models or []
        if not MODEL_NAME.fullmatch(m)
    ]
    if rpm is not None and rpm < 1:
        problems.append(Problem("keys create", "--rpm", f"{rpm} is not a rate", "a whole number >= 1"))
    if problems:
        raise ConfigError(problems)
    budget = parse_budget(max_budget) if max_budget is not None else None
    inv, session = _open(inventory)
    with inventory_lock(inv), session:
        gw = Gateway(inv, session.conn(inv.head), state_dir_of(inv, GATEWAY))
        keys = gw.keys()
        problems = check_new(name, list(models or []), gw.models(), keys)
        if problems:
            raise ConfigError(problems)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        entry = {
            "name": name,
            "sha256": hashlib.sha256(token.encode()).hexdigest(),
            "models": list(models or []),
            "rpm": rpm,
            "max_budget": budget,
            "budget_unit": "tokens" if budget else None,
            "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        gw.write([*keys, entry])
    return token, _public(entry)


def list_keys(inventory: str | None) -> list[dict[str, Any]]:
    """The keys, each with `spent` (tokens so far; None when the gateway does not run to ask)."""
    inv, session = _open(inventory)
    with session:
        gw = Gateway(inv, session.conn(inv.head), state_dir_of(inv, GATEWAY))
        keys = gw.keys()
        spend = gw.spend() if keys else {}
    return [{**_public(k), "spent": None if spend is None else spend.get(k["sha256"], 0)} for k in keys]


def revoke(inventory: str | None, name: str) -> dict[str, Any]:
    bad = names.problem("key", name, "keys revoke", "NAME")
    if bad:
        raise ConfigError(bad)
    inv, session = _open(inventory)
    with inventory_lock(inv), session:
        gw = Gateway(inv, session.conn(inv.head), state_dir_of(inv, GATEWAY))
        keys = gw.keys()
        gone = [k for k in keys if k.get("name") == name]
        if not gone:
            raise ConfigError(
                Problem(
                    "keys revoke", name, "no key of that name", f"keys: {', '.join(k['name'] for k in keys) or 'none'}"
                )
            )
        gw.write([k for k in keys if k.get("name") != name])
    return _public(gone[0])
