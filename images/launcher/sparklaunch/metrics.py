"""/metrics in Prometheus text format, with vLLM's metric names and labels.

Only the series the project reads (doctor, bench, status): queue depths, KV usage, token and request
totals. Names follow vLLM 0.32 (`vllm:kv_cache_usage_perc`, not the deprecated gpu_cache name); counters
are written the way prometheus_client writes them (TYPE line without `_total`, sample with it).
"""

from __future__ import annotations

from .driver import Counters
from .protocol import EngineStats


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(model_name: str, stats: EngineStats, counters: Counters, *, simulated: bool = False) -> str:
    base = f'engine="0",model_name="{_label(model_name)}"'
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for suffix_labels, value in samples:
            lines.append(f"{suffix_labels} {float(value)}")

    metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
           [(f"vllm:num_requests_running{{{base}}}", stats.running)])
    metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
           [(f"vllm:num_requests_waiting{{{base}}}", stats.waiting)])
    metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
           [(f"vllm:kv_cache_usage_perc{{{base}}}", stats.kv_cache_usage)])
    metric("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.",
           [(f"vllm:prompt_tokens_total{{{base}}}", counters.prompt_tokens)])
    metric("vllm:generation_tokens", "counter", "Number of generation tokens processed.",
           [(f"vllm:generation_tokens_total{{{base}}}", counters.generation_tokens)])
    reasons = sorted(set(counters.finished) | {"stop", "length", "abort"})
    metric("vllm:request_success", "counter", "Count of successfully processed requests.",
           [(f'vllm:request_success_total{{{base},finished_reason="{_label(r)}"}}', counters.finished.get(r, 0)) for r in reasons])
    if simulated:
        metric("vllm_sim:simulated", "gauge", "1: this server is vllm-sim, a simulator; no model runs.",
               [(f"vllm_sim:simulated{{{base}}}", 1)])
    return "\n".join(lines) + "\n"
