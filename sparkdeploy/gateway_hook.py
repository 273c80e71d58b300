"""The stack gateway's auth hook: LiteLLM's documented `general_settings.custom_auth`, run by the LiteLLM proxy
inside the gateway container (copied into the gateway's state dir by deploy/stack_units.py; sparkdeploy never
imports it). Standard library, PyYAML and LiteLLM only (what the proxy image has), plus gateway_spend.py shipped
beside it.

On every authenticated request (every /v1 route, /v1/models included):
1. The model list: when the gateway's config (litellm-config.yaml in the mounted state dir) changed since this
   worker last read it, its `model_list` replaces the router's (`Router.set_model_list`, LiteLLM's hot-reload
   path). `up --stack` rewrites the file to add or remove a deployment: the proxy is not restarted, so requests
   to the other deployments never drop. LiteLLM 1.100.5 reloads its YAML only with a database
   (`store_model_in_db`); this is the no-database way.
2. The key: the master key (LITELLM_MASTER_KEY from the 0600 secrets.env) is the admin. Any other bearer must
   be in keys.json (written by `sparkdeploy keys`, mode 0600): sha256 of the token -> name, models, rpm, max
   budget. The file is re-read when it changes, so a revoked key is refused from the next request on (the files
   are looked at, at most every CHECK_S). A key limited to some models is refused (403) for another; past its rpm
   (requests in the last 60 s, counted in gateway_spend's sqlite file, so over every proxy
   worker) it gets 429; once it has spent its max budget (tokens, prompt +
   completion, counted by `spend_tracker` below into gateway_spend's sqlite file, shared by every worker and
   kept over a restart) it gets 429 "budget exceeded".

3. The engines a restart takes away (issue 43): each engine's `model_info` names its group and its rank 0's watcher
   (sparkdeploy/nodeside/guard/watch.py); a thread of each proxy worker asks those watchers once a second and
   the next request's hook leaves out of the router's list every engine whose watcher says it does not serve
   (restarting, failing, waiting to restart, given up, held), as long as another engine of the same model
   stays; it is back in the list once its watcher says `ok`. A watcher that does not answer changes nothing
   (LiteLLM's own retries and cooldowns remain).

`spend_tracker` is a LiteLLM callback (`litellm_settings.callbacks: [gateway_hook.spend_tracker]`): after each
successful answer to a key of keys.json it adds the answer's usage.total_tokens to that key's count.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import sys
import threading
import time
import urllib.request
from typing import Any

import yaml
from litellm.integrations.custom_logger import CustomLogger
from litellm.proxy import proxy_server
from litellm.proxy._types import LitellmUserRoles, ProxyException, UserAPIKeyAuth

HERE = os.path.dirname(os.path.abspath(__file__))
# LiteLLM loads this file by path (not as a package): its sibling is found through sys.path.
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import gateway_spend  # type: ignore[import-not-found]  # noqa: E402 - a sibling file in the container, found through the path above

CONFIG = os.path.join(HERE, "litellm-config.yaml")
KEYS = os.path.join(HERE, "keys.json")
CHECK_S = 0.2  # how often the files are stat'ed: a revoked key is refused within this (the goal: 1 s)

# uvicorn's access log writes one line per request from the event loop (about 3 % of the proxy's CPU under
# load, measured with py-spy): errors still reach the container log, LiteLLM's own logger is untouched.
logging.getLogger("uvicorn.access").setLevel(logging.WARNING)

WATCH_S = 1.0  # how often each engine's watcher is asked
NOT_SERVING = ("restarting", "failing", "backoff", "gave-up", "held")

_lock = threading.Lock()
_stamps: dict[str, tuple[int, int, int] | None] = {}
_models: list[dict[str, Any]] = []  # the config file's model_list
_withdrawn: frozenset[str] = frozenset()  # model_info ids whose watcher says they do not serve
_applied: frozenset[str] | None = None  # what the router's list leaves out now (None: not set by us yet)
_poller: threading.Thread | None = None
_checked = 0.0
_keys: dict[str, dict[str, Any]] = {}
_auth: dict[str, UserAPIKeyAuth] = {}  # sha256 -> the answer for that key, built once per keys.json version


def _stamp(path: str) -> tuple[int, int, int] | None:
    """(inode, size, mtime ns): sparkdeploy writes by rename, so any new content is a new stamp."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _changed(path: str) -> bool:
    stamp = _stamp(path)
    if _stamps.get(path, ()) == stamp:
        return False
    _stamps[path] = stamp
    return True


def _reload_models() -> None:
    global _models, _applied
    if _changed(CONFIG):
        with open(CONFIG, encoding="utf-8") as f:
            _models = (yaml.safe_load(f) or {}).get("model_list") or []
        _applied = None
    if _applied == _withdrawn:
        return
    routable = _routable(_models, _withdrawn)
    router = proxy_server.llm_router
    if router is not None:
        router.set_model_list(routable)
    proxy_server.llm_model_list = routable
    _applied = _withdrawn


def _routable(models: list[dict[str, Any]], withdrawn: frozenset[str]) -> list[dict[str, Any]]:
    """The model list without the withdrawn engines, except the last engine of a model (it stays listed: LiteLLM's
    retries and cooldowns then answer for it)."""
    out = []
    for m in models:
        mid = (m.get("model_info") or {}).get("id")
        others = [
            x
            for x in models
            if x.get("model_name") == m.get("model_name") and (x.get("model_info") or {}).get("id") not in withdrawn
        ]
        if mid not in withdrawn or not others:
            out.append(m)
    return out


