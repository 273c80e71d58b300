"""The text formats of the tool-call and reasoning parsers the shipped recipes name, written and read.

A real model writes its tool calls and its reasoning as text in its own markup, and vLLM's parser
(`--tool-call-parser`, `--reasoning-parser`) turns that text into `tool_calls` and `reasoning`. The sim
writes the same markup, so the parsing in front of it is really exercised, and reads it back with the
small parsers below (the sim's stand-in for vLLM's; the markup was read from vLLM 0.32's
vllm/parser/qwen3.py, glm47_moe.py and tool_parsers/hermes_tool_parser.py):

| parser | a tool call |
|---|---|
| qwen3_coder, qwen3_xml | `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>` |
| glm47, glm45 | `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>` |
| hermes | `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>` |

| minimax_m2 | `<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="KEY">VALUE</parameter>\n</invoke>\n</minimax:tool_call>` |
| llama3_json | `<|python_tag|>{"name": NAME, "parameters": {...}}` to the end of the turn (vLLM's llama3_json parser takes the JSON with or without the tag) |
| openai (gpt-oss, harmony) | `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>` |
| deepseek_v4 (DSML) | `<|DSML|tool_calls>\n<|DSML|invoke name="NAME">\n<|DSML|parameter name="KEY" string="true">VALUE</|DSML|parameter>\n</|DSML|invoke>\n</|DSML|tool_calls>` (`|` around DSML is the fullwidth bar U+FF5C; string="false": a JSON value) |
| gemma4 | `<|tool_call>call:NAME{key:<|"|>VALUE<|"|>,num:42}<tool_call|>` (strings between `<|"|>`, other values bare) |

Reasoning parsers glm45, glm47, qwen3, deepseek_r1, deepseek_v4 (vllm/parser/deepseek_v4.py), nemotron_v3 (vLLM 0.32's vllm/parser/nemotron_v3.py: "the
same tool call and reasoning format as Qwen3") and minimax_m2 (reasoning/minimax_m2_reasoning_parser.py): the chat template opens `<think>` in the generation
prompt, so the model's output is `REASONING</think>CONTENT` (a leading `<think>` is tolerated).
Parameter values that are not strings are written as JSON and read back by the tool's schema type.

gpt-oss speaks OpenAI's harmony format (https://cookbook.openai.com/articles/openai-harmony; vLLM 0.32's
tool_parsers/openai_tool_parser.py and reasoning/gptoss_reasoning_parser.py, `--tool-call-parser openai
--reasoning-parser openai_gptoss`): the generation prompt ends with `<|start|>assistant`, the model writes
`<|channel|>analysis<|message|>REASONING<|end|>`, then either a call on the commentary channel (above) or
`<|start|>assistant<|channel|>final<|message|>CONTENT`. Harmony is one family: the openai tool parser
goes with the openai_gptoss reasoning parser (and alone).

Gemma 4 (vLLM's vllm/parser/gemma4.py, `--tool-call-parser gemma4 --reasoning-parser gemma4`) is a family of its
own too: the model opens its reasoning itself, `<|channel>thought\nREASONING<channel|>`, then the content or a
`<|tool_call>` block; the parser drops the `thought\n` label. SIMULATED: vLLM's Gemma 4 template thinks only when
the request passes chat_template_kwargs enable_thinking true; the sim reasons whenever the reasoning parser is
set and thinking is not turned off, as for the other families (its parser reads either).
"""  # noqa: E501 - a markdown table row

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_START, TOOL_END = "<tool_call>", "</tool_call>"
THINK_START, THINK_END = "<think>", "</think>"

TOOL_FORMATS = {
    "qwen3_coder": "qwen3_xml",
    "qwen3_xml": "qwen3_xml",
    "glm47": "glm",
    "glm45": "glm",
    "hermes": "hermes",
    "openai": "harmony",
    "minimax_m2": "minimax",
    "llama3_json": "llama3_json",
    "deepseek_v4": "dsml",
    "gemma4": "gemma4",
}
REASONING_FORMATS = {
    "glm45",
    "glm47",
    "qwen3",
    "deepseek_r1",
    "deepseek_v4",
    "nemotron_v3",
    "minimax_m2",
    "openai_gptoss",
    "gemma4",
}
HARMONY_REASONING = "openai_gptoss"
GEMMA4_REASONING = "gemma4"


