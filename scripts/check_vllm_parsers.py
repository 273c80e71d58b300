#!/usr/bin/env python3
"""Prove the torchrun launcher's vLLM path and the lab's simulator agree, with the vLLM that is installed.

Needs a Python with vLLM (the vllm-node image on a Spark, or a throwaway CPU venv: docs/vllm-version.md).
For every tool-call / reasoning parser pair the shipped recipes name, it
1. writes the answer the simulator writes (vllm_sim: reasoning, then a tool call in the parser's markup),
2. parses it with the launcher's vLLM front end (sparklaunch/adapters/vllm_frontend.py: vLLM's own
   ParserManager parser and ChatCompletionRequest), whole and streamed piece by piece,
3. and with the simulator's own parser (what the lab's servers use),
and fails unless all three give the same reasoning, content and tool calls. It also builds vLLM's
SamplingParams for tool_choice required, a named tool and response_format, and checks they survive the
msgspec JSON trip to the other ranks. Exit 0: all agree; 1: a difference (printed).

gpt-oss speaks OpenAI's harmony format: vLLM's serving layer asks ParserManager for the parser with
`is_harmony` when the model's config.json says model_type gpt_oss, and gets its HarmonyParser, which reads the
output's token IDs with the harmony encoding (o200k_harmony, bundled with the openai_harmony package); the
`openai_gptoss` reasoning and `openai` tool parsers alone only mark boundaries. So for those recipes the answer
is tokenized with that encoding and the front end is built as the launcher builds it on a Spark (is_harmony from
the model's model_type), exactly the path `vllm serve` takes.

tests/test_vllm_parsers.py runs this where the CPU venv exists (tests/support/vllm_venv.py).

    VLLM_TARGET_DEVICE=cpu /tmp/vllm032/venv/bin/python scripts/check_vllm_parsers.py        # here
    docker run --rm -v "$PWD:/src" -w /src vllm-node python3 scripts/check_vllm_parsers.py   # on a Spark
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # no accelerator needed: only the serving layer runs
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "images" / "launcher"), str(ROOT / "images" / "vllm-sim"), str(ROOT)]

import yaml  # noqa: E402

from sparklaunch.adapters.vllm_frontend import (  # noqa: E402
    HARMONY_MODEL_TYPE,
    VllmChatFrontend,
    decode_sampling_params,
)
from sparklaunch.chat import ChatFeatures, plan_chat  # noqa: E402
from vllm_sim.chat_frontend import SimChatFrontend  # noqa: E402
from vllm_sim.formats import DSML_TAG  # noqa: E402
from vllm_sim.textgen import script_text  # noqa: E402
from vllm_sim.tokenizer import CORPUS_FILE, SimTokenizer  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}


MARKUP_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<|python_tag|>",  # llama3_json's bot token: its parser refuses a tokenizer without it
    # Gemma 4's channel and tool-call tokens (special tokens in its tokenizer; vLLM's parser matches them by id)
    "<|channel>",
    "<channel|>",
    "<|tool_call>",
    "<tool_call|>",
    '<|"|>',
    # DeepSeek-V4's DSML block tags (the ones vLLM's deepseek_v4 parser matches by token id); its invoke and
    # parameter tags stay text, their fullwidth bars (U+FF5C) split into bytes: see stream_pieces
    f"<{DSML_TAG}tool_calls>",
    f"</{DSML_TAG}tool_calls>",
)
# Tool parsers whose vLLM class skips structured outputs for tool_choice required / named, letting the model
# write its native call syntax (vLLM 0.32's tool_parsers/gemma4_engine_tool_parser.py adjust_request).
NATIVE_REQUIRED = {"gemma4"}


# config.json `model_type` of the shipped recipes' models where it decides the serving path (vLLM: is_harmony):
# https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json and .../gpt-oss-20b/... say "gpt_oss".
MODEL_TYPES = {"openai/gpt-oss-120b": HARMONY_MODEL_TYPE, "openai/gpt-oss-20b": HARMONY_MODEL_TYPE}


class HarmonyTokenizer:
    """gpt-oss's tokenizer as the harmony encoding vLLM's HarmonyParser reads IDs with (get_encoding()): the
    special tokens (<|channel|>, <|message|>, <|call|>, ...) are single IDs, as in the model's own tokenizer."""

    def __init__(self):
        from vllm.entrypoints.openai.parser.harmony_utils import get_encoding

        self.encoding = get_encoding()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.encoding.encode(text, allowed_special="all"))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.encoding.decode(list(ids))


# the end of a rendered prompt, where generation starts: a thinking template opens <think> there
PROMPT = {
    "think": "user: weather?\nassistant: <think>",
    "qwen3_coder": "user: weather?\nassistant:\n",
    "glm47": "user: weather?\nassistant:",
    "hermes": "user: weather?\nassistant:",
    "llama3_json": "user: weather?\nassistant:",
    "gemma4": "user: weather?\nassistant:",  # the model opens its own <|channel> (vLLM's gemma4 parser)
    "harmony": "<|start|>user<|message|>weather?<|end|><|start|>assistant",  # harmony's generation prompt
}


