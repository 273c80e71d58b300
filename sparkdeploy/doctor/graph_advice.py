"""How a recipe should run vLLM's tensor-parallel all-reduce, from the probe's 4 KiB figures.

Three ways, one per recipe (`recipes show` says which a recipe uses):
  keep graphs        the all-reduce is captured in the CUDA graph with everything else (vLLM's default)
  cut at all-reduce  graphs are cut at vllm::all_reduce and NCCL runs eagerly between the pieces
                     (vllm.compilation.eager_allreduce: true; the seeds: 18 us eager vs 46 us in a graph over CX7)
  enforce eager      no CUDA graphs at all (vllm.enforce_eager: true)

Cutting pays when the all-reduce is slower inside a graph than eagerly by more than what each extra graph piece
costs (the seeds: about 5 us a piece). Enforce eager is advised only when the probe could not run NCCL inside a
CUDA graph at all: from the all-reduce's point of view cutting is never worse than giving up every graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkdeploy.recipes.recipe import VllmSettings

KEEP, CUT, EAGER = "keep graphs", "cut at all-reduce", "enforce eager"
PIECE_OVERHEAD_US = 5.0  # seeds: 97 all-reduces x (18 us eager + 5 us per extra piece) against 46 us in a graph
CUT_PAYS_RATIO = 1.2  # and the graph must be clearly slower: below this the figures are within the noise

SETTING = {
    KEEP: "vllm.compilation.eager_allreduce: false, vllm.enforce_eager: false",
    CUT: "vllm.compilation.eager_allreduce: true",
    EAGER: "vllm.enforce_eager: true",
}
MEANING = {
    KEEP: "the all-reduce is captured in the CUDA graphs (vLLM's default)",
    CUT: "CUDA graphs are cut at vllm::all_reduce; NCCL runs eagerly between graph pieces",
    EAGER: "no CUDA graphs at all",
}


@dataclass(frozen=True)
class Advice:
    choice: str  # KEEP | CUT | EAGER
    reason: str  # with the measured numbers


def recipe_mode(vllm: VllmSettings) -> str:
    """Which of the three a recipe's vllm settings (recipes.VllmSettings) select."""
    if vllm.enforce_eager:
        return EAGER
    if vllm.compilation.eager_allreduce:
        return CUT
    return KEEP


def advise(lat: dict[str, Any]) -> Advice | None:
    """From the probe's lat4k (eager_us, graph_us, graph_error, eager_method); None when there is nothing to go
    on (no eager figure, or graphs not applicable: gloo on CPU)."""
    eager, graph = lat.get("eager_us"), lat.get("graph_us")
    if eager is None:
        return None
    how = f" ({lat['eager_method']})" if lat.get("eager_method") else ""
    if graph is None:
        error = lat.get("graph_error") or ""
        if not error or error.startswith(("not applicable", "not measured")):
            return None
        return Advice(
            EAGER,
            f"NCCL inside a CUDA graph failed here ({error[:160]}); 4 KiB eager {eager:.1f} us{how}. "
            f"Cutting at the all-reduce keeps NCCL out of the graphs and may work too",
        )
    ratio = graph / eager
    numbers = f"4 KiB all-reduce {eager:.1f} us eager{how} vs {graph:.1f} us in a CUDA graph (graph/eager {ratio:.2f})"
    saving = graph - eager - PIECE_OVERHEAD_US
    if ratio >= CUT_PAYS_RATIO and saving > 0:
        return Advice(
            CUT,
            f"{numbers}: cutting saves about {saving:.1f} us per all-reduce after "
            f"{PIECE_OVERHEAD_US:g} us for each extra graph piece",
        )
    if ratio < 1:
        return Advice(KEEP, f"{numbers}: the all-reduce is faster inside the graph")
    return Advice(
        KEEP,
        f"{numbers}: eager saves {max(graph - eager, 0):.1f} us, not more than the "
        f"{PIECE_OVERHEAD_US:g} us an extra graph piece costs",
    )


def for_recipe(advice: Advice, mode: str, recipe: str) -> str:
    """One line: what the recipe does, what this cluster's figures want, and the setting that gets there."""
    if advice.choice == mode:
        return f"{recipe}: {mode}, which fits this cluster: {advice.reason}"
    change = f"set {SETTING[advice.choice]}"
    if mode == EAGER:
        change = (
            "set vllm.enforce_eager: false"
            + (f" and {SETTING[CUT]}" if advice.choice == CUT else "")
            + " (unless the recipe enforces eager for another reason: it gives up every op's graph)"
        )
    return f"{recipe} uses {mode} ({SETTING[mode]}); this cluster wants {advice.choice}: {change}. {advice.reason}"
