"""The gateway hook's hold, as pure logic (issue 40: the cold start's polls): the hook runs inside LiteLLM's
container, so here LiteLLM's few names it imports are stand-ins (a unit test of the hook's own logic; the lab
tests and benchmarks/ondemand_cold_start.py run it in the real proxy)."""

from __future__ import annotations

import asyncio
import http.server
import importlib.util
import json
import logging
import sys
import threading
import time
import types

import pytest

from sparkdeploy.deploy.stack import units as su
from sparkdeploy.nodeside.gateway import gateway_spend


class _Auth:
    def __init__(self, **kw: object) -> None:
        self.__dict__.update(kw)


class _ProxyException(Exception):
    def __init__(self, message: str = "", type: str = "", param: object = None, code: object = None) -> None:
        super().__init__(message)
        self.message, self.code = message, code


@pytest.fixture
def hook(monkeypatch):
    """gateway_hook loaded from its source with LiteLLM's names stood in for, its sibling gateway_spend real."""
    app = types.SimpleNamespace(middleware_stack=object())
    stubs = {
        "litellm": types.ModuleType("litellm"),
        "litellm._logging": types.SimpleNamespace(verbose_proxy_logger=logging.getLogger("test-litellm")),
        "litellm.integrations": types.ModuleType("litellm.integrations"),
        "litellm.integrations.custom_logger": types.SimpleNamespace(CustomLogger=object),
        "litellm.proxy": types.SimpleNamespace(proxy_server=types.SimpleNamespace(app=app, llm_router=None)),
        "litellm.proxy._types": types.SimpleNamespace(
            LitellmUserRoles=types.SimpleNamespace(PROXY_ADMIN="admin", INTERNAL_USER="user"),
            ProxyException=_ProxyException,
            UserAPIKeyAuth=_Auth,
        ),
    }
    for name, module in stubs.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "gateway_spend", gateway_spend)  # the hook's sibling, as the hook finds it
    monkeypatch.setattr(gateway_spend, "demand_add", lambda *a, **kw: None)  # no sqlite file here
    monkeypatch.syspath_prepend(str(su.HOOK_SOURCE.parent))  # what the hook adds: taken away after the test
    spec = importlib.util.spec_from_file_location("gateway_hook_under_test", su.HOOK_SOURCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_held_request_hurries_the_poller_and_goes_on_within_a_step_of_its_model_serving(hook):
    hook._on_demand = {"m": {"hold": 30}}
    hook._reload_models = lambda: None

    async def held() -> float:
        task = asyncio.create_task(hook._hold(None, "m"))
        await asyncio.sleep(0.3)
        assert hook._held == {"m": 1} and hook._hurry.is_set()  # counted, and the poller woken
        hook._warm = frozenset({"m"})  # what the poller sets once the member's watcher says ok
        t0 = time.monotonic()
        await task
        return time.monotonic() - t0

    assert asyncio.run(held()) < 0.15  # a step of HELD_STEP_S, not the old 0.2 s
    assert hook._held == {}


def test_the_poller_waits_its_second_when_idle_a_tenth_while_a_request_is_held_none_when_hurried(hook):
    hook.WATCH_S = 0.5
    t0 = time.monotonic()
    hook._pause()
    assert time.monotonic() - t0 >= 0.45  # idle: as before
    hook._held["m"] = 1
    t0 = time.monotonic()
    hook._pause()
    assert time.monotonic() - t0 < 0.3  # held: HELD_WATCH_S
    hook._hurry.set()
    t0 = time.monotonic()
    hook._pause()
    assert time.monotonic() - t0 < 0.05  # a request just held: at once


def test_a_held_models_watcher_is_asked_to_look_the_others_are_only_read(hook):
    paths: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            paths.append(self.path)
            body = b'{"groups": {"g": {"state": "starting"}}}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/watch"
    entry = {"model_list": [{"model_info": {"watch": url, "group": "g"}}]}
    hook._on_demand = {"held": entry, "cold": entry}
    hook._held["held"] = 1
    try:
        warm, why = hook._warm_models()
    finally:
        server.shutdown()
    assert warm == frozenset() and why == {"held": "starting", "cold": "starting"}
    assert sorted(paths) == ["/watch", "/watch?look=1"]


def test_a_warm_model_whose_watcher_does_not_answer_once_stays_warm_a_cold_one_stays_cold(hook):
    """A watcher busy past the hook's 0.5 s once (a loaded node) changes nothing, as for issue 43's withdrawal:
    a warm on-demand model is not taken out of the router for it (its requests would be refused 503 cold)."""
    entry = {"model_list": [{"model_info": {"watch": "http://127.0.0.1:9/watch", "group": "g"}}]}  # nobody there
    hook._on_demand = {"warm": entry, "cold": entry}
    hook._warm = frozenset({"warm"})
    warm, why = hook._warm_models()
    assert warm == frozenset({"warm"}) and why == {"cold": "its watcher does not answer"}


def test_a_held_client_that_hangs_up_is_no_longer_counted_waiting(hook, monkeypatch):
    """Before, a client gone while held counted as waiting until its hold ended (300 s by default): its member was
    started, and kept from its idle stop, for nobody. Now the hold ends within a step of the hang-up."""
    counted: list[int] = []
    monkeypatch.setattr(hook.gateway_spend, "demand_add", lambda model, waiting=0, **kw: counted.append(waiting))
    hook._on_demand = {"m": {"hold": 30}}

    async def held() -> tuple[Exception, float]:
        gone = asyncio.Event()

        async def hung_up() -> bool:  # ClientErrors' wait for the client's next message: here, its hang-up
            await gone.wait()
            return True

        request = types.SimpleNamespace(
            scope={hook.HUNG_UP: hung_up}, method="POST", url=types.SimpleNamespace(path="/v1/chat/completions")
        )
        task = asyncio.create_task(hook._hold(request, "m"))
        await asyncio.sleep(0.3)
        assert not task.done() and hook._held == {"m": 1} and counted == [1]
        gone.set()
        t0 = time.monotonic()
        try:
            await task
        except hook.Refusal as exc:
            return exc, time.monotonic() - t0
        raise AssertionError("the hold went on after its client hung up")

    refusal, took = asyncio.run(held())
    assert took < 0.15 and refusal.code == 499, (took, refusal.code)
    assert "the client hung up after 0 s held for its start (on demand): no longer waiting" in refusal.message
    assert hook._held == {} and counted == [1, -1]


def test_client_errors_hands_the_hang_up_the_hold_read_to_the_app_and_a_hold_ended_reads_nothing(hook):
    """ClientErrors' hung_up reads the server's next message (after the whole body only a hang-up comes); the
    app's own next receive gets it too, and a wait cancelled at a hold's end takes nothing from the app."""

    async def run() -> list[object]:
        queue: asyncio.Queue[dict[str, object]] = asyncio.Queue()
        await queue.put({"type": "http.request", "body": b'{"model": "m", "messages": []}', "more_body": False})
        seen: list[object] = []

        async def app(scope: dict[str, object], receive: object, send: object) -> None:
            seen.append((await receive())["body"])  # type: ignore[operator]  # the body, replayed
            wait = asyncio.ensure_future(scope[hook.HUNG_UP]())  # type: ignore[operator]
            await asyncio.sleep(0.05)
            wait.cancel()  # a hold that ended (its model serves): nothing read
            await queue.put({"type": "http.disconnect"})
            seen.append(await scope[hook.HUNG_UP]())  # type: ignore[operator]
            seen.append((await receive())["type"])  # type: ignore[operator]  # the app is told too

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
        await hook.ClientErrors(app)(scope, queue.get, None)
        return seen

    assert asyncio.run(run()) == [b'{"model": "m", "messages": []}', True, "http.disconnect"]


def _ask(hook, app, model: str = "m") -> list[dict[str, object]]:
    """One request through ClientErrors in front of `app`: what the client is sent."""
    sent: list[dict[str, object]] = []
    body = b'{"model": "%s", "messages": []}' % model.encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, object]:
        if not messages:
            await asyncio.Event().wait()  # a client that waits for its answer: nothing more comes
        return messages.pop(0)

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "client": ("1.2.3.4", 1), "headers": []}
    asyncio.run(hook.ClientErrors(app)(scope, receive, send))
    return sent


