#!/usr/bin/env python3
"""Write a tiny llama-architecture GGUF model with random weights, for the real llama-server in the lab.

A few hundred KB to a few MB (the default: 2 layers, 128 wide, F32, about 2 MB): llama-server loads it in well
under a second on one core and answers /v1/chat/completions with word salad. Its vocabulary is SentencePiece
style (`tokenizer.ggml.model = llama`): the special tokens, the ChatML markers, `<tool_call>`/`</tool_call>`,
the 256 byte-fallback tokens (so any text tokenizes) and a few hundred plain words; the output layer favours the
words, so the gibberish is readable. Its chat template (`tokenizer.chat_template`, used with `--jinja`) is a
small ChatML template written here that lists the tools and renders tool calls Hermes-style, which lets
llama.cpp's template analysis build a tool-call parser for it.

Deterministic: the same arguments write byte-identical files (a seeded generator, no timestamps).
`--split-max-tensors N` writes a multi-file GGUF (`NAME-00001-of-0000K.gguf`, ...), the layout llama.cpp's
`llama-gguf-split` and the Hub's large quants use; llama-server is given the first file.

Needs the `gguf` package (gguf==0.19.0 is in requirements-test.txt) and numpy.

    python3 scripts/make_tiny_gguf.py --out /tmp/tiny/tiny-llama.gguf
    python3 scripts/make_tiny_gguf.py --out /tmp/tiny/tiny-llama.gguf --split-max-tensors 8
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHAT_TEMPLATE = """\
{%- if messages and messages[0].role == 'system' -%}
{%- set system = messages[0].content -%}
{%- set rest = messages[1:] -%}
{%- else -%}
{%- set system = '' -%}
{%- set rest = messages -%}
{%- endif -%}
{%- if system or tools -%}
<|im_start|>system
{{ system }}
{%- if tools %}
You may call these tools:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Answer a call as <tool_call>{"name": NAME, "arguments": ARGUMENTS}</tool_call>.
{%- endif %}<|im_end|>
{% endif -%}
{%- for message in rest -%}
{%- if message.role == 'assistant' -%}
<|im_start|>assistant
{%- if message.content %}
{{ message.content }}
{%- endif %}
{%- for call in message.tool_calls or [] %}
<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' -%}
<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else -%}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""

