"""What travels between the HTTP front end, the engine loop and the other ranks.

Plain dataclasses with a JSON form: rank 0 broadcasts `StepInput`s to every rank over gloo (seed 004's
control plane, about 1 KB a batch), so everything in them must serialise without pickle (ranks may run
different Python builds on different hosts, and pickle from the network is a code-execution hole).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GenRequest:
    """One generation request, already tokenized by rank 0."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    prompt: str | None = None  # the rendered text (the real vLLM adapter feeds text)
    min_tokens: int = 0
    ignore_eos: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, seed, stop, ...
    eos_at_max: bool = False  # client set no max_tokens: a simulated model ends with EOS ("stop")
    intent: dict[str, Any] | None = None  # a simulated engine's script (sparklaunch.chat); real vLLM ignores it

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass
class StepInput:
    """What rank 0 hands every rank before a step: new requests, aborts, or a shutdown order."""

    new: list[GenRequest] = field(default_factory=list)
    abort: list[str] = field(default_factory=list)
    shutdown: bool = False

    def is_empty(self) -> bool:
        return not (self.new or self.abort or self.shutdown)

    def to_bytes(self) -> bytes:
        return json.dumps(
            {"new": [asdict(r) for r in self.new], "abort": self.abort, "shutdown": self.shutdown},
            separators=(",", ":"),
        ).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> StepInput:
        raw = json.loads(data.decode("utf-8"))
        return cls(
            new=[GenRequest(**r) for r in raw.get("new", [])],
            abort=list(raw.get("abort", [])),
            shutdown=bool(raw.get("shutdown", False)),
        )


@dataclass
class Delta:
    """New output of one request after a step (token ids and their text)."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None  # "length" | "stop" | "abort" | "error"
    prompt_tokens: int = 0
    completion_tokens: int = 0  # cumulative
    error: str | None = None
    stop_reason: str | int | None = None  # the stop string (or token id) that ended the output
    logprobs: list[dict[str, Any]] | None = None  # per token: {token, logprob, top: [[token, logprob], ...]}


@dataclass
class EngineStats:
    """Gauges for /metrics."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0  # 0..1


@dataclass
class ServeOptions:
    """What rank 0's HTTP server needs from the `vllm serve` arguments, whichever engine parsed them."""

    host: str
    port: int
    served_model_names: list[str]
    api_keys: list[str]
    stream_interval: int
    tp: int
    pp: int