INVALID = b'{"error": {"message": "Invalid model name passed in model=m"}}'


def test_an_on_demand_request_whose_engine_leaves_under_it_is_held_again_and_answered(hook, monkeypatch):
    """Its engine crashed after the hold let it go, before LiteLLM's router picked it (the watcher saw the crash in
    that window, the router's list was reloaded without it: LiteLLM answers 400 "Invalid model name"). Before,
    the client got 503 "deployment coder is out of the gateway: cold: on demand, not running" (CI's faults lab
    test, once). Now nothing is sent: the request runs again, with its body and the scope as it came, is held by
    the hook until the model serves again, and is answered; counted in flight once, its end once."""
    flights: list[str] = []
    monkeypatch.setattr(hook._in_flight, "begin", lambda model: flights.append("begin"))
    monkeypatch.setattr(hook._in_flight, "end", lambda model: flights.append("end"))
    hook._reload_models = lambda: None
    hook._on_demand, hook._warm, hook._served = {"m": {"hold": 30}}, frozenset({"m"}), {"m"}
    runs: list[tuple[bytes, bool]] = []

    async def litellm(scope: dict[str, object], receive, send) -> None:
        request = types.SimpleNamespace(
            scope=scope, method="POST", url=types.SimpleNamespace(path="/v1/chat/completions")
        )
        body = (await receive())["body"]
        runs.append((body, "litellm.own" in scope))
        scope["litellm.own"] = True  # what an app writes into its scope
        await hook._admit(request, "m")  # the auth hook: counted, held while the model does not serve
        if len(runs) == 1:  # the crash, seen between the hold and the router's pick
            hook._warm, hook._served = frozenset(), set()
            asyncio.get_running_loop().call_later(0.2, lambda: setattr(hook, "_warm", frozenset({"m"})))
            await send({"type": "http.response.start", "status": 400, "headers": []})
            await send({"type": "http.response.body", "body": INVALID})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    sent = _ask(hook, litellm)
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [200]
    assert [m["body"] for m in sent if m["type"] == "http.response.body"] == [b'{"ok": true}']
    assert runs == [(b'{"model": "m", "messages": []}', False)] * 2
    assert flights == ["begin", "end"]


