"""OpenAI-compatible HTTP front end (aiohttp), shaped like vLLM 0.32's server.

Routes: /v1/models, /v1/chat/completions, /v1/completions (streamed SSE or not; `stream_options.
include_usage` adds vLLM's final usage chunk; `return_token_ids` adds token ids per chunk, which
llama-benchy uses to time tokens), /health and /ping (200, 503 while ranks are joining or after the
engine died), /metrics, /version. aiohttp is a vLLM dependency, so this runs unchanged in the real
vllm-node images under torchrun.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from . import metrics
from .chat import ChatPlan, RequestError, needs_frontend, plan_chat
from .driver import EngineDead, EngineDriver
from .protocol import Delta, GenRequest

log = logging.getLogger("sparklaunch.api")

VLLM_VERSION = "0.32.0"
DEFAULT_OUTPUT_TOKENS = 256  # when a client sets no max_tokens, how long the (simulated) answer runs
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "include_stop_str_in_output",
)


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> web.Response:
        return web.json_response(
            {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}},
            status=self.status,
        )


class _Fanout:
    """Receives deltas on the engine thread and routes them to the request handlers' queues."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queues: dict[str, asyncio.Queue] = {}

    def deltas(self, deltas: list[Delta]) -> None:
        self.loop.call_soon_threadsafe(self._route, deltas)

    def dead(self, reason: str) -> None:
        self.loop.call_soon_threadsafe(self._fail_all, reason)

    def _route(self, deltas: list[Delta]) -> None:
        for d in deltas:
            q = self.queues.get(d.request_id)
            if q is not None:
                q.put_nowait(d)

    def _fail_all(self, reason: str) -> None:
        for rid, q in list(self.queues.items()):
            q.put_nowait(Delta(rid, [], "", finished=True, finish_reason="error", error=reason))


