"""A recipe's `speculative:` for vLLM: checked against the pinned vLLM's SpeculativeConfig, written as the
`--speculative-config` JSON (docs/speculative.md).

What the engine accepts is read from `images/<image>/vllm-speculative-<version>.json`, dumped from exactly the
sources the image pins by scripts/dump_vllm_speculative.py (its method names, its option names and its
`vllm:spec_decode_*` metric names), never from a list written here. What is refused, one line each:
- an image whose vLLM has no such record (a fork, a version not dumped): the methods it knows are unknown;
- a method that vLLM does not have, or an option that is not a field of its SpeculativeConfig;
- a method that drafts with a separate model (eagle3, draft_model, ...) without `model`, or one that drafts
  from the prompt or the model itself (ngram, suffix) with one;
- mtp on a model whose recipe architecture says it has no MTP layers;
- a draft_tensor_parallel_size other than 1 or the engine's tensor parallel size (vLLM's own rule).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from sparkdeploy import paths
from sparkdeploy.config.userfile import load_json_file
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.images.definitions import ImageDefinition
from sparkdeploy.images.image_ref import RegistryImage
from sparkdeploy.recipes.recipe import ResolvedRecipe, SpeculativeSettings

# Methods that draft with a separate checkpoint (`model`), and those that draft from the prompt or from the
# target's own layers (no draft checkpoint). The rest (mtp and its aliases, dspark) may name one or not.
DRAFT_CHECKPOINT = frozenset({"eagle", "eagle3", "draft_model", "medusa", "mlp_speculator", "dflash", "custom_class"})
NO_DRAFT = frozenset({"ngram", "ngram_gpu", "suffix", "extract_hidden_states"})
# The recipe's own fields: an option may not say them again.
OWN_FIELDS = ("method", "model", "revision", "num_speculative_tokens")
FIX_VERSION = "use an image with vLLM 0.32.0 (vllm-node), or dump its record with scripts/dump_vllm_speculative.py"


@cache
def engine_record(version: str) -> dict[str, Any] | None:
    """The speculative record of a vLLM version (images/*/vllm-speculative-V.json), None without one."""
    matches = sorted(paths.images_dir().glob(f"*/vllm-speculative-{version}.json"))
    if not matches:
        return None
    data = load_json_file(str(matches[0]), "vLLM speculative record")
    if not isinstance(data, dict) or not isinstance(data.get("methods"), list):
        raise ConfigError(Problem(str(matches[0]), "methods", "missing", "dump it again: " + FIX_VERSION))
    return data


def metric_names(version: str = "0.32.0") -> tuple[str, ...]:
    """The `vllm:spec_decode_*` counters of that vLLM (its v1/spec_decode/metrics.py)."""
    record = engine_record(version)
    return tuple(record.get("metrics", [])) if record else ()


def is_mtp(method: str, record: dict[str, Any]) -> bool:
    return method == "mtp" or method in record.get("mtp_aliases", [])


def _option_problems(spec: SpeculativeSettings, record: dict[str, Any], where: str, version: str) -> list[Problem]:
    """speculative.options checked against the record: vLLM's SpeculativeConfig fields, less ours and refused ones."""
    out = []
    known = set(record.get("options", []))
    for key in spec.options:
        if key in OWN_FIELDS:
            out.append(
                Problem(
                    where, f"speculative.options.{key}", "is a field of speculative itself", f"set speculative.{key}"
                )
            )
        elif key == "tensor_parallel_size":
            out.append(
                Problem(
                    where,
                    f"speculative.options.{key}",
                    "vLLM refuses it in the speculative config",
                    "use draft_tensor_parallel_size",
                )
            )
        elif key not in known:
            out.append(
                Problem(
                    where,
                    f"speculative.options.{key}",
                    f"is not an option of vLLM {version}'s SpeculativeConfig",
                    f"use one of {', '.join(sorted(known - set(OWN_FIELDS) - {'tensor_parallel_size'}))}",
                )
            )
    return out


def _draft_problems(resolved: ResolvedRecipe, spec: SpeculativeSettings, record: dict[str, Any]) -> list[Problem]:
    """Where the drafts come from: a draft model where the method needs one, none where it drafts from the prompt,
    and MTP layers in the model where mtp drafts with them."""
    where = str(resolved.source)
    out = []
    if spec.method in DRAFT_CHECKPOINT and not spec.model:
        out.append(
            Problem(
                where,
                "speculative.model",
                f"method {spec.method} drafts with a separate model",
                "name the draft's model",
            )
        )
    if spec.method in NO_DRAFT and spec.model:
        out.append(
            Problem(
                where,
                "speculative.model",
                f"method {spec.method} drafts from the prompt, with no draft model",
                "remove speculative.model",
            )
        )
    arch = resolved.recipe.architecture
    if is_mtp(spec.method, record) and not spec.model and arch is not None and not arch.mtp_layers:
        out.append(
            Problem(
                where,
                "speculative.method",
                f"mtp drafts with the model's own multi-token-prediction layers, and {resolved.recipe.model} has "
                "none by its architecture",
                "set architecture.mtp_layers from config.json (num_nextn_predict_layers or mtp_num_hidden_layers) "
                "if it has them; else use eagle3 with a draft, or ngram",
            )
        )
    return out


def _serving_problems(resolved: ResolvedRecipe, spec: SpeculativeSettings, tensor_parallel: int) -> list[Problem]:
    """What the rest of the serve line must agree with: no second --speculative-config, a draft TP vLLM allows."""
    where = str(resolved.source)
    out = []
    twice = [a for a in resolved.recipe.vllm.extra_args if a.split("=", 1)[0] in ("--speculative-config", "-sc")]
    if twice:
        out.append(
            Problem(where, "vllm.extra_args", f"{twice[0]} says again what speculative says", f"remove {twice[0]}")
        )
    draft_tp = spec.options.get("draft_tensor_parallel_size")
    if draft_tp is not None and draft_tp not in (1, tensor_parallel):
        out.append(
            Problem(
                where,
                "speculative.options.draft_tensor_parallel_size",
                f"{draft_tp} on a {resolved.topology} engine of tensor parallel {tensor_parallel}: vLLM allows only 1 "
                "or the target's tensor parallel size",
                f"set it to 1 or {tensor_parallel}",
            )
        )
    return out


def problems(resolved: ResolvedRecipe, image: ImageDefinition, tensor_parallel: int = 1) -> list[Problem]:
    """Why this engine cannot run the recipe's speculative decoding (empty: it can)."""
    spec = resolved.recipe.speculative
    if spec is None or isinstance(image, RegistryImage):  # a registry image's vLLM: its flags are checked, no more
        return []
    where = str(resolved.source)
    record = engine_record(image.vllm_version or "")
    if record is None:
        return [
            Problem(
                where,
                "speculative",
                f"image {image.name}'s vLLM {image.vllm_version or '(unknown)'} has no record of its speculative "
                "methods, so the method cannot be checked before it runs",
                FIX_VERSION,
            )
        ]
    out = []
    version = record.get("vllm_version", image.vllm_version)
    if spec.method not in record["methods"]:
        plain = [m for m in record["methods"] if m not in record.get("mtp_aliases", [])]
        out.append(
            Problem(
                where,
                "speculative.method",
                f"{spec.method!r} is not a speculative method of vLLM {version}",
                f"use one of {', '.join(plain)}",
            )
        )
    out += _option_problems(spec, record, where, str(version))
    out += _draft_problems(resolved, spec, record)
    out += _serving_problems(resolved, spec, tensor_parallel)
    return out


def config(spec: SpeculativeSettings) -> dict[str, Any]:
    """vLLM's speculative config for these settings (the JSON of --speculative-config)."""
    out: dict[str, Any] = {"method": spec.method}
    if spec.model:
        out["model"] = spec.model
    if spec.revision:
        out["revision"] = spec.revision
    out["num_speculative_tokens"] = spec.num_speculative_tokens
    out.update(spec.options)
    return out


def serve_flag(resolved: ResolvedRecipe, image: ImageDefinition, tensor_parallel: int = 1) -> list[str]:
    """`--speculative-config JSON`, or nothing without speculative decoding; ConfigError where it cannot run."""
    spec = resolved.recipe.speculative
    if spec is None:
        return []
    found = problems(resolved, image, tensor_parallel)
    if found:
        raise ConfigError(found)
    return ["--speculative-config", json.dumps(config(spec), separators=(",", ":"), sort_keys=False)]


# -- what the engine reports: vLLM 0.32's SpecDecodingProm counters (vllm/v1/spec_decode/metrics.py) ------------


@dataclass(frozen=True)
class SpecCounters:
    """Cumulative `vllm:spec_decode_*_total` counters of an engine (summed over its engines' series); or, for an
    engine that reports gauges of its latest verify step instead (SGLang's spec_accept_rate and _length), those
    (`rate`, `length`: no counters, so no window: `since` keeps the latest)."""

    drafts: float
    draft_tokens: float
    accepted: float
    rate: float | None = None
    length: float | None = None

    @property
    def gauges(self) -> bool:
        return self.rate is not None or self.length is not None

    def since(self, old: SpecCounters | None) -> SpecCounters:
        """What happened between two samples (a counter that went down: the engine restarted, take the new)."""
        if old is None or self.gauges or self.drafts < old.drafts or self.accepted < old.accepted:
            return self
        return SpecCounters(
            self.drafts - old.drafts, self.draft_tokens - old.draft_tokens, self.accepted - old.accepted
        )

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted tokens (vLLM's docstring: rate(accepted) / rate(draft_tokens))."""
        if self.gauges:
            return self.rate
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def tokens_per_step(self) -> float | None:
        """The mean acceptance length: 1 + accepted / drafts (the target's own token plus the accepted drafts)."""
        if self.gauges:
            return self.length
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> SpecCounters:
        """Back from as_dict() (a stored bench result's metadata)."""
        if data.get("gauges"):
            return cls(0.0, 0.0, 0.0, data.get("acceptance_rate"), data.get("accepted_tokens_per_step"))
        return cls(float(data["drafts"]), float(data["draft_tokens"]), float(data["accepted_tokens"]))

    def as_dict(self) -> dict[str, float | bool | None]:
        return {
            "gauges": self.gauges,  # true: the engine's latest verify step (SGLang), not counts over a window
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "accepted_tokens_per_step": self.tokens_per_step,
        }


def read_counters(
    metrics: Mapping[str, list[tuple[dict[str, str], float]]],
    rate_gauge: str | None = None,
    length_gauge: str | None = None,
) -> SpecCounters | None:
    """The spec-decode counters in a parsed /metrics (daytwo/top.parse_metrics' shape); None when the engine
    reports none (no speculative decoding). An engine whose names (recipes/engines/: MetricNames) have acceptance
    gauges (SGLang) is read from those, averaged over its series (its DP ranks)."""
    if rate_gauge or length_gauge:
        rate, length = _mean(metrics, rate_gauge), _mean(metrics, length_gauge)
        if not rate and not length:
            return None  # absent or 0: no verify step reported (no speculation, or nothing drafted yet)
        return SpecCounters(0.0, 0.0, 0.0, rate, length)
    names = {name.removeprefix("vllm:spec_decode_"): name + "_total" for name in metric_names()}

    def total(key: str) -> float | None:
        series = metrics.get(names.get(key, ""))
        return None if not series else sum(v for _, v in series)

    drafts, tokens, accepted = total("num_drafts"), total("num_draft_tokens"), total("num_accepted_tokens")
    if drafts is None or tokens is None or accepted is None:
        return None
    return SpecCounters(drafts, tokens, accepted)


def _mean(metrics: Mapping[str, list[tuple[dict[str, str], float]]], name: str | None) -> float | None:
    series = metrics.get(name or "")
    return sum(v for _, v in series) / len(series) if series else None


def describe_acceptance(c: SpecCounters | None) -> str:
    """`72% accepted, 3.1 tokens/step` (one place for the words top and bench print)."""
    if c is None or c.acceptance_rate is None or c.tokens_per_step is None:
        return "-"
    return f"{c.acceptance_rate:.0%} accepted, {c.tokens_per_step:.2f} tokens/step"


# -- SGLang (engines/sglang.py renders it; docs/engines-research/sglang.md) ------------------------------------------

# vLLM method -> SGLang --speculative-algorithm (SpeculativeAlgorithm, images/engine-args/sglang-*-args.json)
SGLANG_ALGORITHMS = {
    "eagle": "EAGLE",
    "eagle3": "EAGLE3",
    "mtp": "NEXTN",  # EAGLE with the model's own MTP layers
    "draft_model": "STANDALONE",
    "ngram": "NGRAM",
    "dflash": "DFLASH",
    "dspark": "DSPARK",
}


def sglang_flags(spec: SpeculativeSettings, where: str = "recipe") -> list[str]:
    """SGLang's speculative flags for these settings: the algorithm, the draft and its revision, and the chain
    SGLang's own defaults use for one draft a step (steps = k, topk 1, draft tokens = k + 1: its (3, 1, 4))."""
    algorithm = SGLANG_ALGORITHMS.get(spec.method)
    if algorithm is None:
        raise ConfigError(
            Problem(
                where,
                "speculative.method",
                f"{spec.method} has no SGLang equivalent",
                f"use one of {', '.join(SGLANG_ALGORITHMS)} for SGLang",
            )
        )
    out = ["--speculative-algorithm", algorithm]
    if spec.model:
        out += ["--speculative-draft-model-path", spec.model]
    if spec.revision:
        out += ["--speculative-draft-model-revision", spec.revision]
    k = spec.num_speculative_tokens
    out += [
        "--speculative-num-steps",
        str(k),
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        str(k + 1),
    ]
    return out