@dataclass(frozen=True)
class Markup:
    """The markers of one markup family around reasoning, a tool call and the content."""

    reasoning_start: str  # tolerated at the very start of the reasoning
    reasoning_end: str
    tool_start: str
    tool_end: str
    content_start: str = ""  # dropped where it opens the content (harmony's final channel header)
    reasoning_prefix: str = ""  # what the model writes before its reasoning (<think> is in the prompt already)


THINK = Markup(THINK_START, THINK_END, TOOL_START, TOOL_END)
HARMONY = Markup(
    "<|channel|>analysis<|message|>",
    "<|end|>",
    "<|start|>assistant<|channel|>commentary to=functions.",
    "<|call|>",
    "<|start|>assistant<|channel|>final<|message|>",
    "<|channel|>analysis<|message|>",
)


MINIMAX = Markup(THINK_START, THINK_END, "<minimax:tool_call>", "</minimax:tool_call>")
LLAMA3_JSON = Markup(THINK_START, THINK_END, "<|python_tag|>", "")  # no end tag: the call is the rest of the turn
DSML_TAG = "｜DSML｜"  # noqa: RUF001 - DeepSeek's markup uses the fullwidth bar (U+FF5C)
DSML = Markup(THINK_START, THINK_END, f"<{DSML_TAG}tool_calls>", f"</{DSML_TAG}tool_calls>")
GEMMA4 = Markup(
    "<|channel>thought\n",
    "<channel|>",
    "<|tool_call>",
    "<tool_call|>",
    reasoning_prefix="<|channel>thought\n",  # the model opens its reasoning channel itself
)
GEMMA4_STRING = '<|"|>'


def markup(tool_parser: str | None, reasoning_parser: str | None = None) -> Markup:
    kind = TOOL_FORMATS.get(tool_parser or "")
    if kind == "harmony" or reasoning_parser == HARMONY_REASONING:
        return HARMONY
    if kind == "gemma4" or reasoning_parser == GEMMA4_REASONING:
        return GEMMA4
    return {"minimax": MINIMAX, "llama3_json": LLAMA3_JSON, "dsml": DSML}.get(kind or "", THINK)


class UnsupportedFormat(ValueError):
    """A parser name the sim cannot write for (start-up refuses it: the test would prove nothing)."""


def check_parsers(tool_parser: str | None, reasoning_parser: str | None) -> None:
    if tool_parser and tool_parser not in TOOL_FORMATS:
        raise UnsupportedFormat(
            f"vllm-sim writes tool calls only for --tool-call-parser "
            f"{', '.join(sorted(TOOL_FORMATS))}; got {tool_parser!r}"
        )
    if reasoning_parser and reasoning_parser not in REASONING_FORMATS:
        raise UnsupportedFormat(
            f"vllm-sim writes reasoning only for --reasoning-parser "
            f"{', '.join(sorted(REASONING_FORMATS))}; got {reasoning_parser!r}"
        )
    apart = markup(tool_parser).reasoning_end != markup(None, reasoning_parser).reasoning_end
    if tool_parser and reasoning_parser and apart:
        raise UnsupportedFormat(
            f"--tool-call-parser {tool_parser} and --reasoning-parser {reasoning_parser} read different markups "
            "(harmony, gemma4 and <think>/<tool_call> are apart): no model writes both"
        )


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _gemma4_value(value: Any) -> str:
    """Gemma 4's argument syntax: strings between <|"|>, keys bare, objects and lists nested, the rest JSON."""
    if isinstance(value, str):
        return f"{GEMMA4_STRING}{value}{GEMMA4_STRING}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_gemma4_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_gemma4_value(v) for v in value) + "]"
    return json.dumps(value)


def write_tool_call(parser: str, name: str, arguments: dict[str, Any]) -> str:
    kind = TOOL_FORMATS[parser]
    if kind == "dsml":
        params = "".join(
            f'<{DSML_TAG}parameter name="{k}" string="{str(isinstance(v, str)).lower()}">{_value_text(v)}'
            f"</{DSML_TAG}parameter>\n"
            for k, v in arguments.items()
        )
        return f'{DSML.tool_start}\n<{DSML_TAG}invoke name="{name}">\n{params}</{DSML_TAG}invoke>\n{DSML.tool_end}'
    if kind == "gemma4":
        return f"{GEMMA4.tool_start}call:{name}{_gemma4_value(arguments)}{GEMMA4.tool_end}"
    if kind == "qwen3_xml":
        params = "".join(f"<parameter={k}>\n{_value_text(v)}\n</parameter>\n" for k, v in arguments.items())
        return f"{TOOL_START}\n<function={name}>\n{params}</function>\n{TOOL_END}"
    if kind == "glm":
        params = "".join(f"<arg_key>{k}</arg_key><arg_value>{_value_text(v)}</arg_value>" for k, v in arguments.items())
        return f"{TOOL_START}{name}{params}{TOOL_END}"
    if kind == "minimax":
        params = "".join(f'<parameter name="{k}">{_value_text(v)}</parameter>\n' for k, v in arguments.items())
        return f'{MINIMAX.tool_start}\n<invoke name="{name}">\n{params}</invoke>\n{MINIMAX.tool_end}'
    if kind == "llama3_json":
        return LLAMA3_JSON.tool_start + json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
    if kind == "harmony":
        args = json.dumps(arguments, ensure_ascii=False)
        return f"{HARMONY.tool_start}{name} <|constrain|>json<|message|>{args}{HARMONY.tool_end}"
    return f"{TOOL_START}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{TOOL_END}"


