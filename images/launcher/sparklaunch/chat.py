"""What a chat request asks beyond plain text (tools, tool_choice, reasoning, response_format, logprobs),
checked against what this server can honour, with vLLM 0.32's semantics.

The rule of issue 18: a serving flag or a request field is honoured or refused, never dropped. So:
- every field of vLLM's ChatCompletionRequest is listed below as honoured, or refused unless it holds
  its default (HTTP 400 naming the field);
- `tools` with `tool_choice` auto needs `--enable-auto-tool-choice --tool-call-parser` (vLLM's own 400);
  `required` and named choices need a tool-call parser here (the launcher constrains nothing itself);
- the engine's front end (`adapter.chat_frontend`) renders tools into the prompt and parses the model's
  markup; an engine without one refuses every field that needs it.
Fields vLLM itself does not know are ignored with a warning, as vLLM does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("sparklaunch.chat")

# honoured by the launcher (sampling values reach the engine; the sim has no logits to apply them to)
HONOURED = frozenset(
    {
        "messages",
        "model",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "logprobs",
        "top_logprobs",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "response_format",
        "stop",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "include_reasoning",
        "parallel_tool_calls",
        "user",
        "ignore_eos",
        "min_tokens",
        "return_token_ids",
        "chat_template_kwargs",
        "include_stop_str_in_output",
        "request_id",
    }
)
# vLLM fields the launcher cannot honour: refused unless they hold vLLM's default
DEFAULTS: dict[str, Any] = {
    "logit_bias": None,
    "reasoning_effort": None,
    "thinking_token_budget": None,
    "use_beam_search": False,
    "watermarking": None,
    "length_penalty": 1.0,
    "stop_token_ids": None,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "truncate_prompt_tokens": None,
    "truncation_side": None,
    "prompt_logprobs": None,
    "logprob_token_ids": None,
    "allowed_token_ids": None,
    "bad_words": None,
    "echo": False,
    "add_generation_prompt": True,
    "continue_final_message": False,
    "add_special_tokens": False,
    "documents": None,
    "chat_template": None,
    "media_io_kwargs": None,
    "mm_processor_kwargs": None,
    "structured_outputs": None,
    "priority": 0,
    "session_id": None,
    "return_tokens_as_token_ids": None,
    "routed_experts_prompt_start": 0,
    "return_token_offsets": None,
    "return_prompt_text": None,
    "mm_payload": None,
    "return_mm_kwargs": None,
    "cache_salt": None,
    "kv_transfer_params": None,
    "ec_transfer_params": None,
    "vllm_xargs": None,
    "repetition_detection": None,
    "stream_interval": None,
    "functions": None,
    "function_call": None,
}
CHAT_TEMPLATE_KWARGS = frozenset({"enable_thinking", "thinking"})
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


class RequestError(ValueError):
    """A request the server refuses (HTTP 400); `param` names the field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ChatFeatures:
    """The serving flags that shape chat output (`vllm serve --enable-auto-tool-choice ...`)."""

    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None

    @classmethod
    def from_namespace(cls, ns: Any) -> ChatFeatures:
        so = getattr(ns, "structured_outputs_config", None)
        reasoning = getattr(ns, "reasoning_parser", None) or getattr(so, "reasoning_parser", None) or None
        return cls(
            bool(getattr(ns, "enable_auto_tool_choice", False)),
            getattr(ns, "tool_call_parser", None) or None,
            reasoning,
        )


@dataclass
class ChatPlan:
    """A checked request: what the answer must look like."""

    body: dict[str, Any] = field(default_factory=dict)  # the request as sent (vLLM's parsers take it whole)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> function (name, parameters)
    tool_choice: str = "none"  # none | auto | required | named
    named_tool: str | None = None
    reasoning: bool = False  # the reasoning parser splits the output
    include_reasoning: bool = True
    json_schema: dict[str, Any] | None = None  # response_format json_object ({}) or json_schema
    logprobs: bool = False
    top_logprobs: int = 0
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def parses_tools(self) -> bool:
        return self.tool_choice != "none"


class OutputParser(Protocol):
    """One request's output parser (one instance per request; vLLM's or the sim's).

    delta(): the OpenAI stream delta for new text ({} while markup may be starting): keys `reasoning`,
    `content`, `tool_calls` ([{index, id, type, function: {name, arguments}}], fragments allowed).
    complete(): the whole output: `reasoning`, `content`, `tool_calls` ([{id, type, function}])."""

    def delta(self, text: str, token_ids: list[int], finished: bool) -> dict[str, Any]: ...
    def complete(self, text: str, token_ids: list[int]) -> dict[str, Any]: ...