def byte_level_tokenizer():
    """A small byte-level BPE tokenizer with the markup tags as special tokens, like the real Qwen3 and GLM
    ones: vLLM's streaming parsers match those tags by token id and check each id's text against the stream
    (the sim's word-level vocabulary has neither: it would prove nothing here)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=list(MARKUP_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([CORPUS_FILE.read_text(encoding="utf-8")[:200_000]], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, additional_special_tokens=list(MARKUP_TOKENS))


def stream_pieces(tokenizer, ids: list[int]) -> list[str]:
    """Each step's new text, one token a step, as vLLM's incremental detokenizer gives it: a character whose
    UTF-8 bytes are not all in yet is held back (decoding one byte-level token alone would write U+FFFD)."""
    out, done = [], ""
    for n in range(len(ids)):
        text = tokenizer.decode(ids[: n + 1])
        if text.endswith("\ufffd") and n < len(ids) - 1:
            out.append("")
            continue
        out.append(text[len(done) :])
        done = text
    return out


def recipe_parsers() -> list[tuple[str, str | None, str | None, str]]:
    """(recipe, tool parser, reasoning parser, model) of every shipped recipe that names a parser."""
    out = []
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        args = [str(a) for a in (data.get("vllm") or {}).get("extra_args") or []]
        after = {f: args[i + 1] for i, f in enumerate(args[:-1]) if f in ("--tool-call-parser", "--reasoning-parser")}
        if after:
            out.append((path.stem, after.get("--tool-call-parser"), after.get("--reasoning-parser"), data["model"]))
    return out


def joined(deltas: list[dict]) -> dict:
    """A stream's deltas joined as an OpenAI client joins them."""
    reasoning = "".join(d.get("reasoning") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.get("tool_calls") or []:
            slot = calls.setdefault(tc.get("index", 0), {"name": "", "arguments": ""})
            fn = tc.get("function") or {}
            slot["name"] += fn.get("name") or ""
            slot["arguments"] += fn.get("arguments") or ""
    return summary(reasoning, content, [calls[i] for i in sorted(calls)])


def summary(reasoning, content, calls) -> dict:
    return {
        "reasoning": (reasoning or "").strip() or None,
        "content": (content or "").strip() or None,
        "tool_calls": [(c["name"], json.loads(c["arguments"] or "{}")) for c in calls],
    }


def whole(parsed: dict) -> dict:
    return summary(parsed["reasoning"], parsed["content"], [c["function"] for c in parsed["tool_calls"]])


def check_recipe(recipe, tool_parser, reasoning_parser, model, tokenizer, sim_tok, SamplingParams) -> int:
    """The sim against vLLM for one recipe's parser pair: the number of differences."""
    failures = 0
    features = ChatFeatures(bool(tool_parser), tool_parser, reasoning_parser)
    harmony = MODEL_TYPES.get(model) == HARMONY_MODEL_TYPE
    if harmony:
        tokenizer = HarmonyTokenizer()
    real = VllmChatFrontend(features, tokenizer, recipe, is_harmony=harmony)
    sim = SimChatFrontend(features, sim_tok)
    for choice in ("auto", "required"):
        body = {
            "model": recipe,
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [WEATHER],
            "tool_choice": choice,
        }
        plan = plan_chat(body, features)
        text, _ = script_text(sim.intent(plan), tool_parser)
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
        start = "harmony" if harmony else (tool_parser if not reasoning_parser or tool_parser == "gemma4" else "think")
        prompt = tokenizer.encode(PROMPT[start], add_special_tokens=False)
        want = whole(sim.parser(plan).complete(text, []))
        got_whole = whole(real.parser(plan, prompt).complete(text, ids))
        stream = real.parser(plan, prompt)  # one token a step, as the engine streams with --stream-interval 1
        pieces = stream_pieces(tokenizer, ids)
        got_stream = joined([stream.delta(pieces[n], [t], n == len(ids) - 1) for n, t in enumerate(ids)])
        ok = want == got_whole == got_stream
        failures += not ok
        path = "harmony " if harmony else ""
        print(f"{'ok  ' if ok else 'FAIL'} {recipe:<30} {path}{tool_parser}/{reasoning_parser} tool_choice={choice}")
        if not ok:
            print(f"     sim:          {want}\n     vLLM whole:   {got_whole}\n     vLLM stream:  {got_stream}")
    for extra in (
        {"tool_choice": "required", "tools": [WEATHER]},
        {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "tools": [WEATHER]},
        {"response_format": {"type": "json_object"}},
    ):
        body = {"model": recipe, "messages": [{"role": "user", "content": "x"}], **extra}
        plan = plan_chat(body, features)
        intent = real.intent(plan, 64)
        params = decode_sampling_params(intent, SamplingParams)
        constrained = params.structured_outputs is not None
        free = "tool_choice" in extra and (tool_parser is None or tool_parser in NATIVE_REQUIRED)
        ok = params.max_tokens == 64 and (constrained or free)
        failures += not ok
        print(
            f"{'ok  ' if ok else 'FAIL'} {recipe:<30} SamplingParams for {json.dumps(extra)[:60]}: "
            f"structured_outputs={'set' if constrained else None}"
        )
    return failures


def main() -> int:
    import vllm
    from vllm.sampling_params import SamplingParams

    tokenizer = byte_level_tokenizer()
    sim_tok = SimTokenizer()
    failures = 0
    print(f"vLLM {vllm.__version__}")
    for recipe, tool_parser, reasoning_parser, model in recipe_parsers():
        try:
            failures += check_recipe(recipe, tool_parser, reasoning_parser, model, tokenizer, sim_tok, SamplingParams)
        except Exception as e:  # noqa: BLE001 - one recipe's crash in vLLM's parser is reported, the rest still run
            failures += 1
            print(f"FAIL {recipe:<30} {tool_parser}/{reasoning_parser}: {type(e).__name__}: {e}")
    print("all agree" if not failures else f"{failures} difference(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
