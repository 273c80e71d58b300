"""SIMULATED speculative decoding: `--speculative-config` accepted, a draft's acceptance modelled from the prompt's
content, vLLM 0.32's `vllm:spec_decode_*` counters kept (docs/calibration.md, "Speculative decoding").

No draft runs. Each request gets an acceptance probability p from its prompt: the share r of its token trigrams
that already occurred earlier in the prompt (repetitive code: high; prose: low), then p = BASE + GAIN x r for the
method (an n-gram drafter can only copy what the prompt repeats; a trained draft, EAGLE3, MTP, a draft model,
also predicts prose). Draft position i (1..k) is accepted when every earlier one was: probability p^i, so a step
of one sequence yields 1 + sum(p^i) tokens on average (the accepted drafts plus the target's own token). An
n-gram drafter proposes only when the prompt's last tokens match earlier ones: a sequence is drafted for (and
verified beside) in a share r of its steps, so on prose it costs, and gains, almost nothing.

The step: the target verifies k + 1 tokens per decoding sequence (what the timing model charges: more compute,
more experts routed), plus the drafts' own cost (DRAFT_COST of a plain step per drafted token for a model draft,
nothing for n-gram lookup), and the step's time is spread over the tokens it yields. The simulator still hands out
one token per sequence per step: the time per token is what changes. Mixed steps (prefill chunks beside decodes)
run unspeculated: a conservative simplification.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# (BASE, GAIN) of p = BASE + GAIN x r per method family, and a model draft's cost per drafted token as a share of
# one plain decode step. SIMULATED figures, chosen for the shape (n-gram: 0.05 on prose to 0.85 on code;
# a trained draft: 0.55 to 0.85), not measured on a GB10.
NGRAM = (0.05, 0.80)
TRAINED = (0.55, 0.30)
DRAFT_COST = 0.04
NGRAM_METHODS = ("ngram", "ngram_gpu", "suffix")
N = 3  # trigram repetition


def repetition(tokens: list[int], n: int = N) -> float:
    """The share of the prompt's n-grams (after the first) that already occurred earlier in it."""
    if len(tokens) <= n:
        return 0.0
    seen: set[tuple[int, ...]] = set()
    repeats = 0
    total = 0
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i : i + n])
        total += 1
        if gram in seen:
            repeats += 1
        seen.add(gram)
    return repeats / total if total else 0.0


@dataclass
class Speculation:
    """The engine's speculative config and counters (vLLM's SpecDecodingProm names)."""

    method: str
    k: int
    acceptance: dict[str, float] = field(default_factory=dict)  # request id -> p
    proposing: dict[str, float] = field(default_factory=dict)  # request id -> share of steps with a draft
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: list[float] = field(default_factory=list)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Speculation | None:
        if not config:
            return None
        ngram = config.get("model") in ("ngram", "[ngram]")
        method = str(config.get("method") or ("ngram" if ngram else "draft_model"))
        k = int(config.get("num_speculative_tokens") or 1)
        if k < 1:
            raise ValueError(f"num_speculative_tokens must be greater than zero ({k})")
        return cls(method, k, per_pos=[0.0] * k)

    @property
    def model_draft(self) -> bool:
        return self.method not in NGRAM_METHODS

    def add(self, request_id: str, prompt_token_ids: list[int]) -> None:
        base, gain = NGRAM if not self.model_draft else TRAINED
        r = repetition(prompt_token_ids)
        self.acceptance[request_id] = min(0.95, base + gain * r)
        self.proposing[request_id] = 1.0 if self.model_draft else r

    def drop(self, request_id: str) -> None:
        self.acceptance.pop(request_id, None)
        self.proposing.pop(request_id, None)

    def expected(self, p: float) -> list[float]:
        """The probability that each draft position is accepted."""
        return [p ** (i + 1) for i in range(self.k)]

    def verify_tokens(self, request_ids: list[str]) -> int:
        """The drafted tokens the target verifies beside these decodes in one step (expected, rounded)."""
        return round(self.k * sum(self.proposing.get(rid, 0.0) for rid in request_ids))

    def step(self, request_ids: list[str]) -> float:
        """Count one verify step of these decoding sequences; return the mean tokens a sequence gets from it."""
        if not request_ids:
            return 1.0
        gained = 0.0
        for rid in request_ids:
            share = self.proposing.get(rid, 0.0)  # expected drafts: counted as vLLM counts them, fractional here
            pos = [share * v for v in self.expected(self.acceptance.get(rid, 0.0))]
            self.drafts += share
            self.draft_tokens += self.k * share
            self.accepted += sum(pos)
            for i, v in enumerate(pos):
                self.per_pos[i] += v
            gained += 1.0 + sum(pos)
        return gained / len(request_ids)

    def draft_seconds(self, plain_step_s: float) -> float:
        return self.k * DRAFT_COST * plain_step_s if self.model_draft else 0.0

    def counters(self) -> dict[str, Any]:
        """For /metrics (sparklaunch's metrics.render)."""
        return {
            "num_drafts": self.drafts,
            "num_draft_tokens": self.draft_tokens,
            "num_accepted_tokens": self.accepted,
            "num_accepted_tokens_per_pos": list(self.per_pos),
        }
