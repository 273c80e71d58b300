"""The simulated engine behind sparklaunch's driver: a step blocks for its simulated duration.

Steps are paced on a continuous timeline: while the engine stays busy, each step ends at the previous
step's end + its duration (x VLLM_SIM_TIME_SCALE), whatever the host spent between steps (HTTP,
collectives, a CPU shared with other work). A late step is followed by shorter sleeps until the
timeline is caught up, so tokens/s stay right on a loaded machine as long as the host keeps up on
average; after more than MAX_CATCH_UP_S behind, or when the engine was idle, the timeline restarts at now.
VLLM_SIM_TIME_SCALE < 1 runs faster than real time (tests). VLLM_SIM_TRACE=FILE appends one JSON line
per step (wall time, requests added, batch shape, simulated seconds) for calibration work.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from sparklaunch.protocol import Delta, EngineStats, GenRequest

from .chat_frontend import SimChatFrontend
from .config import ConfigError, ServeConfig
from .engine import SimEngine
from .formats import UnsupportedFormat

MAX_CATCH_UP_S = 0.5


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
        try:  # tools, reasoning (sparklaunch.chat); a parser whose markup the sim cannot write is refused
            self.chat_frontend = SimChatFrontend(cfg.chat, self.engine.tokenizer)
        except UnsupportedFormat as e:
            raise ConfigError(str(e)) from None
        self._sleep, self._clock = sleep, clock
        self.simulated_seconds = 0.0
        self._deadline: float | None = None  # end of the last step on the timeline; None: idle
        trace = os.environ.get("VLLM_SIM_TRACE")
        self._trace = open(trace, "a", buffering=1) if trace else None
        self._added = 0

    def encode(self, text: str) -> list[int]:
        return self.engine.tokenizer.encode(text)

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        return self.engine.tokenizer.render_chat(messages)

    def add_request(self, req: GenRequest) -> None:
        self.engine.add_request(req)
        self._added += 1

    def abort_request(self, request_id: str) -> None:
        self.engine.abort_request(request_id)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def step(self) -> list[Delta]:
        start = self._clock()
        if self._deadline is None or start - self._deadline > MAX_CATCH_UP_S:
            self._deadline = start
        deltas, seconds = self.engine.step()
        self.simulated_seconds += seconds
        self._deadline += seconds * self.time_scale
        if self._trace is not None:
            shape = self.engine.last_shape
            self._trace.write(
                json.dumps(
                    {
                        "t": round(start, 4),
                        "added": self._added,
                        "decode": shape.decode_seqs,
                        "prefill": shape.prefill_tokens,
                        "s": round(seconds, 5),
                    }
                )
                + "\n"
            )
            self._added = 0
        remaining = self._deadline - self._clock()
        if remaining > 0:
            self._sleep(remaining)
        if not self.engine.has_unfinished():
            self._deadline = None  # idle next: the next request starts a fresh timeline
        return deltas

    def stats(self) -> EngineStats:
        return self.engine.stats()

    @property
    def cache_info(self) -> dict[str, str]:
        """vLLM's `vllm:cache_config_info` labels (sparklaunch's /metrics)."""
        return self.engine.plan.cache_config_info()

    @property
    def memory_plan(self) -> dict[str, int]:
        """The start-up memory plan in bytes (sparklaunch's /metrics, `vllm_sim:memory_plan_bytes`)."""
        return self.engine.plan.memory_plan()

    @property
    def spec_decode(self) -> dict[str, Any] | None:
        """vLLM's `vllm:spec_decode_*` counters (sparklaunch's /metrics); None without speculative decoding."""
        spec = self.engine.speculation
        return None if spec is None else spec.counters()

    def close(self) -> None:
        pass
