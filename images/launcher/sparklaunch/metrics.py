"""/metrics in Prometheus text format, with vLLM's metric names and labels.

Only the series the project reads (doctor, bench, status, top, Prometheus): queue depths, KV usage, token
and request totals, and the time-to-first-token and end-to-end latency histograms. Names, labels
(model_name, engine) and histogram buckets follow vLLM's PrometheusStatLogger (vllm/v1/metrics/loggers.py:
`vllm:kv_cache_usage_perc`, not the deprecated gpu_cache name); counters are written the way
prometheus_client writes them (TYPE line without `_total`, sample with it).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .protocol import EngineStats

# vLLM's buckets (PrometheusStatLogger): vllm:time_to_first_token_seconds and vllm:e2e_request_latency_seconds.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class Histogram:
    """A cumulative Prometheus histogram (buckets, count, sum), safe to observe from any thread."""

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.count = 0
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self.count += 1
            self.sum += value
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    self.counts[i] += 1

    def samples(self, name: str, labels: str) -> list[tuple[str, float]]:
        with self._lock:
            out = [
                (f'{name}_bucket{{{labels},le="{bound!r}"}}', c)
                for bound, c in zip(self.buckets, self.counts, strict=False)
            ]
            out.append((f'{name}_bucket{{{labels},le="+Inf"}}', self.count))
            out += [(f"{name}_count{{{labels}}}", self.count), (f"{name}_sum{{{labels}}}", self.sum)]
        return out


@dataclass
class Counters:
    """Monotonic totals for /metrics (written by the engine thread only)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)


class Latencies:
    """Per-request timing, as vLLM measures it: from arrival at the server to the first token, and to the end."""

    def __init__(self, clock=time.monotonic):
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self._clock = clock
        self._arrived: dict[str, float] = {}

    def arrived(self, request_id: str) -> None:
        self._arrived[request_id] = self._clock()

    def output(self, request_id: str, first: bool, finished: bool) -> None:
        start = self._arrived.get(request_id)
        if start is None:
            return
        now = self._clock()
        if first:
            self.ttft.observe(now - start)
        if finished:
            self.e2e.observe(now - start)
            self._arrived.pop(request_id, None)

    def dropped(self, request_id: str) -> None:
        self._arrived.pop(request_id, None)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(
    model_name: str,
    stats: EngineStats,
    counters: Counters,
    *,
    simulated: bool = False,
    latencies: Latencies | None = None,
    cache_info: dict[str, str] | None = None,
    memory_plan: dict[str, int] | None = None,
    spec_decode: dict[str, Any] | None = None,
) -> str:
    base = f'engine="0",model_name="{_label(model_name)}"'
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for suffix_labels, value in samples:
            lines.append(f"{suffix_labels} {float(value)}")

    metric(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        [(f"vllm:num_requests_running{{{base}}}", stats.running)],
    )
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        [(f"vllm:num_requests_waiting{{{base}}}", stats.waiting)],
    )
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        [(f"vllm:kv_cache_usage_perc{{{base}}}", stats.kv_cache_usage)],
    )
    metric(
        "vllm:prompt_tokens",
        "counter",
        "Number of prefill tokens processed.",
        [(f"vllm:prompt_tokens_total{{{base}}}", counters.prompt_tokens)],
    )
    metric(
        "vllm:generation_tokens",
        "counter",
        "Number of generation tokens processed.",
        [(f"vllm:generation_tokens_total{{{base}}}", counters.generation_tokens)],
    )
    reasons = sorted(set(counters.finished) | {"stop", "length", "abort"})
    metric(
        "vllm:request_success",
        "counter",
        "Count of successfully processed requests.",
        [
            (f'vllm:request_success_total{{{base},finished_reason="{_label(r)}"}}', counters.finished.get(r, 0))
            for r in reasons
        ],
    )
    if latencies is not None:
        metric(
            "vllm:time_to_first_token_seconds",
            "histogram",
            "Histogram of time to first token in seconds.",
            latencies.ttft.samples("vllm:time_to_first_token_seconds", base),
        )
        metric(
            "vllm:e2e_request_latency_seconds",
            "histogram",
            "Histogram of e2e request latency in seconds.",
            latencies.e2e.samples("vllm:e2e_request_latency_seconds", base),
        )
    if cache_info is not None:
        extra = "".join(f',{k}="{_label(v)}"' for k, v in sorted(cache_info.items()))
        metric(
            "vllm:cache_config_info",
            "gauge",
            "Information of the LLMEngine CacheConfig" + (" (SIMULATED)" if simulated else ""),
            [(f"vllm:cache_config_info{{{base}{extra}}}", 1)],
        )
    if spec_decode is not None:  # vLLM 0.32's SpecDecodingProm (vllm/v1/spec_decode/metrics.py): counters
        for key, help_ in (
            ("num_drafts", "Number of spec decoding drafts."),
            ("num_draft_tokens", "Number of draft tokens."),
            ("num_accepted_tokens", "Number of accepted tokens."),
        ):
            name = f"vllm:spec_decode_{key}"
            metric(name, "counter", help_, [(f"{name}_total{{{base}}}", spec_decode[key])])
        name = "vllm:spec_decode_num_accepted_tokens_per_pos"
        per_pos = spec_decode["num_accepted_tokens_per_pos"]
        metric(
            name,
            "counter",
            "Accepted tokens per draft position.",
            [(f'{name}_total{{{base},position="{i}"}}', v) for i, v in enumerate(per_pos)],
        )
    if memory_plan is not None:
        metric(
            "vllm_sim:memory_plan_bytes",
            "gauge",
            "SIMULATED start-up memory plan of one GPU in bytes (nothing is allocated): total, reserve "
            "(utilization x total), weights, peak, kv_cache, kv_per_token.",
            [(f'vllm_sim:memory_plan_bytes{{{base},part="{_label(k)}"}}', v) for k, v in memory_plan.items()],
        )
    if simulated:
        metric(
            "vllm_sim:simulated",
            "gauge",
            "1: this server is vllm-sim, a simulator; no model runs.",
            [(f"vllm_sim:simulated{{{base}}}", 1)],
        )
    return "\n".join(lines) + "\n"


# vLLM's names -> SGLang 0.5.23's (tests/fixtures/sglang-0.5.23-metrics.json), for vllm-sim standing in for SGLang
SGLANG_NAMES = (
    ("vllm:num_requests_running", "sglang:num_running_reqs"),
    ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    ("vllm:kv_cache_usage_perc", "sglang:token_usage"),
    ("vllm:", "sglang:"),
)


def as_sglang(text: str) -> str:
    for old, new in SGLANG_NAMES:
        text = text.replace(old, new)
    return text
