"""vLLM's own chat layer in front of the lockstep engine (a real vLLM image, torchrun backend).

What `vllm serve` does for tools and reasoning, done with vLLM's own parts rather than copies of them:
- the prompt: the model's chat template, given the request's `tools` and `chat_template_kwargs`
  (`tokenizer.apply_chat_template`, as vLLM's renderer calls it);
- the request: vLLM's `ChatCompletionRequest` (its validation), adjusted by the parser (`adjust_request`:
  the structural tags that make `tool_choice` required/named hold), turned into vLLM's `SamplingParams`
  (`to_sampling_params`: structured outputs for `response_format`, stop, logprobs) and sent to every rank
  as msgspec JSON (`GenRequest.intent["sampling_params"]`), so all ranks apply the same constraints;
- the output: the parser class `vllm.parser.ParserManager.get_parser` composes from `--tool-call-parser`
  and `--reasoning-parser`, one instance per request, `parse` for a whole answer, `parse_delta` per step. For a
  model that speaks OpenAI's harmony format (gpt-oss: config.json `model_type` gpt_oss) that class is vLLM's
  HarmonyParser, as its serving layer asks for it (`is_harmony`, entrypoints/openai/chat_completion/serving.py):
  gpt-oss's own reasoning and tool parsers only mark boundaries and refuse to parse on their own.

vLLM is imported lazily: this module is importable (and its shape testable) where vLLM is not. The whole
path is checked against the installed vLLM by scripts/check_vllm_parsers.py (docs/serving-features.md).
"""

from __future__ import annotations

from typing import Any

from ..chat import ChatFeatures, ChatPlan, RequestError


def _dump(model: Any) -> Any:
    return model.model_dump(exclude_none=True) if hasattr(model, "model_dump") else model


class VllmOutputParser:
    """sparklaunch.chat.OutputParser over one vLLM Parser instance."""

    def __init__(self, parser: Any, request: Any, enable_auto_tools: bool, prompt_token_ids: list[int] | None = None):
        self.parser, self.request, self.enable_auto_tools = parser, request, enable_auto_tools
        self.prompt_token_ids = prompt_token_ids

    def delta(self, text: str, token_ids: list[int], finished: bool) -> dict[str, Any]:
        msg = self.parser.parse_delta(
            delta_text=text,
            delta_token_ids=list(token_ids),
            request=self.request,
            prompt_token_ids=self.prompt_token_ids,
            finished=finished,
        )
        if msg is None:
            return {}
        out = {
            k: v
            for k, v in _dump(msg).items()
            if k in ("reasoning", "content", "tool_calls") and v not in (None, "", [])
        }
        return out

    def complete(self, text: str, token_ids: list[int]) -> dict[str, Any]:
        if self.prompt_token_ids is not None:
            self.parser.set_prompt_token_ids(self.prompt_token_ids)
        reasoning, content, calls = self.parser.parse(
            text, self.request, enable_auto_tools=self.enable_auto_tools, model_output_token_ids=list(token_ids)
        )
        from vllm.entrypoints.generate.base.protocol import ToolCall
        from vllm.renderers.chat_utils import make_tool_call_id

        tool_calls = [_dump(ToolCall(id=c.id or make_tool_call_id(), function=c)) for c in (calls or [])]
        return {"reasoning": reasoning, "content": content, "tool_calls": tool_calls}


HARMONY_MODEL_TYPE = "gpt_oss"  # vLLM's serving layer: is_harmony = hf_config.model_type == "gpt_oss"


class VllmChatFrontend:
    def __init__(self, features: ChatFeatures, tokenizer: Any, model_name: str, is_harmony: bool = False):
        from vllm.parser import ParserManager

        self.features, self.tokenizer, self.model_name = features, tokenizer, model_name
        try:
            self.parser_cls = ParserManager.get_parser(
                tool_parser_name=features.tool_call_parser,
                reasoning_parser_name=features.reasoning_parser,
                enable_auto_tools=features.enable_auto_tool_choice,
                model_name=model_name,
                is_harmony=is_harmony,
                tokenizer=tokenizer,
            )
        except (KeyError, TypeError) as e:  # an unknown parser name, or one the tokenizer cannot serve
            raise SystemExit(f"serve_torchrun.py: {e}") from None

    def _request(self, plan: ChatPlan) -> Any:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        if getattr(plan, "_vllm_request", None) is None:
            from pydantic import ValidationError

            body = {k: v for k, v in plan.body.items() if k != "stream_options" or plan.body.get("stream")}
            try:  # vLLM's own validation of the request: its complaint, naming the field, is a 400
                plan._vllm_request = ChatCompletionRequest.model_validate(body)  # type: ignore[attr-defined]
            except ValidationError as e:
                err = e.errors()[0]
                field = ".".join(str(x) for x in err.get("loc", ())) or "body"
                raise RequestError(field, f"{field}: {err.get('msg')}") from None
        return plan._vllm_request  # type: ignore[attr-defined]

    def _parser(self, plan: ChatPlan) -> Any:
        if self.parser_cls is None:
            return None
        return self.parser_cls(
            self.tokenizer, self._request(plan).tools, chat_template_kwargs=plan.chat_template_kwargs
        )

    def render(self, messages: list[dict[str, Any]], plan: ChatPlan) -> str:
        tools = [{"type": "function", "function": f} for f in plan.tools.values()] if plan.parses_tools else None
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True, **plan.chat_template_kwargs
        )

    def intent(self, plan: ChatPlan, max_tokens: int | None = None) -> dict[str, Any] | None:
        """vLLM's SamplingParams for this request, as msgspec JSON for every rank."""
        import msgspec

        request = self._request(plan)
        parser = self._parser(plan)
        if parser is not None:
            request = parser.adjust_request(request)
            plan._vllm_request = request  # type: ignore[attr-defined]
        params = request.to_sampling_params(max_tokens or 16, {})
        return {"sampling_params": msgspec.json.encode(params).decode("utf-8")}

    def parser(self, plan: ChatPlan, prompt_token_ids: list[int] | None = None) -> VllmOutputParser:
        # the rendered prompt tells the parser where generation starts (e.g. inside an opened <think>)
        return VllmOutputParser(
            self._parser(plan), self._request(plan), self.features.enable_auto_tool_choice, prompt_token_ids
        )


def decode_sampling_params(intent: dict[str, Any] | None, sampling_params_cls: Any) -> Any | None:
    """The SamplingParams rank 0's front end made, on any rank (None: the plain sampling fields apply)."""
    if not intent or "sampling_params" not in intent:
        return None
    import msgspec

    return msgspec.json.decode(intent["sampling_params"].encode("utf-8"), type=sampling_params_cls)
