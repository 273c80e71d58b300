"""Per-user keys of a stack's gateway (`sparkdeploy keys create | list | revoke`).

LiteLLM's own virtual keys need its database client (prisma), whose CLI installs a Node runtime and npm
packages at its first run (litellm_proxy_extras/prisma_toolchain.py): nothing these machines can fetch hashed
from PyPI. So the keys are a file read by the gateway's auth hook (sparkdeploy/gateway_hook.py, LiteLLM's
documented `custom_auth`): `keys.json` in the gateway's state dir on the head node, mode 0600, holding per key
its name, the sha256 of its token, its models, rpm and max budget, never the token. The token (sk-sd-…) is
shown once, at create. The hook re-reads the file when it changes: a revoked key is refused from the next
request; the file is not `up`'s (never in its manifest), so keys survive a gateway restart, `up` and `down`.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sparkdeploy.apply import Session, inventory_lock
from sparkdeploy.deploy.stack import GATEWAY, state_dir_of
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.inventory import Inventory, load_inventory
from sparkdeploy.remote import NodeConnection

KEYS_FILE = "keys.json"
KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
TOKEN_PREFIX = "sk-sd-"


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

    def models(self) -> list[str]:
        """The models the gateway serves (its manifest, written by `up --stack`)."""
        text = self._cat("manifest.json")
        if text is None:
            raise StepFailed(
                f"no stack gateway on {self.conn.node.name} ({self.state_dir}): run `sparkdeploy up --stack FILE` first"
            )
        return [str(m) for m in json.loads(text).get("models") or []]

    def keys(self) -> list[dict[str, Any]]:
        text = self._cat(KEYS_FILE)
        return list(json.loads(text).get("keys") or []) if text else []

    def write(self, keys: list[dict[str, Any]]) -> None:
        self.conn.put(json.dumps({"keys": keys}, indent=1, sort_keys=True) + "\n", self.path, mode=0o600)


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
    max_budget: float | None = None,
) -> tuple[str, dict[str, Any]]:
    """A new key: (its token, shown once; what keys.json records of it). Exit 2 for a bad name, a name in use or
    a model no deployment of the stack serves."""
    if not KEY_NAME.match(name):
        raise ConfigError(Problem("keys create", name, "not a key name", "letters, digits, '_', '.', '@', '-'"))
    if rpm is not None and rpm < 1:
        raise ConfigError(Problem("keys create", "--rpm", f"{rpm} is not a rate", "a whole number >= 1"))
    if max_budget is not None and max_budget <= 0:
        raise ConfigError(Problem("keys create", "--max-budget", f"{max_budget:g} is not a budget", "a number > 0"))
    inv, session = _open(inventory)
    with inventory_lock(inv), session:
        gw = Gateway(inv, session.conn(inv.head), state_dir_of(inv, GATEWAY))
        served = gw.models()
        unknown = [m for m in models or [] if m not in served]
        keys = gw.keys()
        problems = [
            Problem("keys create", "--models", f"no deployment serves {m}", f"served: {', '.join(served)}")
            for m in unknown
        ]
        if any(k.get("name") == name for k in keys):
            problems.append(
                Problem("keys create", name, "a key of that name exists", "revoke it first, or pick a name")
            )
        if problems:
            raise ConfigError(problems)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        entry = {
            "name": name,
            "sha256": hashlib.sha256(token.encode()).hexdigest(),
            "models": list(models or []),
            "rpm": rpm,
            "max_budget": max_budget,
            "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        gw.write([*keys, entry])
    return token, _public(entry)


def list_keys(inventory: str | None) -> list[dict[str, Any]]:
    inv, session = _open(inventory)
    with session:
        return [_public(k) for k in Gateway(inv, session.conn(inv.head), state_dir_of(inv, GATEWAY)).keys()]


def revoke(inventory: str | None, name: str) -> dict[str, Any]:
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