def _typed(value: str, schema: dict[str, Any] | None) -> Any:
    kind = (schema or {}).get("type")
    if kind in (None, "string") or isinstance(kind, list):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


_QWEN_FUNC = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.S)
_QWEN_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)
_MINIMAX_INVOKE = re.compile(r'<invoke name="([^"]+)">(.*?)(?:</invoke>|$)', re.S)
_MINIMAX_PARAM = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)
_DSML_INVOKE = re.compile(rf'<{DSML_TAG}invoke name="([^"]+)">(.*?)(?:</{DSML_TAG}invoke>|$)', re.S)
_DSML_PARAM = re.compile(
    rf'<{DSML_TAG}parameter name="([^"]+)" string="(true|false)">(.*?)</{DSML_TAG}parameter>', re.S
)


def _dsml_value(is_string: str, text: str) -> Any:
    if is_string == "true":
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class _Gemma4Args:
    """Reads Gemma 4's argument syntax back (the inverse of _gemma4_value; vLLM's _parse_gemma4_args reads
    the same text)."""

    def __init__(self, text: str):
        self.text, self.i = text, 0

    def _skip(self) -> None:
        while self.i < len(self.text) and self.text[self.i] in " ,\n\t":
            self.i += 1

    def value(self) -> Any:
        self._skip()
        t = self.text
        if t.startswith(GEMMA4_STRING, self.i):
            start = self.i + len(GEMMA4_STRING)
            end = t.find(GEMMA4_STRING, start)
            end = len(t) if end < 0 else end
            self.i = end + len(GEMMA4_STRING)
            return t[start:end]
        if t.startswith("{", self.i):
            self.i += 1
            out: dict[str, Any] = {}
            while True:
                self._skip()
                if self.i >= len(t) or t[self.i] == "}":
                    self.i += 1
                    return out
                colon = t.find(":", self.i)
                if colon < 0:
                    self.i = len(t)
                    return out
                key = t[self.i : colon].strip()
                self.i = colon + 1
                out[key] = self.value()
        if t.startswith("[", self.i):
            self.i += 1
            items: list[Any] = []
            while True:
                self._skip()
                if self.i >= len(t) or t[self.i] == "]":
                    self.i += 1
                    return items
                items.append(self.value())
        start = self.i
        while self.i < len(t) and t[self.i] not in ",}]":
            self.i += 1
        raw = t[start : self.i].strip()
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw


