"""The stack gateway's auth hook: LiteLLM's documented `general_settings.custom_auth`, run by the LiteLLM proxy
inside the gateway container (copied into the gateway's state dir by deploy/stack/units.py; sparkdeploy never
imports it). Standard library and LiteLLM only (what the proxy image has), plus gateway_spend.py shipped beside
it. It never reaches LiteLLM's database code (prisma is not installed: any other exception out of this hook would
make LiteLLM try it, and answer 500).

Before LiteLLM sees a request (`ClientErrors`, an ASGI wrapper around the proxy's app, installed when LiteLLM
loads this file): a POST to an inference route (chat/completions, completions, embeddings, responses, messages)
whose body is not a JSON object naming a model is answered 400 with one sentence (LiteLLM would answer a JSON
list with a 500).

On every authenticated request (every /v1 route, /v1/models included):
1. The routes: when routes.json (in the mounted state dir, deploy/stack/routes.py) changed since this worker
   last read it, its `model_list` replaces the router's (`Router.set_model_list`, LiteLLM's hot-reload path).
   `up --stack` and `down` rewrite the file to add, remove or take out a deployment: the proxy is not
   restarted, so requests to the other deployments never drop. LiteLLM 1.100.5 reloads its YAML only with a
   database (`store_model_in_db`); this is the no-database way.
2. The key: the `Authorization: Bearer KEY` header (401 when there is none, or it is not of that form). The
   master key (LITELLM_MASTER_KEY from the 0600 secrets.env) is the admin. Any other bearer must be in keys.json
   (written by `sparkdeploy keys`, mode 0600): sha256 of the token -> name, models, rpm, max budget. The file is
   re-read when it changes, so a revoked key is refused from the next request on (the files are looked at, at
   most every CHECK_S).
3. The model asked: one the gateway does not route is 404 (no deployment of the stack serves it) or 503 (its
   deployment is out of the routes, with why). A key limited to some models is refused (403) for another; past
   its rpm (requests in the last 60 s, counted in gateway_spend's sqlite file, so over every proxy worker) it
   gets 429; once it has spent its max budget (tokens, prompt + completion, counted by `spend_tracker` below
   into gateway_spend's sqlite file, shared by every worker and kept over a restart) it gets 429 "budget
   exceeded".
4. The engines a restart takes away (issue 43): each engine's `model_info` names its group and its rank 0's watcher
   (sparkdeploy/nodeside/guard/watch.py); a thread of each proxy worker asks those watchers once a second (an
   on-demand model's every HELD_WATCH_S while this worker holds a request for it, asking it to look) and
   the next request's hook leaves out of the router's list every engine whose watcher says it does not serve
   (restarting, failing, waiting to restart, given up, held), as long as another engine of the same model
   stays; it is back in the list once its watcher says `ok`. A watcher that does not answer changes nothing
   (LiteLLM's own retries and cooldowns remain).

Every refusal is a client's matter: logged once, at WARNING, as one line (`gateway refused POST /v1/... from IP:
HTTP 401 ...`), never with a traceback (`_Refusals` rewrites LiteLLM's ERROR record of a `Refusal`).


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
import signal
import sqlite3
import sys
import threading
import time
import urllib.request
from typing import Any, cast

from litellm._logging import verbose_proxy_logger
from litellm.integrations.custom_logger import CustomLogger
from litellm.proxy import proxy_server
from litellm.proxy._types import LitellmUserRoles, ProxyException, UserAPIKeyAuth

HERE = os.path.dirname(os.path.abspath(__file__))
# LiteLLM loads this file by path (not as a package): its sibling is found through sys.path.
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import gateway_spend  # type: ignore[import-not-found]  # noqa: E402 - a sibling file in the container, found through the path above

ROUTES = os.path.join(HERE, "routes.json")
KEYS = os.path.join(HERE, "keys.json")
CHECK_S = 0.2  # how often the files are stat'ed: a revoked key is refused within this (the goal: 1 s)
INFERENCE = ("/chat/completions", "/completions", "/embeddings", "/responses", "/messages")  # a body names a model
FORMS = (b"application/x-www-form-urlencoded", b"multipart/form-data")  # curl -d's default, for one
FORM = "the request body is a form: send JSON (Content-Type: application/json) with model and messages"
BODY = "sparkdeploy.body"  # the ASGI scope's key for the request's parsed body (ClientErrors puts it there)
ADMITTED = "sparkdeploy.admitted"  # the scope's key for a request for an on-demand model: counted in flight yet?
HUNG_UP = "sparkdeploy.hung_up"  # the scope's key for ClientErrors' wait for the client's hang-up (the hold's)

# uvicorn's access log writes one line per request from the event loop (about 3 % of the proxy's CPU under
# load, measured with py-spy): errors still reach the container log, LiteLLM's own logger is untouched.
logging.getLogger("uvicorn.access").setLevel(logging.WARNING)

WATCH_S = 1.0  # how often each engine's watcher is asked
# while a request is held for an on-demand model (issue 40): its watchers asked this often, with `?look=1` (its
# rank 0's watcher looks at once, reads the demand and starts it: watch.py), and the held request looks this often
HELD_WATCH_S, HELD_STEP_S = 0.1, 0.05
# On-demand members (issue 40, docs/stack.md): a request for one that is not serving is held for its start as long
# as routes.json's on_demand entry says (`hold`: the stack's gateway.hold or the member's start_timeout), else this
HOLD_S = float(os.environ.get("SPARKDEPLOY_HOLD_S") or 300)
RETRY_S = 30  # the Retry-After of the 503 past the hold
REPLAYS = 3  # an on-demand model's request held again at most this often when its engines leave under it
DEMAND_PATH = "/sparkdeploy/demand"  # GET, read-only: what the nodes' activators poll
NOT_SERVING = ("restarting", "failing", "backoff", "gave-up", "held")

_lock = threading.Lock()
_stamps: dict[str, tuple[int, int, int] | None] = {}
_models: list[dict[str, Any]] = []  # routes.json's model_list
_withdrawn: frozenset[str] = frozenset()  # model_info ids whose watcher says they do not serve
_applied: tuple[frozenset[str], frozenset[str]] | None = None  # (withdrawn, warm) the router's list is made of
_poller: threading.Thread | None = None
_checked = 0.0
_keys: dict[str, dict[str, Any]] = {}
_auth: dict[str, UserAPIKeyAuth] = {}  # sha256 -> the answer for that key, built once per keys.json version
_served: set[str] = set()  # the models routed now (routes.json's model_list)
_unavailable: dict[str, str] = {}  # a model of the stack routed nowhere now -> why
_left: set[str] = set()  # models routed before and not now (this worker's last reloads)
_on_demand: dict[str, dict[str, Any]] = {}  # on-demand model -> routes.json's on_demand entry (deployment added)
_warm: frozenset[str] = frozenset()  # the on-demand models every engine of which its watcher says serve (`ok`)
_why_cold: dict[str, str] = {}  # an on-demand model not warm -> what its watcher says
_groups: dict[str, dict[str, Any]] = {}  # routes.json's groups: each member's model, shares, room (eviction)
_decided: set[tuple[str, object]] = set()  # (group, at) of the on-demand decisions this worker has seen
NO_ROOM = "no-room"  # a watcher's state for an on-demand start nothing can make room for (activate.py)
_held: dict[str, int] = {}  # on-demand model -> this worker's requests held for it now
_hurry = threading.Event()  # set by a request being held: the poller asks at once, not at its next second
_in_flight = gateway_spend.InFlight()  # an on-demand model's requests in flight, written by its own thread


# -- refusals: one line at WARNING, no traceback -----------------------------------------------------------

_TYPES = {
    400: "invalid_request_error",
    401: "auth_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    499: "client_closed_request",  # (nginx's code: nobody reads it, the gateway's log line does)
    503: "service_unavailable",
}


class Refusal(ProxyException):  # type: ignore[misc]  # LiteLLM ships no types: its class is Any to mypy
    """A request refused by this hook: LiteLLM answers it with the code and message; its log record is made one
    WARNING line by _Refusals."""

    def __init__(self, message: str, code: int, request: Any = None):
        param = "model" if code in (404, 503) else "api_key"
        super().__init__(message=message, type=_TYPES.get(code, "auth_error"), param=param, code=code)
        self.where = f"{request.method} {request.url.path}" if request is not None else "a request"


def _say(where: str, client: Any, code: Any, message: str) -> tuple[str, tuple[Any, ...]]:
    return "gateway refused %s from %s: HTTP %s %s", (where, client, code, message)


class _Refusals(logging.Filter):
    """LiteLLM logs an auth failure at ERROR (a 5xx with its traceback): a Refusal is the client's matter, so its
    record becomes one WARNING line (LiteLLM's record carries the exception and the client's address). So does
    its record of a request whose model left the routes while it was in flight (ClientErrors answers it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        refusal = next((a for a in args if isinstance(a, Refusal)), None)
        if refusal is not None:
            client = args[1] if len(args) > 1 and isinstance(args[1], str) else "?"
            _quiet(record, *_say(refusal.where, client, refusal.code, refusal.message))
        elif record.levelno >= logging.ERROR and _left:
            text = record.getMessage()
            gone = next((m for m in sorted(_left) if f"model={m}" in text or f"Model Group={m}" in text), None)
            if gone is not None and ("Invalid model name" in text or "no healthy deployments" in text):
                why = "a request for %s was in flight when it left the routes: answered 503 or 404, not 400"
                _quiet(record, "gateway: " + why, (gone,))
        return True


def _quiet(record: logging.LogRecord, msg: str, args: tuple[Any, ...]) -> None:
    record.msg, record.args = msg, args
    record.levelno, record.levelname = logging.WARNING, "WARNING"
    record.exc_info, record.exc_text, record.stack_info = None, None, None


if not any(isinstance(f, _Refusals) for f in verbose_proxy_logger.filters):
    verbose_proxy_logger.addFilter(_Refusals())


# -- a body LiteLLM cannot use: 400 before it sees it ------------------------------------------------------


def _kind(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _body_problem(raw: bytes, scope: dict[str, Any]) -> tuple[Any, str]:
    """(the parsed body, "") or (None, what is wrong with it, in one sentence)."""
    ctype = dict(scope.get("headers") or []).get(b"content-type", b"").split(b";")[0].strip().lower()
    if ctype in FORMS:
        return None, FORM
    if not raw.strip():
        return None, "the request has no body: send a JSON object with model and messages"
    try:
        body = json.loads(raw)
    except ValueError as exc:  # not JSON, or not UTF-8
        return None, f"the request body is not JSON ({exc})"
    if not isinstance(body, dict):
        return None, f"the request body is a JSON {_kind(body)}, not an object with model and messages"
    model = body.get("model")
    if model is None:
        return None, 'the request names no model: add "model" (GET /v1/models lists them)'
    if not isinstance(model, str):
        return None, f"model is a JSON {_kind(model)}, not a model name (GET /v1/models lists them)"
    return body, ""


def _inference(path: str) -> bool:
    return path.rstrip("/").endswith(INFERENCE)


async def _whole_body(receive: Any) -> bytes | None:
    """The request's body, read whole; None when the client hangs up first."""
    chunks, more = [], True
    while more:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        more = bool(message.get("more_body"))
    return b"".join(chunks)


class ClientErrors:
    """ASGI: a POST to an inference route whose body is not a JSON object naming a model (a form, not JSON, a
    JSON list, no model) gets 400 here, logged as one WARNING line; any other request, and a good body (kept in
    the scope for the hook), go on unchanged."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and scope.get("method") == "GET" and scope.get("path") == DEMAND_PATH:
            await _answer_demand(send)
            return
        if scope.get("type") != "http" or scope.get("method") != "POST" or not _inference(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        raw = await _whole_body(receive)
        if raw is None:
            return
        body, problem = _body_problem(raw, scope)
        if problem:
            await _answer_error(scope, send, 400, problem)
            return
        scope[BODY] = body
        model = str(body["model"]) if isinstance(body, dict) else ""  # _body_problem: an object naming a model
        sent = False

        later: list[dict[str, Any]] = []  # what hung_up read from the server, for the app's next receive

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            if later:
                return later.pop(0)
            return cast("dict[str, Any]", await receive())  # an ASGI message

        async def hung_up() -> bool:
            """For a hold (cancelled at its end): whether the client's next message is its hang-up (the app's too)."""
            message = cast("dict[str, Any]", await receive())
            later.append(message)
            return message.get("type") == "http.disconnect"

        scope[HUNG_UP] = hung_up

        held = again = False
        replays = 0  # times it was held again (below)

        async def answer(message: dict[str, Any]) -> None:
            """A request admitted while its model was routed, whose model left the routes before LiteLLM's
            router picked an engine (another request of this worker reloaded routes.json meanwhile): LiteLLM's
            400 ("Invalid model name", "no healthy deployments") becomes what a new request gets, 503 or 404;
            for an on-demand model (its engine crashed, or was stopped), nothing: the request is held again."""
            nonlocal held, again
            if message["type"] == "http.response.start" and message.get("status") == 400:
                held = model not in _served and model not in _warm
                again = held and model in _on_demand and replays < REPLAYS and not _stopping()
            if message["type"] == "http.response.start" and message.get("status") == 503 and model in _on_demand:
                message = dict(message, headers=[*message.get("headers", []), (b"retry-after", str(RETRY_S).encode())])
            if again:
                return  # nothing sent yet: run again below, held by the hook until the model serves
            if not held:
                await send(message)
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                await _answer_gone(scope, send, model, replays)

        # an on-demand model's request is in flight (not stopped as idle) from when the hook admits it (key, model,
        # budget and rpm checked: `_admit`), not before: a refused one counts nothing and starts nothing
        admitted = {"model": model, "counted": False}
        if model in _on_demand:
            scope[ADMITTED] = admitted
        first = dict(scope)  # each run gets the scope as it came: the app writes its own keys into it
        try:
            while True:
                await self.app(scope, replay, answer)
                if not again:
                    return
                # its engines left the routes between its hold and LiteLLM's pick (a crash the watcher saw in
                # that window): the client is never told so, it waits for the restart like a request held
                verbose_proxy_logger.warning(
                    "gateway: a request for %s was in flight when its engines stopped serving: held again", model
                )
                replays, held, again, sent = replays + 1, False, False, False
                scope = dict(first)
        finally:
            if admitted["counted"]:
                _in_flight.end(model)  # written beside the request by this worker's writer, not awaited


async def _answer_demand(send: Any) -> None:
    """GET /sparkdeploy/demand: each on-demand engine group's demand, by its watcher's group name (the activator
    of its rank 0's node reads it, docs/stack.md). Read-only; no key: model names and counts, nothing else."""
    _refresh()  # this worker may not have read routes.json yet (no request reached it)
    counts = await asyncio.to_thread(gateway_spend.demand)
    groups = {}
    for model, od in list(_on_demand.items()):
        for entry in od.get("model_list") or []:
            gid = (entry.get("model_info") or {}).get("group")
            if gid:
                seen = counts.get(model) or {}
                groups[gid] = {
                    "model": model,
                    "deployment": od.get("deployment"),
                    "idle_timeout": od.get("idle_timeout"),
                    "waiting": seen.get("waiting", 0),
                    "in_flight": seen.get("in_flight", 0),
                    "last_request": seen.get("last_request"),
                    # its rank 0's watcher: where another node's activator reads this group's evictions (activate.py)
                    "watch": (entry.get("model_info") or {}).get("watch"),
                }
    members = {
        name: {
            "model": g.get("model"),
            "on_demand": g.get("idle_timeout") is not None,
            "shares": g.get("shares") or {},
            "room": g.get("room") or {},
            **{k: (counts.get(str(g.get("model"))) or {}).get(k, 0) for k in ("waiting", "in_flight")},
            "last_request": (counts.get(str(g.get("model"))) or {}).get("last_request"),
        }
        for name, g in list(_groups.items())
    }
    data = json.dumps({"groups": groups, "members": members, "now": time.time()}, sort_keys=True).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _answer_error(scope: dict[str, Any], send: Any, code: int, message: str, retry: bool = False) -> None:
    """The answer to a refused request, in OpenAI's error shape (with Retry-After when `retry`), and its one
    WARNING line."""
    client = (scope.get("client") or ("?",))[0]
    msg, args = _say(f"{scope.get('method')} {scope.get('path')}", client, code, message)
    verbose_proxy_logger.warning(msg, *args)
    param = "body" if code == 400 else "model"
    error = {"message": message, "type": _TYPES.get(code, "invalid_request_error"), "param": param, "code": str(code)}
    data = json.dumps({"error": error}, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if retry:
        headers.append((b"retry-after", str(RETRY_S).encode()))
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _answer_gone(scope: dict[str, Any], send: Any, model: str, replays: int) -> None:
    """The answer to a request whose model left the routes under it, not run again: an on-demand model's is 503
    with Retry-After and its watcher's word (held again as often as it may be, or the gateway restarts); any
    other's what a new request gets (503 while its deployment is out, else 404)."""
    if model in _on_demand:
        await _answer_error(scope, send, 503, _left_under(model, replays), retry=True)
    else:
        await _answer_error(scope, send, *_not_routed(model, []))


def _left_under(model: str, replays: int) -> str:
    """Why an on-demand model's request, held again each time its engines left under it, is refused now: its
    watcher's word (restarting, failing, stopped), not the routes' "cold" written at `up`."""
    why = _why_cold.get(model) or "not serving"
    if _stopping():
        return (
            f"model {model} stopped serving under this request ({why}) and the gateway is restarting: "
            f"retry in {RETRY_S} s"
        )
    return (
        f"model {model} stopped serving {replays + 1} times under this request (on demand; now: {why}): "
        f"retry in {RETRY_S} s"
    )


def _not_routed(model: str, allowed: list[str]) -> tuple[int, str]:
    """A model the gateway does not route now: 503 while its deployment is out (why), else 404."""
    if model in _unavailable:
        return 503, f"model {model} is not available now: {_unavailable[model]}"
    served = sorted(m for m in _served if not allowed or m in allowed)
    return 404, f"model {model} is not served by this gateway (served: {', '.join(served) or 'none'})"


def _install(app: Any) -> None:
    """ClientErrors around the proxy's app. LiteLLM loads this file while the app starts, when Starlette has
    built its middleware stack already (add_middleware is refused then): the built stack is wrapped."""
    if getattr(app, "sparkdeploy_client_errors", False):
        return
    if app.middleware_stack is None:
        app.add_middleware(ClientErrors)
    else:
        app.middleware_stack = ClientErrors(app.middleware_stack)
    app.sparkdeploy_client_errors = True


_install(proxy_server.app)


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
    global _models, _applied, _served, _unavailable, _on_demand
    if _changed(ROUTES):
        try:
            with open(ROUTES, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            data = {}
        _on_demand = {str(od["model"]): dict(od, deployment=name) for name, od in (data.get("on_demand") or {}).items()}
        _groups.clear()
        _groups.update(data.get("groups") or {})
        _models = [m for m in data.get("model_list") or [] if m.get("model_name") not in _on_demand]
        served = {m["model_name"] for m in _models} | (set(_on_demand) & _warm)
        _left.difference_update(served)
        _left.update(_served - served)
        _served, _unavailable = served, dict(data.get("unavailable") or {})
        _applied = None
    if _applied == (_withdrawn, _warm):
        return
    # an on-demand model is routed while its watchers say it serves (they start and stop it), not as routes.json
    # was written at `up`
    warm = [e for model in sorted(_warm) for e in (_on_demand.get(model) or {}).get("model_list") or []]
    routable = _routable(_models, _withdrawn) + warm
    _served = {m["model_name"] for m in _models} | (set(_on_demand) & _warm)
    router = proxy_server.llm_router
    if router is not None:
        router.set_model_list(routable)
    proxy_server.llm_model_list = routable
    _applied = (_withdrawn, _warm)


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


def _watch_state(url: str, group: str, look: bool = False) -> str | None:
    """What `group`'s watcher says of it (`state` or `state: reason`), None when it does not answer. look: a
    request is held for it: the watcher is asked to look now (at most every few tenths of a second: watch.py)."""
    if look:
        url += ("&" if "?" in url else "?") + "look=1"
    try:
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            g = ((json.loads(resp.read(1 << 20)).get("groups") or {}).get(group)) or {}
    except (OSError, ValueError):
        return None
    _log_decision(group, g.get("activation"))
    state = g.get("state")
    return f"{state}: {g.get('reason')}" if g.get("reason") and state != "ok" else state


def _log_decision(group: str, record: object) -> None:
    """An on-demand decision the watcher publishes (its activator's start, stop, eviction or refusal, with its
    figures): one line in the gateway's log, once over every worker (gateway_spend's decisions table). At
    WARNING, as the poller's other lines: the level the proxy's log shows. Read from the watcher's /watch, which
    this poller asks anyway: nothing here takes a command from the network."""
    key = (group, record.get("at") if isinstance(record, dict) else None)
    if key[1] is None or key in _decided:
        return
    try:
        line = gateway_spend.decision_line(group, record)
    except sqlite3.Error:  # the file busy past its timeout: tried again at the next look
        return
    if len(_decided) > 1000:
        _decided.clear()
    _decided.add(key)
    if line is not None:
        logging.getLogger("gateway_hook").warning("%s", line)


def _warm_models() -> tuple[frozenset[str], dict[str, str]]:
    """The on-demand models every engine of which its watcher says serve, and what it says of the others. A warm
    model stays warm while a watcher of it does not answer (a busy node): only a state that is not `ok` cools it."""
    warm, why = set(), {}
    for model, od in list(_on_demand.items()):
        states = [
            _watch_state(str(info.get("watch")), str(info.get("group")), model in _held)
            for info in ((e.get("model_info") or {}) for e in od.get("model_list") or [])
            if info.get("watch") and info.get("group")
        ]
        if states and all(s == "ok" for s in states):
            warm.add(model)
        elif model in _warm and states and all(s in ("ok", None) for s in states):
            warm.add(model)  # a watcher that does not answer (busy, past 0.5 s) changes nothing, as for withdrawal
        else:
            why[model] = "; ".join(s or "its watcher does not answer" for s in states if s != "ok") or "no watcher"
    return frozenset(warm), why


def _poll() -> None:
    global _withdrawn, _warm, _why_cold
    log = logging.getLogger("gateway_hook")
    asked = 0.0  # when every engine's watcher was asked last
    while True:
        if time.monotonic() - asked >= WATCH_S:  # once a second; the passes between: the on-demand models only
            asked = time.monotonic()
            found = _watch_states()
            if found != _withdrawn:
                log.warning("engines not serving (their watcher says): %s", sorted(found))
                _withdrawn = found
        warm, _why_cold = _warm_models()
        if warm != _warm:
            log.warning("on-demand models serving now (their watchers say): %s", sorted(warm) or "none")
            _warm = warm
        _pause()


def _pause() -> None:
    """Until the poller's next pass: WATCH_S, HELD_WATCH_S while a request of this worker is held, and no wait
    for the first pass after a request was held (_hurry). Idle, one pass a second as before."""
    _hurry.wait(HELD_WATCH_S if _held else WATCH_S)
    _hurry.clear()


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


def _answer(cache_key: str, build: Any) -> UserAPIKeyAuth:
    """A fresh copy of the key's UserAPIKeyAuth. Building one runs pydantic's validation, which deep-copies every
    default of its ~60 fields (5 % of the proxy's CPU per request, py-spy): it is built once per key and copied
    (shallow, its list and dict fields copied too, so no request sees another's changes)."""
    made = _auth.get(cache_key)
    if made is None:
        made = _auth[cache_key] = build()
    fresh = {k: v.copy() for k, v in made.__dict__.items() if isinstance(v, (list, dict, set))}
    return made.model_copy(update=fresh)


def _token(request: Any, api_key: str | None) -> str:
    """The bearer token of the request, or a Refusal (401) saying what is wrong with the header."""
    header: str | None = request.headers.get("authorization")
    if header is not None:
        scheme, _, rest = header.strip().partition(" ")
        if scheme.lower() != "bearer":  # never echoed: what stands there may be the key itself
            raise Refusal("the Authorization header is not `Bearer KEY`", 401, request)
        if not rest.strip():
            raise Refusal("the Authorization header has no key after `Bearer`", 401, request)
        return rest.strip()
    token = (api_key or "").removeprefix("Bearer ").strip()  # another header LiteLLM takes a key from
    if not token:
        raise Refusal("no API key: send the header `Authorization: Bearer KEY`", 401, request)
    return token


def _model(request: Any) -> str | None:
    """The model a POST to an inference route asks for (ClientErrors checked and parsed its body)."""
    if request.method != "POST" or not _inference(request.url.path):
        return None
    body = request.scope.get(BODY)  # ClientErrors, in front of every request once this file is loaded
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


def _check_model(request: Any, model: str | None, allowed: list[str], name: str | None) -> None:
    if model is None:
        return
    if model not in _served and model not in _on_demand:
        code, text = _not_routed(model, allowed)
        raise Refusal(text, code, request)
    if allowed and model not in allowed:
        raise Refusal(f"key {name} may not use model {model} (allowed: {', '.join(allowed)})", 403, request)


async def user_api_key_auth(request: Any, api_key: str | None) -> UserAPIKeyAuth:
    try:
        return await _authorize(request, api_key)
    except ProxyException:  # a Refusal, or LiteLLM's own
        raise
    except Exception as exc:  # a bug here: a 500 that says so (LiteLLM would try its database with any other)
        raise ProxyException(
            message=f"the gateway's auth hook failed: {exc.__class__.__name__}: {exc}",
            type="internal_server_error",
            param=None,
            code=500,
        ) from exc


async def _authorize(request: Any, api_key: str | None) -> UserAPIKeyAuth:
    keys = _refresh()
    token = _token(request, api_key)
    master = os.environ.get("LITELLM_MASTER_KEY", "")
    if master and hmac.compare_digest(token.encode(), master.encode()):
        _check_model(request, _model(request), [], None)
        await _admit(request, _model(request))
        return _answer("master", lambda: UserAPIKeyAuth(api_key=token, user_role=LitellmUserRoles.PROXY_ADMIN))
    digest = hashlib.sha256(token.encode()).hexdigest()
    entry = keys.get(digest)
    if entry is None:
        raise Refusal("unknown or revoked key", 401, request)
    models = list(entry.get("models") or [])
    _check_model(request, _model(request), models, entry["name"])
    # keys made before budgets were enforced recorded a number without a unit: not taken for tokens
    budget = entry.get("max_budget") if entry.get("budget_unit") == "tokens" else None
    if budget:
        used = gateway_spend.spent(digest)
        if used >= budget:
            raise Refusal(
                f"key {entry['name']}: budget exceeded ({used} of its {int(budget)} tokens spent); "
                "ask for a new key or a larger budget",
                429,
                request,
            )
    rpm = entry.get("rpm")
    # a write that may wait for another worker's: off the event loop; a request held again (ClientErrors) was
    # counted in the key's minute when it was admitted
    again = isinstance(request.scope.get(ADMITTED), dict) and request.scope[ADMITTED]["counted"]
    if rpm and not again and await asyncio.to_thread(gateway_spend.take, digest, int(rpm)) is not None:
        raise Refusal(f"key {entry['name']} is over its limit of {rpm} requests per minute", 429, request)
    await _admit(request, _model(request))
    return _answer(
        digest,
        lambda: UserAPIKeyAuth(
            api_key=token, key_alias=entry["name"], models=models, user_role=LitellmUserRoles.INTERNAL_USER
        ),
    )


async def _admit(request: Any, model: str | None) -> None:
    """A request the hook let through: one for an on-demand model is counted in flight from now (ClientErrors
    counts its end) and held while the model does not serve."""
    admitted = request.scope.get(ADMITTED)
    if model is not None and model in _on_demand and isinstance(admitted, dict) and not admitted["counted"]:
        _in_flight.begin(model)  # noted now, written by this worker's writer (gateway_spend.InFlight)
        admitted["counted"] = True
    await _hold(request, model)


async def _hold(request: Any, model: str | None) -> None:
    """A request for an on-demand model that does not serve now waits here, before LiteLLM sees it (a streamed
    one before its first byte), counted as waiting: the activator of its rank 0's node starts it on that. It goes
    on once its watchers say `ok` and the router has it; past its hold it is refused 503 (ClientErrors adds
    Retry-After)."""
    if model is None or model not in _on_demand:
        return
    if model in _warm:
        if _applied != (_withdrawn, _warm):  # the poller made it warm again since this worker's router was set:
            with _lock:  # routed now, not at the next CHECK_S (else LiteLLM answers 400 "Invalid model name")
                _reload_models()
        return
    hold_s = float(_on_demand[model].get("hold") or HOLD_S)
    t0 = time.monotonic()
    deadline = t0 + hold_s
    await asyncio.to_thread(gateway_spend.demand_add, model, waiting=1)
    _held[model] = _held.get(model, 0) + 1
    _hurry.set()  # the poller asks its watchers now (and to look now), not at its next second
    # a client that hangs up is no longer counted as waiting: a member is not started (nor kept) for nobody
    watch = request.scope.get(HUNG_UP) if request is not None else None
    gone = asyncio.ensure_future(watch()) if watch is not None else None
    try:
        while model not in _warm and time.monotonic() < deadline:
            if _hung(gone):
                raise Refusal(
                    f"model {model}: the client hung up after {time.monotonic() - t0:.0f} s held for its start "
                    "(on demand): no longer waiting",
                    499,
                    request,
                )
            if (_why_cold.get(model) or "").startswith(NO_ROOM):  # its activator found no room: refused now
                raise Refusal(f"model {model} cannot start (on demand): {_why_cold[model]}", 503, request)
            if _stopping():  # the gateway restarts: answered now, not dropped when Docker kills the worker
                raise Refusal(
                    f"model {model} is starting (on demand) and the gateway is restarting: retry in {RETRY_S} s",
                    503,
                    request,
                )
            await asyncio.sleep(HELD_STEP_S)
    finally:
        if gone is not None:
            gone.cancel()
        _held[model] -= 1
        if not _held[model]:
            del _held[model]
        await asyncio.to_thread(gateway_spend.demand_add, model, waiting=-1)
    if model not in _warm:
        why = _why_cold.get(model) or "not started"
        raise Refusal(
            f"model {model} is starting (on demand) and was not ready within {hold_s:g} s ({why}): "
            f"retry in {RETRY_S} s",
            503,
            request,
        )
    with _lock:
        _reload_models()  # the router has its engines before LiteLLM routes this request


def _hung(gone: asyncio.Future[bool] | None) -> bool:
    """Whether the hold's watch (ClientErrors' hung_up) saw the client hang up."""
    return gone is not None and gone.done() and not gone.cancelled() and gone.exception() is None and gone.result()


def _stopping() -> bool:
    """Whether this worker was told to stop (`docker restart`, `up` replacing the gateway: SIGTERM): uvicorn's
    server, whose handler of the signal says so, then waits for its requests before it exits, and a request held
    for an on-demand start would wait there until Docker kills the worker, its client getting a dropped
    connection. False when the handler is not uvicorn's."""
    server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return bool(getattr(server, "should_exit", False))


class SpendTracker(CustomLogger):  # type: ignore[misc]  # LiteLLM ships no types: its class is Any to mypy
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
