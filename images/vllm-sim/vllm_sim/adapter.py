"""The simulated engine behind sparklaunch's driver: a step blocks for its simulated duration.

Sleeping to a deadline (step start + duration x time scale) rather than for the duration keeps the
sim's own bookkeeping inside the simulated time, so a slow host CPU does not stretch steps as long as
it keeps up. VLLM_SIM_TIME_SCALE < 1 runs faster than real time (tests).
"""

from __future__ import annotations

import time
from typing import Any

from sparklaunch.protocol import Delta, EngineStats, GenRequest

from .config import ServeConfig
from .engine import SimEngine


class SimAdapter:
    simulated = True

    def __init__(self, cfg: ServeConfig, engine: SimEngine | None = None, sleep=time.sleep, clock=time.monotonic):
        self.cfg = cfg
        self.engine = engine or SimEngine(cfg)
        self.served_model_names = list(cfg.served_model_names)
        self.model_root = cfg.model
        self.max_model_len = self.engine.max_model_len
        self.batch_window_s = self.engine.hw.fitted.get("batch_window_ms", 0.0) / 1000.0 * cfg.time_scale
        self.time_scale = cfg.time_scale
        self._sleep, self._clock = sleep, clock
        self.simulated_seconds = 0.0

    def encode(self, text: str) -> list[int]:
        return self.engine.tokenizer.encode(text)

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        return self.engine.tokenizer.render_chat(messages)

    def add_request(self, req: GenRequest) -> None:
        self.engine.add_request(req)

    def abort_request(self, request_id: str) -> None:
        self.engine.abort_request(request_id)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def step(self) -> list[Delta]:
        start = self._clock()
        deltas, seconds = self.engine.step()
        self.simulated_seconds += seconds
        remaining = start + seconds * self.time_scale - self._clock()
        if remaining > 0:
            self._sleep(remaining)
        return deltas

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def close(self) -> None:
        pass
