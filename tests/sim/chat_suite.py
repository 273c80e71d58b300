"""One request suite for the serving features of issue 18, run against any OpenAI endpoint of the lab's
engine: a tool call with tool_choice auto and required, a streamed tool call, a reasoning response, a stop
sequence, and a refused field. `run_suite` returns the response *shape* of each case (which keys, which
finish reason, which tool and argument types), so every backend (solo, ray, native, torchrun, and the
2xsolo proxy) can be held to the same one: `expected_shape(reasoning)`.

The engine is vllm-sim: it writes tool calls and reasoning in the markup of the server's parsers and the
server parses them; a shape here proves the markup went through the parser (no `<tool_call>` or
`</think>` left in `content`).
"""

from __future__ import annotations

import json
from typing import Any

import requests

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}
MARKUP = (
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<function=",
    "<arg_key>",
    "<|channel|>",
    "<|message|>",
    "<|call|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|channel>",
    "<channel|>",
    "\uff5cDSML\uff5c",
)


def _post(base: str, model: str, headers: dict | None, stream: bool = False, **body: Any) -> requests.Response:
    payload = {"model": model, "messages": [{"role": "user", "content": "what is the weather in paris"}], **body}
    if stream:
        payload["stream"] = True
    return requests.post(
        base.rstrip("/") + "/chat/completions", json=payload, headers=headers or {}, timeout=120, stream=stream
    )


def _call_shape(call: dict) -> dict:
    args = json.loads(call["function"]["arguments"])
    return {
        "type": call["type"],
        "name": call["function"]["name"],
        "id": call["id"].startswith("chatcmpl-tool-"),
        "args": {k: type(v).__name__ for k, v in sorted(args.items())},
    }


def _message_shape(body: dict) -> dict:
    choice = body["choices"][0]
    msg = choice["message"]
    content = msg.get("content") or ""
    assert not any(m in content for m in MARKUP), f"parser markup leaked into content: {content!r}"
    return {
        "finish_reason": choice["finish_reason"],
        "content": bool(content.strip()),
        "reasoning": bool(msg.get("reasoning")),
        "tool_calls": [_call_shape(c) for c in msg.get("tool_calls") or []],
    }


def _stream_shape(resp: requests.Response) -> dict:
    assert resp.status_code == 200, resp.text
    calls: dict[int, dict] = {}
    content, reasoning, finish, chunks = "", "", None, 0
    for line in resp.iter_lines(decode_unicode=True):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        for choice in event.get("choices", []):
            chunks += 1
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning") or ""
            for tc in delta.get("tool_calls") or []:  # OpenAI streaming: fragments joined by index
                slot = calls.setdefault(tc["index"], {"id": "", "type": "", "function": {"name": "", "arguments": ""}})
                slot["id"] += tc.get("id") or ""
                slot["type"] = tc.get("type") or slot["type"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    assert not any(m in content for m in MARKUP), f"parser markup leaked into streamed content: {content!r}"
    return {
        "finish_reason": finish,
        "content": bool(content.strip()),
        "reasoning": bool(reasoning),
        "tool_calls": [_call_shape(calls[i]) for i in sorted(calls)],
        "chunks": chunks >= 2,
    }


def run_suite(base: str, model: str, headers: dict | None = None) -> dict[str, Any]:
    """`base` ends with /v1. Returns {case: shape}."""
    out: dict[str, Any] = {}
    out["auto"] = _message_shape(_ok(_post(base, model, headers, tools=[WEATHER], tool_choice="auto")))
    out["required"] = _message_shape(_ok(_post(base, model, headers, tools=[WEATHER], tool_choice="required")))
    out["stream"] = _stream_shape(
        _post(base, model, headers, stream=True, tools=[WEATHER], stream_options={"include_usage": True})
    )
    out["reasoning"] = _message_shape(_ok(_post(base, model, headers, max_tokens=40)))
    stopped = _ok(_post(base, model, headers, max_tokens=40, stop=["ran"]))
    out["stop"] = {
        **_message_shape(stopped),
        "stop_reason": stopped["choices"][0].get("stop_reason"),
        "cut": "ran" not in (stopped["choices"][0]["message"]["content"] or ""),
    }
    refused = _post(base, model, headers, use_beam_search=True)
    out["refused"] = {"status": refused.status_code, "names_field": "use_beam_search" in refused.text}
    return out


def _ok(resp: requests.Response) -> dict:
    assert resp.status_code == 200, resp.text
    return resp.json()


def expected_shape(reasoning: bool, via_proxy: bool = False) -> dict[str, Any]:
    """What every backend must answer for a server with a tool-call parser (and a reasoning parser or not)."""
    call = [{"type": "function", "name": "get_weather", "id": True, "args": {"city": "str", "days": "int"}}]
    tool_case = {"finish_reason": "tool_calls", "content": False, "reasoning": reasoning, "tool_calls": call}
    return {
        "auto": tool_case,
        "required": tool_case,
        "stream": {**tool_case, "chunks": True},
        "reasoning": {"finish_reason": "length", "content": True, "reasoning": reasoning, "tool_calls": []},
        "stop": {
            "finish_reason": "stop",
            "content": True,
            "reasoning": reasoning,
            "tool_calls": [],
            "stop_reason": "ran",
            "cut": True,
        },
        # LiteLLM answers a backend's 400 with its own 400 that quotes the message
        "refused": {"status": 400, "names_field": True},
    }