def test_an_on_demand_request_held_again_at_most_replays_times_then_told_why(hook):
    """A model whose engines keep leaving under the request: after REPLAYS more runs, a 503 with Retry-After and
    its watcher's reason (not the routes' "cold: on demand, not running" written at `up`), never a loop."""
    hook._reload_models = lambda: None
    hook._on_demand, hook._warm, hook._served = {"m": {"hold": 30}}, frozenset({"m"}), {"m"}
    hook._unavailable = {"m": "deployment coder is out of the gateway: cold: on demand, not running"}
    hook._why_cold = {"m": "restarting"}
    runs: list[int] = []

    async def litellm(scope: dict[str, object], receive, send) -> None:
        await receive()
        runs.append(1)
        hook._warm, hook._served = frozenset(), set()  # gone again under it
        await send({"type": "http.response.start", "status": 400, "headers": []})
        await send({"type": "http.response.body", "body": INVALID})
        hook._warm, hook._served = frozenset({"m"}), {"m"}

    hook._warm, hook._served = frozenset({"m"}), {"m"}
    sent = _ask(hook, litellm)
    assert len(runs) == hook.REPLAYS + 1
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert [m.get("status") for m in starts] == [503]
    assert (b"retry-after", str(hook.RETRY_S).encode()) in starts[0]["headers"]  # type: ignore[operator]
    body = json.loads(sent[-1]["body"])  # type: ignore[arg-type]
    assert body["error"]["message"] == (
        f"model m stopped serving {hook.REPLAYS + 1} times under this request (on demand; now: restarting): "
        f"retry in {hook.RETRY_S} s"
    )
