"""Whether figures came from a simulated engine, and how they are labelled: one place for both.

The decision is `is_simulated(metadata)`: the `simulated` field of a bench result's (or an endpoint's, or a `top`
row's) metadata. It is filled from one of two facts, whichever is known:
- a deployment sparkdeploy rendered: the running image definition's `simulated: true`
  (images/vllm-sim/manifest.yaml; bench/deploy_link.py records it);
- an engine known only by its URL (`bench --endpoint`, `top`'s scrape): what the engine says about itself.
  vllm-sim says it in every HTTP answer, header `X-Simulated-By: vllm-sim` (a LiteLLM proxy passes it on as
  `llm_provider-x-simulated-by`), and in its /metrics, `vllm_sim:simulated 1` (images/launcher/sparklaunch/api.py
  and metrics.py). A real vLLM says neither.
Every printed figure of a simulated engine carries LABEL beside it (report.md, the terminal tables, the charts,
`bench`, `bench sweep`, `top`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

LABEL = "SIMULATED"
NOTE = "vllm-sim stands in for the GPU: not hardware measurements"
HEADER = "x-simulated-by"  # HTTP header names are case-insensitive
PROXIED_HEADER = "llm_provider-" + HEADER  # LiteLLM returns the engine's headers under this prefix
METRIC = "vllm_sim:simulated"


def is_simulated(metadata: Mapping[str, Any] | None) -> bool:
    """The one test: the metadata says simulated (None, missing or False: not labelled)."""
    return metadata is not None and metadata.get("simulated") is True


def any_simulated(metadatas: Iterable[Mapping[str, Any] | None]) -> bool:
    return any(is_simulated(md) for md in metadatas)


def tag(simulated: bool) -> str:
    """What follows a line of figures: ' [SIMULATED]' or nothing."""
    return f" [{LABEL}]" if simulated else ""


def headers_say_simulated(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> bool:
    """An HTTP answer's headers carry the simulator's marker (from the engine itself or through LiteLLM)."""
    items = headers.items() if hasattr(headers, "items") else headers
    return any(k.lower() in (HEADER, PROXIED_HEADER) and v.strip() for k, v in items)


def metrics_say_simulated(metrics: Mapping[str, list[tuple[dict[str, str], float]]]) -> bool:
    """Parsed Prometheus samples (sparkdeploy.daytwo.top.parse_metrics) hold the simulator's gauge at 1."""
    return any(value >= 1 for _, value in metrics.get(METRIC, []))
