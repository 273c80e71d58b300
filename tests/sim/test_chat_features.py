"""Issue 18: tools, tool_choice, reasoning, stop and refused fields, through the launcher's OpenAI server.

The parser sets come from the shipped recipes themselves (every `--tool-call-parser` / `--reasoning-parser`
pair they pass), so a recipe naming a new parser gets tested, or refused by the sim at start-up.
The request suite against real server processes is tests/sim/chat_suite.py; torchrun and native run it in
test_multinode.py, and every lab backend in tests/deploy/test_deploy_lab.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import requests
import yaml

from tests.sim.chat_suite import WEATHER, expected_shape, run_suite
from tests.sim.conftest import free_port
from vllm_sim.chat_frontend import example_value
from vllm_sim.formats import StreamParser, UnsupportedFormat, check_parsers, read_tool_call, write_tool_call
from vllm_sim.textgen import pieces

REPO = Path(__file__).resolve().parents[2]
MODEL = "zai-org/GLM-4.7-Flash"


def recipe_parsers() -> list[tuple[str, str | None, str | None]]:
    """(recipe, tool-call parser, reasoning parser) of every shipped recipe that names a parser."""
    out = []
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        args = [str(a) for a in (yaml.safe_load(path.read_text()).get("vllm") or {}).get("extra_args") or []]
        after = {
            flag: args[i + 1]
            for i, flag in enumerate(args[:-1])
            if flag in ("--tool-call-parser", "--reasoning-parser")
        }
        if after:
            out.append((path.stem, after.get("--tool-call-parser"), after.get("--reasoning-parser")))
    return out


PARSERS = recipe_parsers()


def test_the_shipped_recipes_name_parsers():
    assert {(t, r) for _, t, r in PARSERS} >= {("qwen3_coder", None), ("glm47", "glm45"), ("qwen3_coder", "qwen3")}


def _round_trip(parser: str, reasoning_parser: str, thinking: str, markup: str):
    """A call written by `parser` is the exact `markup`; after the reasoning (`thinking`, closed the parser's
    way) it parses back whole: the reasoning, no content, the one call."""
    tools = {"get_weather": WEATHER["function"]}
    call = write_tool_call(parser, "get_weather", {"city": "Paris", "days": 2})
    assert call == markup
    whole = StreamParser(parser, True, tools, reasoning_parser).feed(thinking + call, final=True)
    assert whole.content == "" and whole.tool_calls == [("get_weather", {"city": "Paris", "days": 2})]
    return whole


def test_minimax_m2_tool_call_round_trips():
    """MiniMax-M2 (vLLM's minimax_m2 tool parser): <minimax:tool_call><invoke name=...><parameter name=...>."""
    markup = (
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
        '<parameter name="days">2</parameter>\n</invoke>\n</minimax:tool_call>'
    )
    assert _round_trip("minimax_m2", "minimax_m2", "thinking</think>", markup).reasoning == "thinking"


def test_llama3_json_call_runs_to_the_end_of_the_output():
    """Llama 3.x (vLLM's llama3_json): `<|python_tag|>{"name": ..., "parameters": {...}}` with no closing tag."""
    tools = {"get_weather": WEATHER["function"]}
    call = write_tool_call("llama3_json", "get_weather", {"city": "Paris", "days": 2})
    assert call == '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}'
    streamed = StreamParser("llama3_json", False, tools)
    got = [streamed.feed(p, final=i == len(pieces(call)) - 1) for i, p in enumerate(pieces(call))]
    assert "".join(g.content for g in got) == ""
    assert [c for g in got for c in g.tool_calls] == [("get_weather", {"city": "Paris", "days": 2})]
    plain = StreamParser("llama3_json", False, tools).feed("It is sunny.", final=True)
    assert (plain.content, plain.tool_calls) == ("It is sunny.", [])


@pytest.mark.parametrize("parser", ["qwen3_coder", "glm47", "hermes"])
def test_tool_call_markup_round_trips_through_the_parser(parser):
    tools = {"get_weather": WEATHER["function"]}
    args = {"city": "Paris <north>", "days": 3}
    text = write_tool_call(parser, "get_weather", args)
    assert text.startswith("<tool_call>") and text.endswith("</tool_call>")
    if parser == "qwen3_coder":
        assert "<function=get_weather>\n<parameter=city>\nParis <north>\n</parameter>" in text
    if parser == "glm47":
        assert text == (
            "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris <north></arg_value>"
            "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
        )
    assert read_tool_call(parser, text[len("<tool_call>") : -len("</tool_call>")], tools) == ("get_weather", args)


def test_harmony_tool_call_round_trips_and_streams_as_the_whole_parse():
    """gpt-oss (--tool-call-parser openai --reasoning-parser openai_gptoss): harmony channels, not <think>."""
    markup = (
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris", "days": 2}<|call|>'
    )
    thinking = "<|channel|>analysis<|message|>thinking about it<|end|>"
    whole = _round_trip("openai", "openai_gptoss", thinking, markup)
    assert whole.reasoning == "thinking about it"
    text = thinking + markup
    streamed = StreamParser("openai", True, {"get_weather": WEATHER["function"]}, "openai_gptoss")
    got = [streamed.feed(p, final=i == len(pieces(text)) - 1) for i, p in enumerate(pieces(text))]
    assert "".join(g.content for g in got) == "" and [c for g in got for c in g.tool_calls] == whole.tool_calls
    answer = "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>It is sunny."
    final = StreamParser(None, True, {}, "openai_gptoss").feed(answer, final=True)
    assert (final.reasoning, final.content) == ("hm", "It is sunny.")


def test_deepseek_v4_dsml_tool_call_round_trips():
    """DeepSeek-V4 (vLLM's deepseek_v4 parser): <think> reasoning, DSML tool calls with string="true|false"."""
    tools = {"get_weather": WEATHER["function"]}
    call = write_tool_call("deepseek_v4", "get_weather", {"city": "Paris", "days": 2})
    assert call == (
        '<\uff5cDSML\uff5ctool_calls>\n<\uff5cDSML\uff5cinvoke name="get_weather">\n'
        '<\uff5cDSML\uff5cparameter name="city" string="true">Paris</\uff5cDSML\uff5cparameter>\n'
        '<\uff5cDSML\uff5cparameter name="days" string="false">2</\uff5cDSML\uff5cparameter>\n'
        "</\uff5cDSML\uff5cinvoke>\n</\uff5cDSML\uff5ctool_calls>"
    )
    text = "thinking</think>" + call
    whole = StreamParser("deepseek_v4", True, tools, "deepseek_v4").feed(text, final=True)
    assert (whole.reasoning, whole.content) == ("thinking", "")
    assert whole.tool_calls == [("get_weather", {"city": "Paris", "days": 2})]
    streamed = StreamParser("deepseek_v4", True, tools, "deepseek_v4")
    got = [streamed.feed(p, final=i == len(pieces(text)) - 1) for i, p in enumerate(pieces(text))]
    assert "".join(g.content for g in got) == "" and [c for g in got for c in g.tool_calls] == whole.tool_calls


def test_gemma4_tool_call_and_reasoning_round_trip():
    """Gemma 4 (vLLM's gemma4 parser): `<|channel>thought\\n...<channel|>` reasoning and
    `<|tool_call>call:NAME{key:<|"|>value<|"|>,...}<tool_call|>`; the `thought` label is not reasoning."""
    tools = {"get_weather": WEATHER["function"]}
    args = {"city": "Paris, FR", "days": 2, "opts": {"units": "metric", "hours": [1, 2]}, "ok": True}
    call = write_tool_call("gemma4", "get_weather", args)
    assert call == (
        '<|tool_call>call:get_weather{city:<|"|>Paris, FR<|"|>,days:2,'
        'opts:{units:<|"|>metric<|"|>,hours:[1,2]},ok:true}<tool_call|>'
    )
    text = "<|channel>thought\nthinking about it<channel|>" + call
    whole = StreamParser("gemma4", True, tools, "gemma4").feed(text, final=True)
    assert (whole.reasoning, whole.content, whole.tool_calls) == ("thinking about it", "", [("get_weather", args)])
    streamed = StreamParser("gemma4", True, tools, "gemma4")
    got = [streamed.feed(p, final=i == len(pieces(text)) - 1) for i, p in enumerate(pieces(text))]
    assert "".join(g.reasoning for g in got) == "thinking about it"
    assert [c for g in got for c in g.tool_calls] == whole.tool_calls
    answer = StreamParser(None, True, {}, "gemma4").feed("<|channel>thought\nhm<channel|>It is sunny.", final=True)
    assert (answer.reasoning, answer.content) == ("hm", "It is sunny.")


@pytest.mark.parametrize(
    "tool_parser,reasoning_parser,header",
    [("openai", "openai_gptoss", "<|channel|>analysis<|message|>"), ("gemma4", "gemma4", "<|channel>thought\n")],
)
def test_streamed_reasoning_never_shows_the_channel_header(tool_parser, reasoning_parser, header):
    """vLLM's harmony and Gemma 4 parsers drop the reasoning channel's header; streamed a character at a time
    (the header cut anywhere), no piece of it reaches the reasoning deltas."""
    text = header + "thinking about it" + ("<|end|>" if tool_parser == "openai" else "<channel|>")
    streamed = StreamParser(tool_parser, True, {}, reasoning_parser)
    deltas = [streamed.feed(ch, final=i == len(text) - 1).reasoning for i, ch in enumerate(text)]
    assert "".join(deltas) == "thinking about it"
    assert not any(d and d in header for d in deltas[: len(header)]), deltas


def test_a_gemma4_parser_does_not_go_with_a_think_parser():
    with pytest.raises(UnsupportedFormat):
        check_parsers("gemma4", "qwen3")
    with pytest.raises(UnsupportedFormat):
        check_parsers("qwen3_coder", "gemma4")
    check_parsers("deepseek_v4", "deepseek_v4")  # DSML tool calls after <think> reasoning: one model writes both


def test_stream_parser_holds_back_markup_and_matches_the_whole_parse():
    tools = {"get_weather": WEATHER["function"]}
    text = (
        "thinking about it</think>Let me look."
        + write_tool_call("glm47", "get_weather", {"city": "x", "days": 2})
        + " done"
    )
    whole = StreamParser("glm47", True, tools).feed(text, final=True)
    streamed = StreamParser("glm47", True, tools)
    reasoning = content = ""
    calls = []
    for i, piece in enumerate(pieces(text)):
        part = streamed.feed(piece, final=i == len(pieces(text)) - 1)
        reasoning, content, calls = reasoning + part.reasoning, content + part.content, calls + part.tool_calls
        assert "<" not in part.content, part.content  # a tag being written is never sent as content
    assert (reasoning, content, calls) == (whole.reasoning, whole.content, whole.tool_calls)
    assert whole.reasoning == "thinking about it" and whole.content == "Let me look. done"
    assert whole.tool_calls == [("get_weather", {"city": "x", "days": 2})]


def test_example_values_follow_the_schema():
    schema = {
        "type": "object",
        "required": ["a", "c"],
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"enum": ["x", "y"]}},
    }
    assert example_value(schema) == {"a": 1, "c": "x"}
    assert example_value({"type": "array", "items": {"type": "boolean"}}) == [True]


