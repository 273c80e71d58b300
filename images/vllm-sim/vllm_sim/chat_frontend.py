"""The sim's chat front end: tools in the prompt, what the simulated model 'decides', and its parser.

A real model reads the tools from its chat template and decides; the sim decides by rule, so tests know
what to expect: with tools offered and tool_choice auto or required it calls the first tool (the named
one for a named choice), with arguments made from the tool's JSON schema; with a reasoning parser it
reasons first (unless `chat_template_kwargs.enable_thinking` is false); with response_format it writes
JSON made from the schema. The engine writes that as text in the recipe's parser markup (formats.py),
token by token, and this front end parses it back, so every flag and field takes the path it takes in
vLLM: markup out of the engine, parsed into `tool_calls` / `reasoning` by the server.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from sparklaunch.chat import ChatFeatures, ChatPlan

from .formats import StreamParser, check_parsers
from .tokenizer import SimTokenizer

REASONING_TEXT = "[simulated reasoning] no model thought here ; the sim decides by rule ."


def example_value(schema: dict[str, Any] | None, depth: int = 0) -> Any:
    """A value that fits a JSON schema (the common keywords): what the simulated model fills in."""
    schema = schema or {}
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return example_value(schema[key][0], depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        if depth > 4:
            return {}
        props = schema.get("properties") or {}
        required = schema.get("required")
        keys = [k for k in props if required is None or k in required] or list(props)
        return {k: example_value(props[k], depth + 1) for k in keys}
    if kind == "array":
        n = max(1, int(schema.get("minItems", 1)))
        return [example_value(schema.get("items"), depth + 1) for _ in range(n)]
    return {"integer": 1, "number": 1.5, "boolean": True, "null": None}.get(kind, "simulated")


class SimChatFrontend:
    def __init__(self, features: ChatFeatures, tokenizer: SimTokenizer):
        check_parsers(features.tool_call_parser, features.reasoning_parser)
        self.features, self.tokenizer = features, tokenizer

    def render(self, messages: list[dict[str, Any]], plan: ChatPlan) -> str:
        """The sim template, with the offered tools as a system turn (counted as prompt tokens)."""
        prompt = self.tokenizer.render_chat(messages)
        if plan.tools and plan.tool_choice != "none":
            tools = json.dumps(list(plan.tools.values()), sort_keys=True)
            prompt = f"<|start|>system<|message|>tools {tools}<|end|>" + prompt
        return prompt

    def intent(self, plan: ChatPlan, max_tokens: int | None = None) -> dict[str, Any] | None:
        """What the simulated model will write (the engine turns it into markup; JSON, so it travels to
        every rank with the request)."""
        out: dict[str, Any] = {}
        if plan.reasoning:
            out["reasoning"] = REASONING_TEXT
            out["reasoning_parser"] = self.features.reasoning_parser
        if plan.tool_choice in ("auto", "required", "named") and plan.tools:
            name = plan.named_tool or next(iter(plan.tools))
            out["tool_call"] = {"name": name, "arguments": example_value(plan.tools[name].get("parameters"))}
        elif plan.json_schema is not None:
            out["json"] = example_value(plan.json_schema) if plan.json_schema else {"simulated": True}
        return out or None

    def parser(self, plan: ChatPlan, prompt_token_ids: list[int] | None = None) -> SimOutputParser:
        return SimOutputParser(
            self.features.tool_call_parser if plan.parses_tools else None, plan, self.features.reasoning_parser
        )


def _tool_call_id() -> str:
    return "chatcmpl-tool-" + uuid.uuid4().hex[:24]  # vLLM's make_tool_call_id shape


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": _tool_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
    }


class SimOutputParser:
    """sparklaunch.chat.OutputParser over the sim's markup reader: a tool call goes out whole, in one
    stream delta, once its closing tag has arrived (vLLM streams the arguments in fragments; clients join
    both the same way)."""

    def __init__(self, tool_parser: str | None, plan: ChatPlan, reasoning_parser: str | None = None):
        self.tool_parser, self.plan, self.reasoning_parser = tool_parser, plan, reasoning_parser
        self._stream = StreamParser(tool_parser, plan.reasoning, plan.tools, reasoning_parser)
        self._index = 0

    def delta(self, text: str, token_ids: list[int], finished: bool) -> dict[str, Any]:
        p = self._stream.feed(text, final=finished)
        out: dict[str, Any] = {}
        if p.reasoning:
            out["reasoning"] = p.reasoning
        if p.content:
            out["content"] = p.content
        if p.tool_calls:
            out["tool_calls"] = [{"index": self._index + i, **_call(n, a)} for i, (n, a) in enumerate(p.tool_calls)]
            self._index += len(p.tool_calls)
        return out

    def complete(self, text: str, token_ids: list[int]) -> dict[str, Any]:
        p = StreamParser(self.tool_parser, self.plan.reasoning, self.plan.tools, self.reasoning_parser).feed(
            text, final=True
        )
        return {"reasoning": p.reasoning, "content": p.content, "tool_calls": [_call(n, a) for n, a in p.tool_calls]}