def read_tool_call(parser: str, block: str, tools: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """One `<tool_call>...</tool_call>` body -> (name, arguments), or None when it is not a call."""
    kind = TOOL_FORMATS[parser]
    if kind == "dsml":
        m = _DSML_INVOKE.search(block)
        if not m:
            return None
        return m.group(1).strip(), {k: _dsml_value(s, v) for k, s, v in _DSML_PARAM.findall(m.group(2))}
    if kind == "gemma4":
        head, brace, body = block.strip().partition("{")
        name = head.removeprefix("call:").strip()
        if not name or not brace:
            return None
        args = _Gemma4Args("{" + body).value()
        return (name, args) if isinstance(args, dict) else None
    if kind == "harmony":
        head, sep, body = block.partition("<|message|>")
        name = head.split()[0] if head.split() else ""
        try:
            args = json.loads(body) if sep else None
        except json.JSONDecodeError:
            return None
        return (name, args) if name and isinstance(args, dict) else None
    if kind == "minimax":
        m = _MINIMAX_INVOKE.search(block)
        if not m:
            return None
        name, body = m.group(1).strip(), m.group(2)
        props = ((tools.get(name) or {}).get("parameters") or {}).get("properties") or {}
        return name, {k.strip(): _typed(v.strip(), props.get(k.strip())) for k, v in _MINIMAX_PARAM.findall(body)}
    if kind in ("hermes", "llama3_json"):
        try:
            data = json.loads(block)
        except json.JSONDecodeError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return None
        return data["name"], dict(data.get("arguments") or data.get("parameters") or {})
    if kind == "qwen3_xml":
        m = _QWEN_FUNC.search(block)
        if not m:
            return None
        name, body = m.group(1).strip(), m.group(2)
        pairs = _QWEN_PARAM.findall(body)
    else:
        name, _, body = block.partition("<arg_key>")
        name, body = name.strip(), ("<arg_key>" + body if body else "")
        pairs = _GLM_ARG.findall(body)
    props = ((tools.get(name) or {}).get("parameters") or {}).get("properties") or {}
    return name, {k.strip(): _typed(v, props.get(k.strip())) for k, v in pairs}


@dataclass
class Parsed:
    """What one step of parsing found: text for `reasoning`, text for `content`, complete tool calls."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


class StreamParser:
    """Reads a model's output as it arrives: reasoning until its end marker (`</think>`, harmony's `<|end|>`),
    then content, with tool-call blocks taken out of the content. Text that may be the start of a marker is
    held back until the next piece tells (as vLLM's streaming parsers do), so markup never leaks into
    `content`."""

    def __init__(
        self,
        tool_parser: str | None,
        reasoning: bool,
        tools: dict[str, dict[str, Any]],
        reasoning_parser: str | None = None,
    ):
        self.tool_parser, self.tools = tool_parser, tools
        self.m = markup(tool_parser, reasoning_parser)
        self.state = "reasoning" if reasoning else "content"
        self.buf = ""
        self._reasoning_started = False

    def _markers(self) -> tuple[str, ...]:
        if self.state == "reasoning":
            return (self.m.reasoning_end,)
        if self.state == "content":
            found = (self.m.tool_start,) if self.tool_parser else ()
            return found + ((self.m.content_start,) if self.m.content_start else ())
        return (self.m.tool_end,) if self.m.tool_end else ()  # no end tag: the call ends with the output

    def feed(self, text: str, final: bool = False) -> Parsed:
        out = Parsed()
        self.buf += text
        while True:
            markers = self._markers()
            hit = min(((self.buf.find(m), m) for m in markers if m in self.buf), default=None)
            if hit is None:
                if not final and self._opening_reasoning():
                    return out  # maybe the start of the reasoning header (harmony's, Gemma 4's): wait to drop it
                keep = 0 if final else max((_partial_suffix(self.buf, m) for m in markers), default=0)
                if self.state == "tool":
                    if final and self.buf and not self.m.tool_end:  # a call that runs to the end of the output
                        call = read_tool_call(self.tool_parser or "", self.buf.strip(), self.tools)
                        if call is None:
                            out.content += self.m.tool_start + self.buf
                        else:
                            out.tool_calls.append(call)
                        self.buf = ""
                        return out
                    if final and self.buf:  # an unterminated call (cut by max_tokens): vLLM keeps it as text
                        out.content += self.m.tool_start + self.buf
                        self.buf = ""
                    return out
                emit, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep :]
                self._emit(out, emit)
                return out
            pos, marker = hit
            before, self.buf = self.buf[:pos], self.buf[pos + len(marker) :]
            if self.state == "tool":
                call = read_tool_call(self.tool_parser or "", before.strip(), self.tools)
                if call is None:
                    out.content += self.m.tool_start + before + self.m.tool_end
                else:
                    out.tool_calls.append(call)
                self.state = "content"
            elif self.state == "content" and marker == self.m.content_start:
                self._emit(out, before)  # the final channel's header: dropped, the content goes on
            else:
                self._emit(out, before)
                self.state = "content" if self.state == "reasoning" else "tool"

    def _opening_reasoning(self) -> bool:
        """Nothing of the reasoning out yet and the buffer is the start of its header: vLLM's parsers drop
        the whole header, so no piece of it may reach `reasoning` (a stream cuts it anywhere)."""
        start = self.m.reasoning_start
        head = self.buf.lstrip()
        return self.state == "reasoning" and not self._reasoning_started and bool(start) and start.startswith(head)

    def _emit(self, out: Parsed, text: str) -> None:
        if self.state == "reasoning":
            start = self.m.reasoning_start
            if not self._reasoning_started and text.lstrip().startswith(start):
                text = text.lstrip()[len(start) :]
            self._reasoning_started = self._reasoning_started or bool(text)
            out.reasoning += text
        else:
            out.content += text


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
