"""The engines, registered in one place: the recipe's `engine:` value -> its module's ENGINE."""

from __future__ import annotations

from sparkdeploy.recipes.engines import llamacpp, sglang, vllm
from sparkdeploy.recipes.engines.interface import Engine, MetricNames
from sparkdeploy.recipes.recipe import ENGINE_NAMES, Recipe

ENGINES: dict[str, Engine] = {e.name: e for e in (vllm.ENGINE, sglang.ENGINE, llamacpp.ENGINE)}
# The recipe schema names the same engines (recipes/recipe.py cannot import this module: it imports recipe.py).
assert tuple(ENGINES) == ENGINE_NAMES, "recipe.ENGINE_NAMES and engines.ENGINES must name the same engines"


def engine_of(recipe: Recipe) -> Engine:
    return ENGINES[recipe.engine]


def metric_names(present: set[str]) -> MetricNames:
    """The names of the engine whose metrics a /metrics page carries (vLLM's when none is recognised)."""
    for engine in ENGINES.values():
        if engine.metrics.running in present or engine.metrics.prompt_tokens in present:
            return engine.metrics
    return ENGINES["vllm"].metrics
