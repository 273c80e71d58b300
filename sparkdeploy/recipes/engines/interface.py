"""The engine interface every serving engine implements (registered in registered.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from sparkdeploy import paths
from sparkdeploy.images.definitions import ImageDefinition
from sparkdeploy.recipes.recipe import Recipe, ResolvedRecipe


@dataclass(frozen=True)
class Distributed:
    """How this process takes part in a multi-node engine (None fields: single node)."""

    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    executor_backend: str | None = None  # vLLM: ray | external_launcher
    nnodes: int | None = None
    node_rank: int | None = None
    master_addr: str | None = None  # rank 0's fabric address
    master_port: int | None = None
    headless: bool = False


ONE_NODE = Distributed()  # the default: a process that is the whole engine


@dataclass(frozen=True)
class MetricNames:
    """The Prometheus names `top` reads from an engine's /metrics (None: the engine exports no such figure)."""

    running: str
    waiting: str | None
    kv_usage: str | None  # a 0..1 gauge
    prompt_tokens: str  # counters
    generation_tokens: str
    ttft: str | None  # a histogram (its _bucket series)
    # speculative decoding reported as gauges of the engine's latest verify step (SGLang: accepted drafts over
    # proposed, and tokens a step with the bonus token); None: counters (vLLM's spec_decode_*_total) or nothing
    spec_accept_rate: str | None = None
    spec_accept_length: str | None = None

    def names(self) -> tuple[str, ...]:
        return tuple(
            n
            for n in (self.running, self.waiting, self.kv_usage, self.prompt_tokens, self.generation_tokens, self.ttft)
            if n
        )


@dataclass(frozen=True)
class Reservation:
    """What the memory budget counts of an engine (recipes/budget.py): the fraction of the node's memory it takes
    when it starts, the longest sequence and the sequences it batches, the KV cache's dtype; and the recipe
    fields that set them (named in the budget's advice)."""

    fraction: float | None  # None: no fixed share, the engine takes what its weights and context need
    max_model_len: int | None
    max_num_seqs: int | None
    default_num_seqs: int
    kv_cache_dtype: str | None
    fraction_field: str | None  # None: the engine has no such setting (llama.cpp takes what it needs)
    length_field: str


@dataclass(frozen=True)
class Parsers:
    tool: str | None
    reasoning: str | None


def flag_value(args: list[str], *flags: str) -> str | None:
    """The value a command line gives one of `flags` (`--f v` or `--f=v`), the last one winning."""
    found = None
    for i, token in enumerate(args):
        name, eq, inline = token.partition("=")
        if name in flags:
            found = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
    return found


class Engine:
    """One serving engine. Subclasses set the class attributes and implement serve_args and check_args."""

    name: ClassVar[str]  # the recipe's `engine:` value
    title: ClassVar[str]  # how messages name it: "vLLM"
    entry_template: ClassVar[str]  # the container's entry script (templates/), given `args`
    entry_name: ClassVar[str]
    health_path: ClassVar[str] = "/health"  # liveness, what Docker's health check and `up`'s wait ask
    ready_path: ClassVar[str] = "/v1/models"  # answers once the model is loaded
    metrics: ClassVar[MetricNames]
    # The topologies it serves, and for the others the reason it does not (said in one line).
    refused_topologies: ClassVar[dict[str, str]] = {}
    multi_node_backends: ClassVar[tuple[str, ...] | None] = None  # None: every backend; else the ones it has
    flags_file: ClassVar[str | None] = None
    uses_torch: ClassVar[bool] = True  # doctor compares torch/CUDA/NCCL of its image across nodes
    # The image definition `models pull` runs the hub client in (huggingface_hub); None: the engine's own image.
    hub_image: ClassVar[str | None] = None  # under images/ (paths.images_dir()): the pinned flag dump

    def flags_path(self) -> Path | None:
        return paths.images_dir() / self.flags_file if self.flags_file else None

    def version(self, image: ImageDefinition) -> str:
        return self.known_version(image) or "(version unknown)"

    def known_version(self, image: ImageDefinition | None) -> str | None:
        """The engine's version in `image` (None: not known, a registry image not read yet or no image given)."""
        raise NotImplementedError

    def describe(self, image: ImageDefinition) -> str:
        """`SGLang 0.5.23`: said in every message about its flags."""
        return f"{self.title} {self.version(image)}"

    def serve_args(
        self, resolved: ResolvedRecipe, image: ImageDefinition, port: int, dist: Distributed = ONE_NODE
    ) -> list[str]:
        """The engine's command line after its program (the entry template adds the program)."""
        raise NotImplementedError

    def check_args(self, args: list[str], image: ImageDefinition | None, recipe_file: str) -> None:
        """Every flag of `args` parses with the pinned engine's own rules: ConfigError (one line each) otherwise."""
        raise NotImplementedError

    def extra_args(self, recipe: Recipe) -> list[str]:
        raise NotImplementedError

    def reservation(self, recipe: Recipe) -> Reservation:
        raise NotImplementedError

    def parsers(self, recipe: Recipe) -> Parsers:
        raise NotImplementedError

    def entry_vars(self, recipe: Recipe) -> dict[str, Any]:
        """More variables of its entry template (llama.cpp: the model repo it starts in)."""
        return {}

    def model_files(self, recipe: Recipe) -> list[str]:
        """What `models pull` downloads of the model repo: file patterns, [] for the whole repo."""
        return []