def _watch_states() -> frozenset[str]:
    """The ids of the engines whose watcher says they do not serve (a watcher that does not answer: none)."""
    down = set()
    for m in list(_models):
        info = m.get("model_info") or {}
        url, group = info.get("watch"), info.get("group")
        if not url or not group:
            continue
        try:
            with urllib.request.urlopen(url, timeout=0.5) as resp:
                state = ((json.loads(resp.read(1 << 20)).get("groups") or {}).get(group) or {}).get("state")
        except (OSError, ValueError):
            continue
        if state in NOT_SERVING:
            down.add(str(info.get("id")))
    return frozenset(down)


def _poll() -> None:
    global _withdrawn
    while True:
        found = _watch_states()
        if found != _withdrawn:
            logging.getLogger("gateway_hook").warning("engines not serving (their watcher says): %s", sorted(found))
            _withdrawn = found
        time.sleep(WATCH_S)


def _start_poller() -> None:
    global _poller
    if _poller is None:
        _poller = threading.Thread(target=_poll, name="gateway-watch", daemon=True)
        _poller.start()


def _reload_keys() -> None:
    global _keys
    if not _changed(KEYS):
        return
    try:
        with open(KEYS, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {}
    _keys = {entry["sha256"]: entry for entry in data.get("keys", [])}
    _auth.clear()


def _refresh() -> dict[str, dict[str, Any]]:
    """The keys, the files looked at again when CHECK_S has passed (a stat of two files per request was ~1.5 %
    of the proxy's CPU)."""
    global _checked
    with _lock:
        now = time.monotonic()
        if now - _checked >= CHECK_S:
            _checked = now
            _reload_models()
            _reload_keys()
            _start_poller()
        return _keys


def _refuse(message: str, code: int) -> ProxyException:
    kind = {401: "auth_error", 403: "permission_error", 429: "rate_limit_error"}.get(code, "auth_error")
    return ProxyException(message=message, type=kind, param="api_key", code=code)


def _answer(cache_key: str, build: Any) -> UserAPIKeyAuth:
    """A fresh copy of the key's UserAPIKeyAuth. Building one runs pydantic's validation, which deep-copies every
    default of its ~60 fields (5 % of the proxy's CPU per request, py-spy): it is built once per key and copied
    (shallow, its list and dict fields copied too, so no request sees another's changes)."""
    made = _auth.get(cache_key)
    if made is None:
        made = _auth[cache_key] = build()
    fresh = {k: v.copy() for k, v in made.__dict__.items() if isinstance(v, (list, dict, set))}
    return made.model_copy(update=fresh)


async def user_api_key_auth(request: Any, api_key: str) -> UserAPIKeyAuth:
    keys = _refresh()
    token = api_key.removeprefix("Bearer ").strip()
    master = os.environ.get("LITELLM_MASTER_KEY", "")
    if master and hmac.compare_digest(token.encode(), master.encode()):
        return _answer("master", lambda: UserAPIKeyAuth(api_key=token, user_role=LitellmUserRoles.PROXY_ADMIN))
    digest = hashlib.sha256(token.encode()).hexdigest()
    entry = keys.get(digest)
    if entry is None:
        raise _refuse("unknown or revoked key", 401)
    models = list(entry.get("models") or [])
    if models and request.method == "POST":
        try:
            body = await request.json()
        except ValueError:
            body = {}
        wanted = body.get("model") if isinstance(body, dict) else None
        if wanted is not None and wanted not in models:
            raise _refuse(f"key {entry['name']} may not use model {wanted} (allowed: {', '.join(models)})", 403)
    # keys made before budgets were enforced recorded a number without a unit: not taken for tokens
    budget = entry.get("max_budget") if entry.get("budget_unit") == "tokens" else None
    if budget:
        used = gateway_spend.spent(digest)
        if used >= budget:
            raise _refuse(
                f"key {entry['name']}: budget exceeded ({used} of its {int(budget)} tokens spent); "
                "ask for a new key or a larger budget",
                429,
            )
    rpm = entry.get("rpm")
    # a write that may wait for another worker's: off the event loop
    if rpm and await asyncio.to_thread(gateway_spend.take, digest, int(rpm)) is not None:
        raise _refuse(f"key {entry['name']} is over its limit of {rpm} requests per minute", 429)
    return _answer(
        digest,
        lambda: UserAPIKeyAuth(
            api_key=token, key_alias=entry["name"], models=models, user_role=LitellmUserRoles.INTERNAL_USER
        ),
    )


class SpendTracker(CustomLogger):
    """Counts each successful answer's tokens against its key (keys of keys.json only, not the master key)."""

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        payload = kwargs.get("standard_logging_object") or {}
        digest = (payload.get("metadata") or {}).get("user_api_key_hash")
        if not digest or digest not in _refresh():
            return
        tokens = payload.get("total_tokens")
        if tokens is None:
            usage = getattr(response_obj, "usage", None)
            tokens = getattr(usage, "total_tokens", 0) if usage is not None else 0
        # a write may wait for another worker's: never on the event loop
        await asyncio.to_thread(gateway_spend.add, digest, int(tokens or 0))


spend_tracker = SpendTracker()
