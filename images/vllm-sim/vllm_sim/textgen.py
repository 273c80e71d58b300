"""What the simulated model "generates": a fixed phrase that says it comes from a simulator.

Every output starts with "[simulated by vllm-sim]" and cycles through the phrase, so nobody can mistake
the lab's answers for a model's. Each word is one token of the sim tokenizer, so re-tokenizing the
output gives exactly the completion_tokens the sim reports.
"""

from __future__ import annotations

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