class OpenAIServer:
    def __init__(
        self,
        driver: EngineDriver,
        *,
        api_keys: list[str] | None = None,
        default_output_tokens: int = DEFAULT_OUTPUT_TOKENS,
    ):
        self.driver = driver
        self.adapter = driver.adapter
        self.api_keys = set(api_keys or [])
        self.default_output_tokens = default_output_tokens
        self.fanout: _Fanout | None = None
        self.created = int(time.time())
        # tools / reasoning: the engine's chat front end (sparklaunch.chat); the serving flags it was given
        self.frontend = getattr(self.adapter, "chat_frontend", None)
        self.features = (
            self.frontend.features if self.frontend is not None else getattr(self.adapter, "chat_features", None)
        )

    # -- app ------------------------------------------------------------------------------------
    def app(self, extra_routes: list[web.RouteDef] | None = None) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_route("*", "/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        if extra_routes:
            app.add_routes(extra_routes)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self.fanout = _Fanout(asyncio.get_running_loop())
        self.driver.start(self.fanout)

    async def _on_shutdown(self, app: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.driver.shutdown)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        if self.api_keys and request.path.startswith("/v1"):
            auth = request.headers.get("Authorization", "")
            if not (auth.startswith("Bearer ") and auth[7:] in self.api_keys):
                return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            response = await handler(request)
        except ApiError as e:
            return e.response()
        if self.adapter.simulated and not response.prepared:  # streams set it before they start
            response.headers["X-Simulated-By"] = "vllm-sim"
        return response

    # -- plain endpoints ------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.driver.healthy else 503)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def metrics(self, request: web.Request) -> web.Response:
        text = metrics.render(
            self.adapter.served_model_names[0],
            self.driver.stats,
            self.driver.counters,
            simulated=self.adapter.simulated,
            latencies=self.driver.latencies,
            cache_info=getattr(self.adapter, "cache_info", None),
            memory_plan=getattr(self.adapter, "memory_plan", None),
            spec_decode=getattr(self.adapter, "spec_decode", None),
        )
        if os.environ.get("SPARKLAUNCH_METRICS_NAMES") == "sglang":  # vllm-sim as SGLang: SGLang's names
            text = metrics.as_sglang(text)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def models(self, request: web.Request) -> web.Response:
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "vllm",
                "root": self.adapter.model_root,
                "parent": None,
                "max_model_len": self.adapter.max_model_len,
                "permission": [],
            }
            for name in self.adapter.served_model_names
        ]
        return web.json_response({"object": "list", "data": data})

    # -- generation -----------------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages: a non-empty list is required", param="messages")
        try:
            plan = plan_chat(body, self.features)
        except RequestError as e:
            raise ApiError(400, str(e), param=e.param) from None
        frontend = self.frontend
        if frontend is None:
            field = needs_frontend(plan)
            if field:
                raise ApiError(
                    400,
                    f"{field}: this engine's front end cannot honour it (no tool-call or "
                    "structured-output support under this launcher)",
                    param=field,
                )
            prompt = self.adapter.render_chat(messages)
        else:
            prompt = frontend.render(messages, plan)
        return await self._generate(request, body, prompt, self.adapter.encode(prompt), chat=True, plan=plan)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.adapter.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            ids, prompt = list(prompt), None
        else:
            raise ApiError(400, "prompt: one string or one list of token ids is required")
        return await self._generate(request, body, prompt, ids, chat=False)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ApiError(400, "request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        model = body.get("model")
        if model not in self.adapter.served_model_names:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
        if int(body.get("n") or 1) != 1:
            raise ApiError(400, "n > 1 is not supported by this server")
        return body

    def _request(
        self, body: dict[str, Any], prompt: str | None, ids: list[int], chat: bool, plan: ChatPlan | None = None
    ) -> GenRequest:
        max_len = self.adapter.max_model_len
        requested = body.get("max_completion_tokens") if chat else None
        requested = requested if requested is not None else body.get("max_tokens")
        if requested is not None and (not isinstance(requested, int) or requested < 1):
            raise ApiError(400, f"max_tokens must be at least 1, got {requested}.")
        if len(ids) + (requested or 0) > max_len or len(ids) >= max_len:
            raise ApiError(
                400,
                (
                    f"This model's maximum context length is {max_len} tokens. However, you requested "
                    f"{len(ids) + (requested or 0)} tokens ({len(ids)} in the messages, {requested or 0} in the "
                    "completion). Please reduce the length of the messages or completion."
                ),
            )
        eos = requested is None
        max_tokens = requested if requested is not None else min(self.default_output_tokens, max_len - len(ids))
        prefix = "chatcmpl-" if chat else "cmpl-"
        sampling = {k: body[k] for k in SAMPLING_KEYS if k in body}
        if plan is not None and plan.logprobs:
            sampling["logprobs"] = plan.top_logprobs  # vLLM's SamplingParams.logprobs: how many candidates
        elif not chat and body.get("logprobs") is not None:
            if not isinstance(body["logprobs"], int) or not 0 <= body["logprobs"] <= 20:
                raise ApiError(400, "logprobs: an integer from 0 to 20 is required", param="logprobs")
            sampling["logprobs"] = body["logprobs"]
        try:
            intent = self.frontend.intent(plan, max_tokens) if self.frontend is not None and plan is not None else None
        except RequestError as e:
            raise ApiError(400, str(e), param=e.param) from None
        return GenRequest(
            request_id=prefix + uuid.uuid4().hex,
            prompt_token_ids=ids,
            prompt=prompt,
            max_tokens=max_tokens,
            min_tokens=int(body.get("min_tokens") or 0),
            ignore_eos=bool(body.get("ignore_eos", False)),
            sampling=sampling,
            eos_at_max=eos,
            intent=intent,
        )

    async def _generate(
        self,
        request: web.Request,
        body: dict[str, Any],
        prompt: str | None,
        ids: list[int],
        chat: bool,
        plan: ChatPlan | None = None,
    ) -> web.StreamResponse:
        req = self._request(body, prompt, ids, chat, plan)
        assert self.fanout is not None
        q: asyncio.Queue = asyncio.Queue()
        self.fanout.queues[req.request_id] = q
        try:
            try:
                self.driver.submit(req)
            except EngineDead as e:
                raise ApiError(503, f"engine is not available: {e}", "EngineDeadError") from None
            parser = None
            if plan is not None and self.frontend is not None and (plan.parses_tools or plan.reasoning):
                parser = self.frontend.parser(plan, req.prompt_token_ids)
            shape = _Shape(req, body, chat, body["model"], plan, parser)
            if body.get("stream"):
                return await self._stream(request, q, shape)
            return await self._collect(q, shape)
        except (asyncio.CancelledError, ConnectionResetError):
            self.driver.abort(req.request_id)
            raise
        finally:
            self.fanout.queues.pop(req.request_id, None)

    async def _collect(self, q: asyncio.Queue, shape: _Shape) -> web.Response:
        text: list[str] = []
        token_ids: list[int] = []
        logprobs: list[dict[str, Any]] = []
        while True:
            d: Delta = await q.get()
            if d.error:
                raise ApiError(500, f"engine failed: {d.error}", "EngineDeadError")
            text.append(d.text)
            token_ids += d.token_ids
            logprobs += d.logprobs or []
            if d.finished:
                return web.json_response(shape.full("".join(text), token_ids, d, logprobs))

    async def _stream(self, request: web.Request, q: asyncio.Queue, shape: _Shape) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        if self.adapter.simulated:
            resp.headers["X-Simulated-By"] = "vllm-sim"
        await resp.prepare(request)
        first = True
        while True:
            d: Delta = await q.get()
            events: list[dict[str, Any]] = []
            if d.error:
                events.append(
                    {"error": {"message": f"engine failed: {d.error}", "type": "EngineDeadError", "code": 500}}
                )
            else:
                if first and shape.chat:
                    events.append(shape.role_chunk())
                first = False
                events += shape.chunks(d)
                if d.finished and shape.include_usage:
                    events.append(shape.usage_chunk(d))
            payload = "".join(f"data: {json.dumps(e, separators=(',', ':'))}\n\n" for e in events)
            if d.finished:
                payload += "data: [DONE]\n\n"
            await resp.write(payload.encode("utf-8"))
            if d.finished:
                await resp.write_eof()
                return resp


class _Shape:
    """Builds vLLM-shaped response objects for one request (vLLM 0.32: `reasoning`, and `tool_calls`
    only when there are some). With a parser, the output text is split into reasoning, content and
    tool calls as it streams; finish_reason becomes "tool_calls" when an auto or required choice called."""

    def __init__(
        self,
        req: GenRequest,
        body: dict[str, Any],
        chat: bool,
        model: str,
        plan: ChatPlan | None = None,
        parser: Any = None,
    ):
        self.req, self.chat, self.model = req, chat, model
        self.plan, self.parser = plan, parser
        self.created = int(time.time())
        opts = body.get("stream_options") or {}
        self.include_usage = bool(opts.get("include_usage"))
        self.continuous_usage = bool(opts.get("continuous_usage_stats"))
        self.return_token_ids = bool(body.get("return_token_ids"))
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self.tool_calls_sent = 0

    def _usage(self, d: Delta) -> dict[str, Any]:
        return {
            "prompt_tokens": d.prompt_tokens or self.req.prompt_len,
            "total_tokens": (d.prompt_tokens or self.req.prompt_len) + d.completion_tokens,
            "completion_tokens": d.completion_tokens,
        }

    def _envelope(self, choices: list[dict[str, Any]], obj: str | None = None) -> dict[str, Any]:
        return {
            "id": self.req.request_id,
            "object": obj or self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _finish_reason(self, d: Delta) -> str | None:
        if not d.finished:
            return None
        called = self.tool_calls_sent > 0 and self.plan is not None and self.plan.tool_choice in ("auto", "required")
        return "tool_calls" if called and d.finish_reason == "stop" else d.finish_reason

    def _logprobs(self, entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        if entries is None or (self.plan is not None and not self.plan.logprobs):
            return None
        if self.chat:

            def one(tok: str, lp: float) -> dict[str, Any]:
                return {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8"))}

            return {
                "content": [
                    dict(one(e["token"], e["logprob"]), top_logprobs=[one(t, lp) for t, lp in e.get("top", [])])
                    for e in entries
                ]
            }
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [dict(e.get("top", [])) for e in entries],
            "text_offset": None,
        }

    def _keep_calls(self, calls: list[dict[str, Any]], streaming: bool) -> list[dict[str, Any]]:
        """parallel_tool_calls=false keeps the first call only (vLLM's maybe_filter_parallel_tool_calls)."""
        if self.plan is not None and not self.plan.parallel_tool_calls:
            calls = [c for c in calls if (c.get("index", 0) if streaming else 0) == 0][: 1 if not streaming else None]
        if streaming:
            self.tool_calls_sent = max([self.tool_calls_sent] + [c.get("index", 0) + 1 for c in calls])
        else:
            self.tool_calls_sent = len(calls)
        return calls

    def role_chunk(self) -> dict[str, Any]:
        return self._envelope(
            [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
        )

    def chunks(self, d: Delta) -> list[dict[str, Any]]:
        """The chunks one delta gives: none while a parser holds text back (a tag may be starting)."""
        if self.parser is None:
            return [self.chunk(d)]
        delta = dict(self.parser.delta(d.text, d.token_ids, d.finished))
        if not self.plan.include_reasoning:
            delta.pop("reasoning", None)
        if delta.get("tool_calls"):
            delta["tool_calls"] = self._keep_calls(delta["tool_calls"], streaming=True)
            if not delta["tool_calls"]:
                del delta["tool_calls"]
        if not delta and not d.finished:
            return []
        return [self.chunk(d, delta)]

    def chunk(self, d: Delta, delta: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": d.text} if delta is None else delta,
                "logprobs": self._logprobs(d.logprobs),
                "finish_reason": self._finish_reason(d),
            }
        else:
            choice = {
                "index": 0,
                "text": d.text,
                "logprobs": self._logprobs(d.logprobs),
                "finish_reason": d.finish_reason if d.finished else None,
                "stop_reason": d.stop_reason if d.finished else None,
            }
        if self.return_token_ids:
            choice["token_ids"] = d.token_ids
        out = self._envelope([choice])
        if self.include_usage and self.continuous_usage:
            out["usage"] = self._usage(d)
        return out

    def usage_chunk(self, d: Delta) -> dict[str, Any]:
        out = self._envelope([])
        out["usage"] = self._usage(d)
        return out

    def full(
        self, text: str, token_ids: list[int], last: Delta, logprobs: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        if self.chat:
            reasoning, content, calls = None, text, []
            if self.parser is not None:
                parsed = self.parser.complete(text, token_ids)
                reasoning = (parsed.get("reasoning") or None) if self.plan.include_reasoning else None
                content = parsed.get("content") if (parsed.get("content") or "").strip() else None
                calls = self._keep_calls(list(parsed.get("tool_calls") or []), streaming=False)
            message: dict[str, Any] = {
                "role": "assistant",
                "content": content,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
            }
            if calls:
                message["tool_calls"] = calls
            message["reasoning"] = reasoning
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "logprobs": self._logprobs(logprobs if last.logprobs is not None or logprobs else None),
                "finish_reason": self._finish_reason(last),
                "stop_reason": last.stop_reason,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": self._logprobs(logprobs or None),
                "finish_reason": last.finish_reason,
                "stop_reason": last.stop_reason,
                "prompt_logprobs": None,
            }
            obj = "text_completion"
        if self.return_token_ids:
            choice["token_ids"] = token_ids
            choice["prompt_token_ids"] = self.req.prompt_token_ids
        out = self._envelope([choice], obj)
        out.update({"system_fingerprint": None, "usage": self._usage(last)})
        return out
