"""Engine back ends for the driver.

An adapter owns one engine replica (one per rank) and the front-end helpers rank 0 needs (tokenizing,
chat rendering). `step()` blocks for as long as the engine's step takes: the GPU step for real vLLM,
the simulated duration for vllm_sim. The simulator's adapter lives in vllm_sim.adapter so this
package stays importable in the real vllm-node images.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..protocol import Delta, EngineStats, GenRequest


class EngineAdapter(Protocol):
    served_model_names: list[str]
    model_root: str
    max_model_len: int
    batch_window_s: float  # how long an idle engine waits for simultaneous requests to coalesce
    simulated: bool

    def encode(self, text: str) -> list[int]: ...
    def render_chat(self, messages: list[dict[str, Any]]) -> str: ...
    def add_request(self, req: GenRequest) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def has_unfinished(self) -> bool: ...
    def step(self) -> list[Delta]: ...
    def stats(self) -> EngineStats: ...
    def close(self) -> None: ...
