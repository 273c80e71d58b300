"""The shipped tokenizer and corpus: loadable offline the way llama-benchy loads them, exact round trips."""

from __future__ import annotations

import random

from vllm_sim.textgen import PHRASE, TextGen
from vllm_sim.tokenizer import CORPUS_FILE, TOKENIZER_DIR, SimTokenizer


def test_llama_benchy_loads_the_tokenizer_offline():
    from llama_benchy.corpus import LightweightTokenizer
    from transformers import AutoTokenizer

    light = LightweightTokenizer.from_pretrained(str(TOKENIZER_DIR))
    auto = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    text = "Some open chair lifts every season ."
    assert light.encode(text) == auto.encode(text, add_special_tokens=False) == SimTokenizer().encode(text)


def test_corpus_slices_reencode_to_the_same_count():
    """llama-benchy decodes a random token slice to text; the sim must count that text as the same size."""
    tok = SimTokenizer()
    ids = tok.encode(CORPUS_FILE.read_text(encoding="utf-8"))
    assert len(ids) > 50000
    assert tok.token_id("<unk>") not in ids
    rng = random.Random(1)
    for size in (1, 17, 1024, 4096):
        start = rng.randrange(0, len(ids) - size)
        text = tok.decode(ids[start : start + size])
        assert len(tok.encode(text)) == size


def test_chat_template_matches_the_jinja_one_transformers_uses():
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    messages = [{"role": "system", "content": "the river"}, {"role": "user", "content": "a tower ."}]
    assert SimTokenizer.render_chat(messages) == auto.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


def test_generated_text_says_simulated_and_counts_exactly():
    tok = SimTokenizer()
    gen = TextGen(tok)
    tokens = [gen.token(i) for i in range(40)]
    text = "".join(t for _, t in tokens)
    assert text.startswith("[simulated by vllm-sim]")
    assert tok.encode(text) == [i for i, _ in tokens]
    assert text.count("[simulated") == 40 // len(PHRASE) + (1 if 40 % len(PHRASE) else 0)