# token types of the GGUF vocabulary (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
SPECIALS = [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL), ("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL)]
MARKUP = ["<tool_call>", "</tool_call>", "<tools>", "</tools>", "<tool_response>", "</tool_response>"]
WORDS = (
    "the of and to in is it that for on with as was at by be this from or an are not have but all they one we "
    "you can more when there what out up so about if into time has no just some like other only then over such "
    "new these two may any work first well way even because good each most much where those how model token "
    "spark node cluster memory engine server request answer stream weight layer tensor random tiny lab test "
    "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega red green blue orange purple silver "
    "river mountain forest ocean desert valley island harbor garden bridge tower castle window mirror candle "
    "apple bread cheese honey lemon olive pepper salt sugar tea coffee water stone iron copper gold paper "
    "north south east west morning evening winter summer spring autumn quiet rapid gentle bright distant "
    "calm brave clever eager fierce happy jolly kind lively proud silly witty zealous ancient modern "
    "hello world weather city town road car train plane boat ship star moon sun cloud rain snow wind storm"
).split()


@dataclass(frozen=True)
class Shape:
    n_embd: int = 128
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 256
    n_ctx: int = 2048


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens: list[str] = []
    types: list[int] = []
    for text, kind in SPECIALS:
        tokens.append(text)
        types.append(kind)
    for text in MARKUP:
        tokens.append(text)
        types.append(USER_DEFINED)
    for byte in range(256):
        tokens.append(f"<0x{byte:02X}>")
        types.append(BYTE)
    for word in dict.fromkeys(WORDS):  # unique, in order
        tokens.append("\u2581" + word)
        types.append(NORMAL)
    for punct in [".", ",", "!", "?", ":", "\u2581"]:
        tokens.append(punct)
        types.append(NORMAL)
    # SentencePiece scores: higher is merged first; plain words above single bytes
    scores = [
        0.0 if t in (CONTROL, UNKNOWN, USER_DEFINED) else (-1000.0 if t == BYTE else -float(i))
        for i, t in enumerate(types)
    ]
    return tokens, scores, types


def tensors(shape: Shape, n_vocab: int, types: list[int], seed: int) -> list[tuple[str, np.ndarray]]:
    """The llama architecture's tensors, in the order convert_hf_to_gguf.py writes them (numpy shapes are
    (rows, columns) = (outputs, inputs); GGUF stores the reverse)."""
    rng = np.random.default_rng(seed)
    head_dim = shape.n_embd // shape.n_head

    def rand(*dims: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(dims) * scale).astype(np.float32)

    out: list[tuple[str, np.ndarray]] = [("token_embd.weight", rand(n_vocab, shape.n_embd, scale=0.5))]
    for i in range(shape.n_layer):
        w = 1.0 / np.sqrt(shape.n_embd)
        out += [
            (f"blk.{i}.attn_norm.weight", np.ones(shape.n_embd, dtype=np.float32)),
            (f"blk.{i}.attn_q.weight", rand(shape.n_head * head_dim, shape.n_embd, scale=w)),
            (f"blk.{i}.attn_k.weight", rand(shape.n_head_kv * head_dim, shape.n_embd, scale=w)),
            (f"blk.{i}.attn_v.weight", rand(shape.n_head_kv * head_dim, shape.n_embd, scale=w)),
            (f"blk.{i}.attn_output.weight", rand(shape.n_embd, shape.n_head * head_dim, scale=w)),
            (f"blk.{i}.ffn_norm.weight", np.ones(shape.n_embd, dtype=np.float32)),
            (f"blk.{i}.ffn_gate.weight", rand(shape.n_ff, shape.n_embd, scale=w)),
            (f"blk.{i}.ffn_up.weight", rand(shape.n_ff, shape.n_embd, scale=w)),
            (f"blk.{i}.ffn_down.weight", rand(shape.n_embd, shape.n_ff, scale=1.0 / np.sqrt(shape.n_ff))),
        ]
    output = rand(n_vocab, shape.n_embd, scale=1.0)
    # Only words, punctuation and the end of turn are ever likely: bytes and markup get no logit of their own.
    for token_id, kind in enumerate(types):
        if kind != NORMAL:
            output[token_id] = 0.0
    out += [("output_norm.weight", np.ones(shape.n_embd, dtype=np.float32)), ("output.weight", output)]
    return out


def write(
    path: Path, shape: Shape = Shape(), seed: int = 0, split_max_tensors: int = 0, name: str = "tiny-llama"
) -> list[Path]:
    """Write the model; returns the files written (one, or the shards of a split GGUF, first first)."""
    import gguf

    tokens, scores, types = vocabulary()
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    writer.add_name(name)
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.n_embd // shape.n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(tokens.index("<s>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_unk_token_id(tokens.index("<unk>"))
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(False)  # else "<|im_start|>assistant" becomes "<|im_start|> assistant": grammars fail
    writer.add_chat_template(CHAT_TEMPLATE)
    for tensor_name, data in tensors(shape, len(tokens), types, seed):
        writer.add_tensor(tensor_name, data)
    files = writer.format_shard_names(path)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, required=True, help="the .gguf to write (a split writes NAME-0000i-of-0000K.gguf)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=Shape.n_layer)
    ap.add_argument("--width", type=int, default=Shape.n_embd, help="embedding width (a multiple of 4 heads)")
    ap.add_argument("--split-max-tensors", type=int, default=0, help="write a multi-file GGUF, N tensors a file")
    args = ap.parse_args(argv)
    if args.width % Shape.n_head or args.layers < 1:
        print(f"--width must be a multiple of {Shape.n_head} and --layers at least 1", file=sys.stderr)
        return 2
    shape = Shape(n_embd=args.width, n_layer=args.layers, n_ff=2 * args.width)
    for f in write(args.out, shape, args.seed, args.split_max_tensors):
        print(f"wrote {f} ({f.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
