"""The stack gateway's auth hook: LiteLLM's documented `general_settings.custom_auth`, run by the LiteLLM proxy
inside the gateway container (copied into the gateway's state dir by deploy/stack.py; sparkdeploy never imports
it). Standard library, PyYAML and LiteLLM only (what the proxy image has).

On every authenticated request (every /v1 route, /v1/models included):
1. The model list: when the gateway's config (litellm-config.yaml in the mounted state dir) changed since this
   worker last read it, its `model_list` replaces the router's (`Router.set_model_list`, LiteLLM's hot-reload
   path). `up --stack` rewrites the file to add or remove a deployment: the proxy is not restarted, so requests
   to the other deployments never drop. LiteLLM 1.100.5 reloads its YAML only with a database
   (`store_model_in_db`); this is the no-database way.
2. The key: the master key (LITELLM_MASTER_KEY from the 0600 secrets.env) is the admin. Any other bearer must
   be in keys.json (written by `sparkdeploy keys`, mode 0600): sha256 of the token -> name, models, rpm. The file
   is re-read when it changes, so a revoked key is refused from the next request on. A key limited to some models
   is refused (403) for another; past its rpm (requests in the last 60 s, per proxy worker) it gets 429.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
import time
from collections import deque
from typing import Any

import yaml
from litellm.proxy import proxy_server
from litellm.proxy._types import LitellmUserRoles, ProxyException, UserAPIKeyAuth

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "litellm-config.yaml")
KEYS = os.path.join(HERE, "keys.json")
WINDOW_S = 60.0

_lock = threading.Lock()
_stamps: dict[str, tuple[int, int, int] | None] = {}
_keys: dict[str, dict[str, Any]] = {}
_recent: dict[str, deque[float]] = {}


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
    if not _changed(CONFIG):
        return
    with open(CONFIG, encoding="utf-8") as f:
        models = (yaml.safe_load(f) or {}).get("model_list") or []
    router = proxy_server.llm_router
    if router is not None:
        router.set_model_list(models)
    proxy_server.llm_model_list = models


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


def _refuse(message: str, code: int) -> ProxyException:
    kind = {401: "auth_error", 403: "permission_error", 429: "rate_limit_error"}.get(code, "auth_error")
    return ProxyException(message=message, type=kind, param="api_key", code=code)


async def user_api_key_auth(request: Any, api_key: str) -> UserAPIKeyAuth:
    with _lock:
        _reload_models()
        _reload_keys()
        keys = _keys
    token = api_key.removeprefix("Bearer ").strip()
    master = os.environ.get("LITELLM_MASTER_KEY", "")
    if master and hmac.compare_digest(token.encode(), master.encode()):
        return UserAPIKeyAuth(api_key=token, user_role=LitellmUserRoles.PROXY_ADMIN)
    entry = keys.get(hashlib.sha256(token.encode()).hexdigest())
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
    rpm = entry.get("rpm")
    if rpm:
        now = time.monotonic()
        with _lock:
            seen = _recent.setdefault(entry["sha256"], deque())
            while seen and seen[0] <= now - WINDOW_S:
                seen.popleft()
            if len(seen) >= rpm:
                raise _refuse(f"key {entry['name']} is over its limit of {rpm} requests per minute", 429)
            seen.append(now)
    return UserAPIKeyAuth(
        api_key=token, key_alias=entry["name"], models=models, user_role=LitellmUserRoles.INTERNAL_USER
    )
