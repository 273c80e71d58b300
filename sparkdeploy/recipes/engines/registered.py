"""The engines, registered in one place: the recipe's `engine:` value -> its module's ENGINE."""

from __future__ import annotations

from dataclasses import dataclass

from sparkdeploy.images.definitions import ImageDefinition
from sparkdeploy.recipes.engines import llamacpp, sglang, vllm
from sparkdeploy.recipes.engines.interface import Engine, MetricNames
from sparkdeploy.recipes.recipe import ENGINE_NAMES, Recipe

ENGINES: dict[str, Engine] = {e.name: e for e in (vllm.ENGINE, sglang.ENGINE, llamacpp.ENGINE)}
# The recipe schema names the same engines (recipes/recipe.py cannot import this module: it imports recipe.py).
assert tuple(ENGINES) == ENGINE_NAMES, "recipe.ENGINE_NAMES and engines.ENGINES must name the same engines"


def engine_of(recipe: Recipe) -> Engine:
    return ENGINES[recipe.engine]


@dataclass(frozen=True)
class EngineVersion:
    """The engine a deployment serves with and its version (None: a registry image not read yet)."""

    engine: str  # the recipe's `engine:` value
    title: str  # "SGLang"
    version: str | None

    @property
    def text(self) -> str:
        return f"{self.title} {self.version or '(version unknown)'}"

    def as_dict(self) -> dict[str, str | None]:
        return {"engine": self.engine, "engine_title": self.title, "engine_version": self.version}


def engine_version(recipe: Recipe, image: ImageDefinition | None = None) -> EngineVersion:
    """The engine of `recipe` and its version in `image` (SGLang's and llama.cpp's are pinned: no image needed):
    the one place doctor, bench and advise read them from."""
    engine = engine_of(recipe)
    return EngineVersion(engine.name, engine.title, engine.known_version(image))


def metric_names(present: set[str]) -> MetricNames:
    """The names of the engine whose metrics a /metrics page carries (vLLM's when none is recognised)."""
    for engine in ENGINES.values():
        if engine.metrics.running in present or engine.metrics.prompt_tokens in present:
            return engine.metrics
    return ENGINES["vllm"].metrics
