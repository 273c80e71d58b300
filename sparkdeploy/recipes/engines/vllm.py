"""vLLM: `vllm serve` (recipes/vllm_args.py writes the line; images/vllm_cli.py checks it against the image's
own parser dump). The engine sparkdeploy began with: every recipe without `engine:` is this one."""

from __future__ import annotations

from typing import ClassVar

from sparkdeploy.images import vllm_cli
from sparkdeploy.images.definitions import ImageDefinition
from sparkdeploy.recipes import vllm_args
from sparkdeploy.recipes.engines.interface import (
    ONE_NODE,
    Distributed,
    Engine,
    MetricNames,
    Parsers,
    Reservation,
    flag_value,
)
from sparkdeploy.recipes.recipe import Recipe, ResolvedRecipe

VLLM_DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs


class Vllm(Engine):
    name: ClassVar[str] = "vllm"
    title: ClassVar[str] = "vLLM"
    entry_template: ClassVar[str] = "entry-vllm.sh.j2"
    entry_name: ClassVar[str] = "vllm.entry.sh"
    metrics: ClassVar[MetricNames] = MetricNames(
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        kv_usage="vllm:kv_cache_usage_perc",
        prompt_tokens="vllm:prompt_tokens_total",
        generation_tokens="vllm:generation_tokens_total",
        ttft="vllm:time_to_first_token_seconds",
    )

    def known_version(self, image: ImageDefinition | None) -> str | None:
        return (image.vllm_version or None) if image else None

    def describe(self, image: ImageDefinition) -> str:
        return vllm_cli.describe(image)

    def serve_args(
        self, resolved: ResolvedRecipe, image: ImageDefinition, port: int, dist: Distributed = ONE_NODE
    ) -> list[str]:
        return vllm_args.serve_args(resolved, image, port, dist)

    def check_args(self, args: list[str], image: ImageDefinition | None, recipe_file: str) -> None:
        assert image is not None, "vLLM's flags are the image's own"
        vllm_cli.check_args(args, image, recipe_file)

    def extra_args(self, recipe: Recipe) -> list[str]:
        return list(recipe.vllm.extra_args)

    def reservation(self, recipe: Recipe) -> Reservation:
        v = recipe.vllm
        return Reservation(
            fraction=v.gpu_memory_utilization,
            max_model_len=v.max_model_len,
            max_num_seqs=v.max_num_seqs,
            default_num_seqs=VLLM_DEFAULT_MAX_NUM_SEQS,
            kv_cache_dtype=v.kv_cache_dtype,
            fraction_field="vllm.gpu_memory_utilization",
            length_field="vllm.max_model_len",
        )

    def parsers(self, recipe: Recipe) -> Parsers:
        args = recipe.vllm.extra_args
        return Parsers(flag_value(args, "--tool-call-parser"), flag_value(args, "--reasoning-parser"))


ENGINE = Vllm()
