"""SGLang: `python3 -m sglang.launch_server`, checked against the parser of the pinned release (0.5.23:
images/engine-args/sglang-0.5.23-args.json, dumped from SGLang's own argparse by scripts/dump_sglang_args.py).

Multi-node is SGLang's own: every node runs the same line with `--nnodes N --node-rank R --dist-init-addr
HEAD_FABRIC_IP:PORT`; rank 0 serves HTTP (the other ranks' /health is a stub), so health is read on the head.
The API key never goes on the command line: the engines listen for the gateway/proxy, which holds the key.
"""

from __future__ import annotations

from typing import ClassVar

from sparkdeploy.images.definitions import ImageDefinition
from sparkdeploy.recipes import speculative
from sparkdeploy.recipes.engines.flagcheck import check_argparse
from sparkdeploy.recipes.engines.interface import ONE_NODE, Distributed, Engine, MetricNames, Parsers, Reservation
from sparkdeploy.recipes.recipe import Recipe, ResolvedRecipe, SglangSettings

SGLANG_VERSION = "0.5.23"  # the release whose parser images/engine-args/ holds
SGLANG_DEFAULT_MAX_RUNNING = 256  # what the budget assumes without max_running_requests (SGLang sizes it itself)


def settings(recipe: Recipe) -> SglangSettings:
    return recipe.sglang or SglangSettings()


def _opt(flag: str, value: object) -> list[str]:
    text = str(value)
    return [f"{flag}={text}"] if text.startswith("-") else [flag, text]


class Sglang(Engine):
    name: ClassVar[str] = "sglang"
    title: ClassVar[str] = "SGLang"
    entry_template: ClassVar[str] = "entry-sglang.sh.j2"
    entry_name: ClassVar[str] = "sglang.entry.sh"
    metrics: ClassVar[MetricNames] = MetricNames(
        running="sglang:num_running_reqs",
        waiting="sglang:num_queue_reqs",
        kv_usage="sglang:token_usage",
        prompt_tokens="sglang:prompt_tokens_total",
        generation_tokens="sglang:generation_tokens_total",
        ttft="sglang:time_to_first_token_seconds",
        spec_accept_rate="sglang:spec_accept_rate",  # gauges (tests/fixtures/sglang-0.5.23-metrics.json)
        spec_accept_length="sglang:spec_accept_length",
    )
    # SGLang's multi-node mode is its own: one launcher, no Ray or torchrun (recipes' cluster_backend: native).
    multi_node_backends: ClassVar[tuple[str, ...] | None] = ("native",)
    flags_file: ClassVar[str | None] = f"engine-args/sglang-{SGLANG_VERSION}-args.json"

    def known_version(self, image: ImageDefinition | None) -> str | None:
        return SGLANG_VERSION

    def serve_args(
        self, resolved: ResolvedRecipe, image: ImageDefinition, port: int, dist: Distributed = ONE_NODE
    ) -> list[str]:
        r = resolved.recipe
        s = settings(r)
        args = ["--model-path", r.model, *_opt("--served-model-name", r.public_name)]
        args += ["--host", "0.0.0.0", "--port", str(port)]
        args += ["--mem-fraction-static", f"{s.mem_fraction_static:g}"]
        for flag, value in (
            ("--context-length", s.context_length),
            ("--max-running-requests", s.max_running_requests),
            ("--chunked-prefill-size", s.chunked_prefill_size),
            ("--kv-cache-dtype", s.kv_cache_dtype),
            ("--quantization", s.quantization),
            ("--attention-backend", s.attention_backend),
            ("--tool-call-parser", s.tool_call_parser),
            ("--reasoning-parser", s.reasoning_parser),
        ):
            if value is not None:
                args += _opt(flag, value)
        if s.trust_remote_code:
            args.append("--trust-remote-code")
        args.append("--enable-metrics")
        if dist.tensor_parallel > 1:
            args += ["--tp-size", str(dist.tensor_parallel)]
        if dist.pipeline_parallel > 1:
            args += ["--pp-size", str(dist.pipeline_parallel)]
        if dist.nnodes:
            args += ["--nnodes", str(dist.nnodes), "--node-rank", str(dist.node_rank)]
            args += ["--dist-init-addr", f"{dist.master_addr}:{dist.master_port}"]
        if r.speculative is not None:  # issue 39: SGLang's own --speculative-* flags (checked with the rest)
            args += speculative.sglang_flags(r.speculative, str(resolved.source))
        return args + list(s.extra_args)

    def check_args(self, args: list[str], image: ImageDefinition | None, recipe_file: str) -> None:
        path = self.flags_path()
        assert path is not None
        check_argparse(args, path, f"SGLang {SGLANG_VERSION}", recipe_file, "sglang")

    def extra_args(self, recipe: Recipe) -> list[str]:
        return list(settings(recipe).extra_args)

    def reservation(self, recipe: Recipe) -> Reservation:
        s = settings(recipe)
        return Reservation(
            fraction=s.mem_fraction_static,
            max_model_len=s.context_length,
            max_num_seqs=s.max_running_requests,
            default_num_seqs=SGLANG_DEFAULT_MAX_RUNNING,
            kv_cache_dtype=s.kv_cache_dtype,
            fraction_field="sglang.mem_fraction_static",
            length_field="sglang.context_length",
        )

    def parsers(self, recipe: Recipe) -> Parsers:
        s = settings(recipe)
        return Parsers(s.tool_call_parser, s.reasoning_parser)


ENGINE = Sglang()
