"""llama.cpp: `llama-server` with a GGUF model, checked against `llama-server --help` of the pinned build
(b11434: images/engine-args/llama-server-b11434-args.json, scripts/dump_llamacpp_args.py).

The GGUF comes through `models pull` (one download, copied over the fabric; `llamacpp.include` picks one quant
of a repo): the server reads it from the hub cache by path (`-m`), never with `-hf` at start (a node
downloading alone). One engine per node: solo, 2xsolo and replicas of one node; a cluster over nodes needs
llama.cpp's RPC servers (experimental upstream), which sparkdeploy does not launch.
"""

from __future__ import annotations

from typing import Any, ClassVar

from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.images.definitions import ImageDefinition
from sparkdeploy.recipes.engines.flagcheck import check_llamacpp
from sparkdeploy.recipes.engines.interface import ONE_NODE, Distributed, Engine, MetricNames, Parsers, Reservation
from sparkdeploy.recipes.recipe import LlamacppSettings, Recipe, ResolvedRecipe

LLAMACPP_VERSION = "b11434"  # the build whose --help images/engine-args/ holds (images/llamacpp pins its source)
LLAMACPP_DEFAULT_PARALLEL = 4  # llama-server's default slots (--parallel -1: auto, 4 on a GPU build)
# The hub cache inside the container (topologies/base.CONTAINER_HF_HOME) holds the repo `models pull` made.
CONTAINER_HUB = "/root/.cache/huggingface/hub"
# Options that make llama-server download at start (a node alone, unverified) or put a key on the command line.
REFUSED_FLAGS = {
    "-hf": "downloads the model at start",
    "--hf-repo": "downloads the model at start",
    "-hff": "downloads the model at start",
    "--hf-file": "downloads the model at start",
    "-hfr": "downloads the model at start",
    "-hfd": "downloads the model at start",
    "--hf-repo-draft": "downloads the model at start",
    "-mu": "downloads the model at start",
    "--model-url": "downloads the model at start",
    "-hft": "puts a token on the command line",
    "--hf-token": "puts a token on the command line",
    "--api-key": "puts a key on the command line",
}
CLUSTER_REFUSED = (
    "llama.cpp splits a model over nodes only through its RPC servers (experimental upstream, no tensor parallel "
    "over the fabric), which sparkdeploy does not launch"
)


def settings(recipe: Recipe) -> LlamacppSettings:
    assert recipe.llamacpp is not None, "the recipe schema requires llamacpp: with engine llamacpp"
    return recipe.llamacpp


def repo_dir(recipe: Recipe) -> str:
    """The model repo in the container's hub cache; the entry script starts llama-server in the snapshot that
    `models pull` recorded as refs/main, so `-m` names the GGUF relative to it (the commit is known only there)."""
    return f"{CONTAINER_HUB}/models--{recipe.model.replace('/', '--')}"


class Llamacpp(Engine):
    name: ClassVar[str] = "llamacpp"
    title: ClassVar[str] = "llama.cpp"
    entry_template: ClassVar[str] = "entry-llamacpp.sh.j2"
    entry_name: ClassVar[str] = "llamacpp.entry.sh"
    metrics: ClassVar[MetricNames] = MetricNames(
        running="llamacpp:requests_processing",
        waiting="llamacpp:requests_deferred",
        kv_usage=None,  # llama-server exports no KV-use gauge
        prompt_tokens="llamacpp:prompt_tokens_total",
        generation_tokens="llamacpp:tokens_predicted_total",
        ttft=None,
    )
    refused_topologies: ClassVar[dict[str, str]] = {"cluster": CLUSTER_REFUSED, "replicas": CLUSTER_REFUSED}
    flags_file: ClassVar[str | None] = f"engine-args/llama-server-{LLAMACPP_VERSION}-args.json"
    uses_torch: ClassVar[bool] = False
    hub_image: ClassVar[str | None] = "litellm-proxy"  # llama.cpp's image has no Python; the proxy's has the hub client

    def known_version(self, image: ImageDefinition | None) -> str | None:
        return LLAMACPP_VERSION

    def serve_args(
        self, resolved: ResolvedRecipe, image: ImageDefinition, port: int, dist: Distributed = ONE_NODE
    ) -> list[str]:
        r = resolved.recipe
        s = settings(r)
        if r.speculative is not None:  # llama-server's draft (-md) is not rendered yet: refused, not dropped
            raise ConfigError(
                Problem(
                    str(resolved.source),
                    "speculative",
                    "sparkdeploy does not render llama.cpp's speculative decoding (llama-server --model-draft) yet",
                    "remove speculative for engine llamacpp, or serve the model with engine vllm or sglang",
                )
            )
        args = ["-m", s.gguf, "--alias", r.public_name, "--host", "0.0.0.0", "--port", str(port)]
        args += ["-ngl", str(s.n_gpu_layers)]
        if s.ctx_size:
            args += ["-c", str(s.ctx_size)]
        if s.parallel:
            args += ["--parallel", str(s.parallel)]
        args += ["--jinja" if s.jinja else "--no-jinja", "--flash-attn", s.flash_attn]
        if s.cache_type_k:
            args += ["--cache-type-k", s.cache_type_k]
        if s.cache_type_v:
            args += ["--cache-type-v", s.cache_type_v]
        if s.reasoning_format:
            args += ["--reasoning-format", s.reasoning_format]
        args.append("--metrics")
        return args + list(s.extra_args)

    def check_args(self, args: list[str], image: ImageDefinition | None, recipe_file: str) -> None:
        refused = [
            Problem(recipe_file, "llamacpp.extra_args", f"{a} {why}", "bring the GGUF with `sparkdeploy models pull`")
            for a in args
            if (why := REFUSED_FLAGS.get(a))
        ]
        if refused:
            raise ConfigError(refused)
        path = self.flags_path()
        assert path is not None
        check_llamacpp(args, path, f"llama.cpp {LLAMACPP_VERSION}", recipe_file, "llamacpp")

    def extra_args(self, recipe: Recipe) -> list[str]:
        return list(settings(recipe).extra_args)

    def reservation(self, recipe: Recipe) -> Reservation:
        s = settings(recipe)
        # llama-server allocates what the weights, the KV cache of -c tokens and its compute buffers need, no
        # share of the node: the budget counts exactly that (recipes/budget.py). -c is the TOTAL context, each of
        # the --parallel slots getting c/N: so N sequences of c/N tokens.
        slots = s.parallel or LLAMACPP_DEFAULT_PARALLEL
        return Reservation(
            fraction=None,
            max_model_len=s.ctx_size // slots if s.ctx_size else None,
            max_num_seqs=slots,
            default_num_seqs=LLAMACPP_DEFAULT_PARALLEL,
            kv_cache_dtype="fp8" if (s.cache_type_k or "").startswith("q8") else None,
            fraction_field=None,
            length_field="llamacpp.ctx_size",
        )

    def parsers(self, recipe: Recipe) -> Parsers:
        s = settings(recipe)
        # --jinja: the model's own chat template parses tool calls; reasoning by --reasoning-format
        return Parsers("jinja" if s.jinja else None, s.reasoning_format)

    def entry_vars(self, recipe: Recipe) -> dict[str, Any]:
        return {"repo_dir": repo_dir(recipe)}

    def model_files(self, recipe: Recipe) -> list[str]:
        s = settings(recipe)
        if s.include:
            return list(s.include)
        folder, _, _ = s.gguf.rpartition("/")
        return [f"{folder}/*"] if folder else [s.gguf]


ENGINE = Llamacpp()