class ChatFrontend(Protocol):
    """What an engine supplies to honour a ChatPlan: the prompt (tools included) and the output parser."""

    features: ChatFeatures

    def render(self, messages: list[dict[str, Any]], plan: ChatPlan) -> str: ...
    def intent(self, plan: ChatPlan, max_tokens: int | None = None) -> dict[str, Any] | None: ...
    def parser(self, plan: ChatPlan, prompt_token_ids: list[int] | None = None) -> OutputParser: ...


def check_fields(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if key in HONOURED:
            continue
        if key in DEFAULTS:
            if value != DEFAULTS[key] and value not in (None, [], {}):
                raise RequestError(
                    key,
                    f"{key}: not supported by this server (the sparklaunch front end cannot "
                    "honour it); remove the field",
                )
            continue
        log.warning("The following fields were present in the request but ignored: {%r}", key)


def plan_chat(body: dict[str, Any], features: ChatFeatures | None) -> ChatPlan:
    """Check the chat-specific fields against the server's flags; raise RequestError naming the field."""
    check_fields(body)
    f = features or ChatFeatures()
    plan = ChatPlan(
        body=body,
        logprobs=bool(body.get("logprobs")),
        include_reasoning=body.get("include_reasoning", True) is not False,
        parallel_tool_calls=body.get("parallel_tool_calls", True) is not False,
    )
    top = body.get("top_logprobs")
    if top is not None:
        if not isinstance(top, int) or not 0 <= top <= 20:
            raise RequestError("top_logprobs", "top_logprobs: an integer from 0 to 20 is required")
        if top and not plan.logprobs:
            raise RequestError(
                "top_logprobs", "top_logprobs: when using `top_logprobs`, `logprobs` must be set to true"
            )
        plan.top_logprobs = top

    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError("chat_template_kwargs", "chat_template_kwargs: an object is required")
    for key in kwargs:
        if key not in CHAT_TEMPLATE_KWARGS:
            raise RequestError(
                "chat_template_kwargs",
                f"chat_template_kwargs.{key}: not supported by this server "
                f"(supported: {', '.join(sorted(CHAT_TEMPLATE_KWARGS))})",
            )
    plan.chat_template_kwargs = dict(kwargs)
    thinking = kwargs.get("enable_thinking", kwargs.get("thinking", True))
    plan.reasoning = bool(f.reasoning_parser) and thinking is not False

    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise RequestError("tools", "tools: a list of {type: function, function: {...}} is required")
        for i, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) else None
            if (
                not isinstance(t, dict)
                or t.get("type", "function") != "function"
                or not isinstance(fn, dict)
                or not isinstance(fn.get("name"), str)
            ):
                raise RequestError(
                    "tools", f"tools[{i}]: {{type: function, function: {{name, parameters}}}} is required"
                )
            plan.tools[fn["name"]] = fn
    choice = body.get("tool_choice")
    if choice is None:
        choice = "auto" if plan.tools else "none"
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if not isinstance(name, str):
            raise RequestError("tool_choice", "tool_choice: {type: function, function: {name}} is required")
        if name not in plan.tools:
            raise RequestError("tool_choice", f"tool_choice: tool {name!r} is not in tools")
        plan.tool_choice, plan.named_tool = "named", name
    elif choice in ("none", "auto", "required"):
        plan.tool_choice = choice
    else:
        raise RequestError(
            "tool_choice", f"tool_choice: 'none', 'auto', 'required' or a named function, got {choice!r}"
        )
    if plan.tool_choice != "none" and not plan.tools:
        raise RequestError("tool_choice", f"tool_choice: {plan.tool_choice!r} needs tools")
    if plan.tool_choice == "auto" and not (f.enable_auto_tool_choice and f.tool_call_parser):
        raise RequestError(
            "tool_choice", '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
        )
    if plan.tool_choice in ("required", "named") and not f.tool_call_parser:
        raise RequestError(
            "tool_choice",
            f"tool_choice {plan.tool_choice!r} needs --tool-call-parser on this "
            "server (the sparklaunch front end parses the model's tool-call markup)",
        )

    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind not in RESPONSE_FORMATS:
            raise RequestError("response_format", f"response_format.type: one of {', '.join(RESPONSE_FORMATS)}")
        if kind == "json_object":
            plan.json_schema = {}
        elif kind == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema")
            if not isinstance(schema, dict):
                raise RequestError("response_format", "response_format.json_schema.schema: an object is required")
            plan.json_schema = schema
        if plan.json_schema is not None and plan.tool_choice in ("required", "named"):
            raise RequestError(
                "response_format", f"response_format cannot be combined with tool_choice {plan.tool_choice!r}"
            )
    return plan


def needs_frontend(plan: ChatPlan) -> str | None:
    """The first field of a plan that only an engine front end can honour (None: plain text will do)."""
    if plan.tools and plan.tool_choice != "none":
        return "tools"
    if plan.json_schema is not None:
        return "response_format"
    return None
