"""Continuous batching as vLLM V1 schedules it, reduced to token counts.

Each step has a token budget (`max_num_batched_tokens`). Running sequences go first (a decode costs
one token, an unfinished prefill its next chunk), then waiting ones are admitted in arrival order while
budget, `max_num_seqs` and KV blocks last; a prompt larger than the remaining budget is chunked (or
waits, with chunked prefill off). When KV blocks run out mid-decode the newest running sequence is
preempted and later recomputed, as vLLM does. Past the budget, prefills queue for later steps: this is
the seeds' c64 collapse mechanism (32768 / 1024 = 32 prefills a step).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from .timing import StepShape

BLOCK_SIZE = 16


@dataclass(eq=False)  # identity, not field equality: two sequences can look alike
class Seq:
    request_id: str
    prompt_len: int
    computed: int = 0  # tokens whose KV exists (prompt, then prompt + generated)
    generated: int = 0
    blocks: int = 0
    order: int = 0  # arrival order, for FCFS and preemption


@dataclass
class Scheduled:
    seq: Seq
    tokens: int
    samples: bool  # this step produces a token for the sequence


@dataclass
class Batch:
    items: list[Scheduled] = field(default_factory=list)
    shape: StepShape = field(default_factory=StepShape)


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_blocks: int
    chunked_prefill: bool = True


class Scheduler:
    def __init__(self, limits: SchedulerLimits):
        self.limits = limits
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.free_blocks = limits.kv_blocks
        self.preemptions = 0
        self._order = 0

    # -- requests -----------------------------------------------------------------------------
    def add(self, seq: Seq) -> None:
        seq.order = self._order
        self._order += 1
        self.waiting.append(seq)

    def abort(self, request_id: str) -> bool:
        for seq in list(self.waiting):
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                return True
        for seq in self.running:
            if seq.request_id == request_id:
                self._free(seq)
                self.running.remove(seq)
                return True
        return False

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def kv_usage(self) -> float:
        total = self.limits.kv_blocks
        return 0.0 if total <= 0 else (total - self.free_blocks) / total

    # -- one step -----------------------------------------------------------------------------
    def schedule(self) -> Batch:
        budget = self.limits.max_num_batched_tokens
        items: list[Scheduled] = []
        preempted = False

        for seq in list(self.running):
            if budget <= 0:
                break
            if seq not in self.running:  # preempted below while making room
                continue
            need = self._next_tokens(seq, budget)
            while not self._grow(seq, seq.computed + need):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq not in self.running:
                continue
            items.append(Scheduled(seq, need, self._completes(seq, need)))
            budget -= need

        while self.waiting and budget > 0 and not preempted and len(self.running) < self.limits.max_num_seqs:
            seq = self.waiting[0]
            remaining = seq.prompt_len - seq.computed
            if remaining > budget and not self.limits.chunked_prefill:
                break
            need = min(remaining, budget)
            if not self._grow(seq, seq.computed + need):
                break
            self.waiting.popleft()
            self.running.append(seq)
            items.append(Scheduled(seq, need, self._completes(seq, need)))
            budget -= need

        return Batch(items, self._shape(items))

    def complete(self, batch: Batch) -> list[Seq]:
        """Apply a finished step; returns the sequences that got a new token."""
        sampled: list[Seq] = []
        for item in batch.items:
            seq = item.seq
            if seq not in self.running:
                continue
            seq.computed += item.tokens
            if item.samples:
                seq.generated += 1
                sampled.append(seq)
        return sampled

    def finish(self, seq: Seq) -> None:
        if seq in self.running:
            self.running.remove(seq)
        self._free(seq)

    # -- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _next_tokens(seq: Seq, budget: int) -> int:
        if seq.generated == 0 and seq.computed < seq.prompt_len:
            return min(seq.prompt_len - seq.computed, budget)
        return 1

    @staticmethod
    def _completes(seq: Seq, tokens: int) -> bool:
        return seq.generated > 0 or seq.computed + tokens >= seq.prompt_len

    def _grow(self, seq: Seq, tokens: int) -> bool:
        need = math.ceil(tokens / BLOCK_SIZE) - seq.blocks
        if need <= 0:
            return True
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        seq.blocks += need
        return True

    def _free(self, seq: Seq) -> None:
        self.free_blocks += seq.blocks
        seq.blocks = 0

    def _preempt(self, seq: Seq) -> None:
        """Recompute preemption: drop the KV, keep what was generated, requeue first."""
        self.running.remove(seq)
        self._free(seq)
        seq.prompt_len += seq.generated  # the generated tokens are re-prefilled with the prompt
        seq.generated = 0
        seq.computed = 0
        self.waiting.appendleft(seq)
        self.preemptions += 1

    @staticmethod
    def _shape(items: list[Scheduled]) -> StepShape:
        decode_seqs = decode_ctx = prefill = 0
        attention = 0.0
        for it in items:
            seq = it.seq
            if seq.generated > 0:
                decode_seqs += 1
                decode_ctx += seq.computed + 1
            else:
                prefill += it.tokens
                attention += it.tokens * (seq.computed + it.tokens / 2.0)
        return StepShape(decode_seqs, decode_ctx, prefill, attention, len(items))
