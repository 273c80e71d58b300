"""What the simulated model "generates": a fixed phrase that says it comes from a simulator, after a
scripted start when the request asked for reasoning, a tool call or JSON (chat_frontend.py decides it).

Every output starts with "[simulated by vllm-sim]" and cycles through the phrase, so nobody can mistake
the lab's answers for a model's. Each word is one token of the sim tokenizer, so re-tokenizing the
output gives exactly the completion_tokens the sim reports.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .formats import markup, write_tool_call
from .tokenizer import SimTokenizer

PHRASE = "[simulated by vllm-sim] no model ran here ; these tokens stand in for generated text .".split()


class TextGen:
    def __init__(self, tokenizer: SimTokenizer):
        self.words = PHRASE
        self.ids = [tokenizer.token_id(w) for w in PHRASE]

    def token(self, index: int) -> tuple[int, str]:
        """Token `index` (0-based) of any output: its id and its text, with the joining space."""
        i = index % len(self.words)
        word = self.words[i]
        return self.ids[i], (word if index == 0 else " " + word)


# A piece of scripted text that the sim emits as one token: a whole tag (`<tool_call>`, `<function=f>`),
# a word with its leading space, one punctuation character, or a run of white space.
PIECE = re.compile(r"\s*<[^<>\s]*>|\s*[\w.\-\[\]]+|\s*[^\w\s]|\s+")


def pieces(text: str) -> list[str]:
    return PIECE.findall(text)


def script_text(intent: dict[str, Any] | None, tool_parser: str | None) -> tuple[str, bool]:
    """The scripted start of an output, and whether the output ends with it (a tool call or a JSON answer
    is the whole turn; otherwise the phrase follows). Reasoning ends with `</think>`: the chat template
    opened it in the generation prompt, as GLM-4.x and Qwen3 templates do."""
    if not intent:
        return "", False
    m = markup(tool_parser, intent.get("reasoning_parser"))
    text = m.reasoning_prefix + intent["reasoning"] + m.reasoning_end if intent.get("reasoning") else ""
    if intent.get("tool_call") and tool_parser:
        call = intent["tool_call"]
        return text + write_tool_call(tool_parser, call["name"], call.get("arguments") or {}), True
    if "json" in intent:
        return text + m.content_start + json.dumps(intent["json"], ensure_ascii=False), True
    return text + (m.content_start if text else ""), False


class Output:
    """One request's output, token by token: the scripted part, then the phrase; stop strings end it."""

    def __init__(
        self,
        gen: TextGen,
        tokenizer: SimTokenizer,
        intent: dict[str, Any] | None,
        tool_parser: str | None,
        stop: list[str] | str | None = None,
        include_stop: bool = False,
    ):
        text, self.ends_with_script = script_text(intent, tool_parser)
        self.script = [(tokenizer.piece_id(p), p) for p in pieces(text)]
        self.gen = gen
        self.stop = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
        self.include_stop = include_stop
        self.text = ""
        self.emitted = 0

    @property
    def script_done(self) -> bool:
        return self.ends_with_script and self.emitted >= len(self.script)

    def next(self) -> tuple[int, str, str | None]:
        """The next token's id and text, and the stop string that ended the output there (or None)."""
        i = self.emitted
        self.emitted += 1
        if i < len(self.script):
            tid, text = self.script[i]
        else:
            tid, text = self.gen.token(i - len(self.script))
            if i == len(self.script) and i > 0:
                text = text.lstrip()
        before = len(self.text)
        self.text += text
        for s in self.stop:
            at = self.text.find(s, max(0, before - len(s) + 1))
            if at >= 0:
                end = at + len(s) if self.include_stop else at
                text = self.text[before:end] if end > before else ""
                self.text = self.text[: max(end, before)]
                return tid, text, s
        return tid, text, None