@pytest.fixture
def start_sim(sim_server):
    """A sim server of MODEL with these flags (stopped after the test); returns its base URL."""

    def start(*flags: str) -> str:
        base, _proc = sim_server("--max-model-len", "4096", *flags, model=MODEL, time_scale=0.01)
        return base

    return start


@pytest.mark.parametrize("recipe,tool_parser,reasoning_parser", PARSERS, ids=[p[0] for p in PARSERS])
def test_request_suite_for_each_recipe_parser_set(start_sim, recipe, tool_parser, reasoning_parser):
    flags = ["--enable-auto-tool-choice", "--tool-call-parser", tool_parser]
    if reasoning_parser:
        flags += ["--reasoning-parser", reasoning_parser]
    base = start_sim(*flags)
    assert run_suite(base + "/v1", MODEL) == expected_shape(reasoning=bool(reasoning_parser))


def chat(base: str, content: str = "hi", **body) -> requests.Response:
    """One chat completion of MODEL: a user message `content`, and `body`'s fields."""
    json = {"model": MODEL, "messages": [{"role": "user", "content": content}], **body}
    return requests.post(base + "/v1/chat/completions", json=json, timeout=30)


def test_fields_the_server_cannot_honour_are_refused_naming_the_field(start_sim):
    base = start_sim()  # no parser flags: a plain text server
    r = chat(base, tools=[WEATHER])  # tool_choice defaults to auto when tools are given
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert "--enable-auto-tool-choice" in r.json()["error"]["message"]
    r = chat(base, tools=[WEATHER], tool_choice="required")
    assert r.status_code == 400 and "--tool-call-parser" in r.json()["error"]["message"]
    for field, value in [
        ("logit_bias", {"1": 5}),
        ("prompt_logprobs", 1),
        ("chat_template", "{{x}}"),
        ("structured_outputs", {"regex": "a+"}),
    ]:
        r = chat(base, **{field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)
    r = chat(base, chat_template_kwargs={"custom": 1})
    assert r.status_code == 400 and "chat_template_kwargs.custom" in r.json()["error"]["message"]
    # tool_choice none: the tools are not used, and nothing needs a parser
    r = chat(base, tools=[WEATHER], tool_choice="none", max_tokens=3)
    assert r.status_code == 200 and "tool_calls" not in r.json()["choices"][0]["message"]
    r = chat(base, response_format={"type": "json_object"})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == '{"simulated": true}'
    body = chat(base, max_tokens=2, logprobs=True, top_logprobs=2).json()["choices"][0]
    assert [len(t["top_logprobs"]) for t in body["logprobs"]["content"]] == [2, 2]


def test_named_tool_choice_and_json_response_format(start_sim):
    base = start_sim("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    other = {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}
    choice = {"type": "function", "function": {"name": "noop"}}
    r = chat(base, "x", tools=[WEATHER, other], tool_choice=choice).json()["choices"][0]
    assert r["finish_reason"] == "stop"  # vLLM: "stop" for a named choice, "tool_calls" for auto/required
    assert [c["function"]["name"] for c in r["message"]["tool_calls"]] == ["noop"]
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    r = chat(base, "x", response_format=response_format).json()
    assert r["choices"][0]["message"]["content"] == '{"n": 1}' and r["choices"][0]["finish_reason"] == "stop"


def test_request_suite_for_gpt_oss_harmony(start_sim):
    base = start_sim("--enable-auto-tool-choice", "--tool-call-parser", "openai", "--reasoning-parser", "openai_gptoss")
    assert run_suite(base + "/v1", MODEL) == expected_shape(reasoning=True)


def test_sim_refuses_a_parser_whose_markup_it_cannot_write(spawn):
    serve = [sys.executable, "-m", "vllm_sim", "serve", MODEL, "--port", str(free_port()), "--enable-auto-tool-choice"]
    proc = spawn([*serve, "--tool-call-parser", "mistral"], name="bad")
    assert proc.p.wait(60) == 1
    assert "vllm-sim writes tool calls only for --tool-call-parser" in proc.output()
    proc = spawn(serve, name="bad")
    assert proc.p.wait(60) == 1
    assert "--enable-auto-tool-choice requires --tool-call-parser" in proc.output()
