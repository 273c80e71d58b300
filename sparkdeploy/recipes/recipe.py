"""Recipes: what to serve and how (`recipes/*.yaml`), validated on load.

A recipe is resolved for one topology: the file's values, then `overrides.<topology>`, then `--set` values.
`ResolvedRecipe.sources` records where each value came from (`recipes show` prints it).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sparkdeploy import names, paths
from sparkdeploy.config.guard_settings import GuardSettings
from sparkdeploy.config.schema import Number, Whole, problems_from_validation
from sparkdeploy.config.userfile import load_yaml_file, parse_yaml_value
from sparkdeploy.errors import ConfigError, Invalid, Invalids, Problem, escape_controls
from sparkdeploy.images.image_ref import is_reference, reference_error
from sparkdeploy.recipes import eugr, sparkrun

# Each set of names is one Literal (what the schema and mypy check) and the tuple of its values (for messages).
TopologyName = Literal["solo", "cluster", "2xsolo", "replicas"]
TOPOLOGIES: tuple[str, ...] = get_args(TopologyName)
# replicas is R cluster engines behind the proxy: a recipe that lists cluster may run it, with cluster's overrides.
MULTI_NODE_ENGINES = ("cluster", "replicas")
# The engine a recipe serves with (recipes/engines/: one module each, registered in ENGINES there).
EngineName = Literal["vllm", "sglang", "llamacpp"]
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)
BackendName = Literal["ray", "torchrun", "native"]
BACKENDS: tuple[str, ...] = get_args(BackendName)
RoutingStrategy = Literal[
    "simple-shuffle",
    "least-busy",
    "usage-based-routing",
    "usage-based-routing-v2",
    "latency-based-routing",
    "cost-based-routing",
]
ROUTING_STRATEGIES: tuple[str, ...] = get_args(RoutingStrategy)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # matched in full, as every name here
# Values that belong in the secrets file, never in a recipe (recipes are shared and printed).
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|API_KEY|MASTER_KEY)\Z", re.IGNORECASE)
LEAST_BUSY_WARNING = (
    "litellm.routing_strategy least-busy starves one of two identical backends: the seeds measured -68% decode "
    "(338 vs 568 t/s) and -59% prefill (4,982 vs 12,064 t/s) at c64 against simple-shuffle on two Sparks"
)
SPARK_MEMORY_GB = 128
SET_KEY = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
MAX_SET_PARTS = 8
# A model id / served name: a Hugging Face repo id or a path-like name, printable, no spaces or control chars.
MODEL_NAME = re.compile(r"[A-Za-z0-9/][A-Za-z0-9._:/@+-]{0,255}")
# vLLM flags that carry a secret: they belong in the secrets file (HF_TOKEN), never on a command line.
# (SGLang's --admin-api-key likewise: every engine's key comes from the secrets file.)
SECRET_FLAGS = ("--api-key", "--hf-token", "--ssl-keyfile-password", "--admin-api-key")
# A GGUF file inside its model repo: a relative path, no '..', ending .gguf.
GGUF_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*(/[A-Za-z0-9_][A-Za-z0-9._+-]*)*\.gguf")
# Upper bounds of the recipe's numbers: far above any real value, so a typo (a 31-digit max_model_len) is refused
# with the bound instead of reaching vLLM's command line or the memory fit.
MAX_TOKENS = 1 << 24  # 16,777,216: above the longest context any model offers (10M, Llama 4 Scout)
MAX_NUM_SEQS = 1 << 16  # vLLM's default is 256 to 1024 sequences per step
MAX_ARCH = 4096  # heads or layers: the largest models have 128 heads and ~130 layers
MAX_RETRIES = 100
MAX_WEIGHTS_GB = 100_000.0
MAX_PROXY_SECONDS = 7 * 24 * 3600.0  # a LiteLLM timeout or cooldown


def _plain(v: str) -> str:
    """A recipe or image name is short and plain: it lands in file names, labels and shell lines."""
    return names.check("plain", v)


class CompilationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    eager_allreduce: bool = Field(
        default=False,
        description="Cut CUDA graphs at vllm::all_reduce so NCCL runs eagerly (18 us vs 46 us at 4 KiB over CX7).",
    )
    cudagraph_mode: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)


def checked_extra_args(v: Any) -> Any:
    """An engine's extra_args: plain one-line strings (numbers written as text), never a secret flag."""
    if isinstance(v, list):
        v = [str(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x for x in v]
        for arg in v:
            flag = arg.split("=", 1)[0] if isinstance(arg, str) else ""
            if flag in SECRET_FLAGS:
                raise Invalid(
                    f"{flag} would put a secret on the command line (visible in ps and logs)",
                    "remove it; put HF_TOKEN in the inventory's secrets file (the proxy's LITELLM_MASTER_KEY "
                    "protects the public endpoint)",
                )
            if isinstance(arg, str) and (len(arg) > 1024 or any(ord(c) < 32 for c in arg)):
                raise Invalid("an argument is one line of at most 1024 characters", "check the value")
    return v


class VllmSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu_memory_utilization: Number = Field(default=0.70, gt=0.0, le=0.95)
    max_model_len: Whole | None = Field(default=None, gt=0, le=MAX_TOKENS)
    kv_cache_dtype: str | None = None
    enforce_eager: bool = False
    max_num_batched_tokens: Whole | None = Field(default=None, gt=0, le=MAX_TOKENS)
    max_num_seqs: Whole | None = Field(default=None, gt=0, le=MAX_NUM_SEQS)
    quantization: str | None = None
    load_format: str | None = None
    dtype: str | None = None
    trust_remote_code: bool = False
    compilation: CompilationSettings = Field(default_factory=CompilationSettings)
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("extra_args", mode="before")
    @classmethod
    def _extra_args(cls, v: Any) -> Any:
        return checked_extra_args(v)


class SglangSettings(BaseModel):
    """`engine: sglang`: `python3 -m sglang.launch_server` (recipes/engines/sglang.py writes the line)."""

    model_config = ConfigDict(extra="forbid")

    # SGLang's --mem-fraction-static is a fraction of the memory FREE when it starts (not of the total, as vLLM's
    # gpu_memory_utilization): the budget treats it as a fraction of the total, which on an idle node (free =
    # total - the OS) over-counts by the OS's share: conservative.
    mem_fraction_static: Number = Field(default=0.70, gt=0.0, le=0.95)
    context_length: Whole | None = Field(default=None, gt=0, le=MAX_TOKENS)
    max_running_requests: Whole | None = Field(default=None, gt=0, le=MAX_NUM_SEQS)
    chunked_prefill_size: Whole | None = Field(default=None, gt=0, le=MAX_TOKENS)
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    attention_backend: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    trust_remote_code: bool = False
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("extra_args", mode="before")
    @classmethod
    def _extra_args(cls, v: Any) -> Any:
        return checked_extra_args(v)


class LlamacppSettings(BaseModel):
    """`engine: llamacpp`: llama-server with a GGUF that `models pull` brought (recipes/engines/llamacpp.py)."""

    model_config = ConfigDict(extra="forbid")

    # The GGUF inside the model repo; of a split model (name-00001-of-00003.gguf) the first file: llama-server
    # reads the others beside it.
    gguf: str
    # What `models pull` downloads of the repo (one quant of many): default the folder or file of `gguf`.
    include: list[str] = Field(default_factory=list)
    n_gpu_layers: Whole = Field(default=999, ge=0, le=MAX_ARCH)
    ctx_size: Whole | None = Field(default=None, gt=0, le=MAX_TOKENS)
    parallel: Whole | None = Field(default=None, gt=0, le=MAX_NUM_SEQS)
    jinja: bool = True  # the model's chat template, so tool calls work
    flash_attn: Literal["on", "off", "auto"] = "on"
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    reasoning_format: str | None = None
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("gguf")
    @classmethod
    def _gguf(cls, v: str) -> str:
        if len(v) > 256 or not GGUF_FILE.fullmatch(v) or ".." in v.split("/"):
            raise Invalid(
                "must be a .gguf file inside the model repo, e.g. UD-Q4_K_XL/model-00001-of-00002.gguf",
                "check the repo's file list",
            )
        return v

    @field_validator("include")
    @classmethod
    def _include(cls, v: list[str]) -> list[str]:
        for pattern in v:
            if not pattern or len(pattern) > 256 or any(ord(c) < 32 for c in pattern) or pattern.startswith("-"):
                raise Invalid("an include is a file pattern of the repo, e.g. 'Q4_K_M/*'", "check it")
        return v

    @field_validator("extra_args", mode="before")
    @classmethod
    def _extra_args(cls, v: Any) -> Any:
        return checked_extra_args(v)


# An engine of a model that has others (2xsolo, replicas, a stack's): LiteLLM cools it down at its first failure
# (model_info.allowed_fails), so the request's retry and the next requests go to another engine, never twice to
# one that stopped (measured in the lab: a frozen engine of two, 4 of 1385 requests answered 500 with the router's
# default, 0 of 583 with this; tests/guard/test_watch_lab.py). LiteLLM keeps its own safety net for a model with
# one engine (no cooldown), which this leaves alone.
FAILOVER_ALLOWED_FAILS = 0


class LiteLLMSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    routing_strategy: RoutingStrategy = "simple-shuffle"
    num_retries: Whole = Field(default=2, ge=0, le=MAX_RETRIES)
    timeout: Number = Field(default=600, gt=0, le=MAX_PROXY_SECONDS)
    allowed_fails: Whole = Field(default=3, ge=0, le=MAX_RETRIES)
    cooldown_time: Number = Field(default=30, ge=0, le=MAX_PROXY_SECONDS)
    # One worker keeps least-busy's in-flight counters in one process (they are per worker otherwise).
    num_workers: Whole = Field(default=1, ge=1, le=64)

    def router_settings(self) -> dict[str, Any]:
        """LiteLLM's `router_settings` for these values (a 2xsolo/replicas proxy's config; a stack's gateway's)."""
        return self.model_dump(include={"routing_strategy", "num_retries", "timeout", "allowed_fails", "cooldown_time"})


class Architecture(BaseModel):
    """What the model allows a layout to split: TP divides the attention heads (and the KV heads, or is a
    multiple of them: vLLM then replicates each KV head), PP divides the layers into stages."""

    model_config = ConfigDict(extra="forbid")

    attention_heads: Whole = Field(gt=0, le=MAX_ARCH)
    kv_heads: Whole = Field(gt=0, le=MAX_ARCH)
    layers: Whole = Field(gt=0, le=MAX_ARCH)
    # For the KV cache estimate (memory budget): bytes per token = 2 x kv_layers x kv_heads x head_dim x dtype.
    head_dim: Whole | None = Field(default=None, gt=0, le=MAX_ARCH)  # config.json head_dim (or hidden/heads)
    # Layers whose KV cache grows with the context: sliding-window and linear-attention layers do not (gpt-oss
    # alternates 128-token windows with full attention; Qwen3.5 mixes linear attention). Unset: every layer.
    kv_layers: Whole | None = Field(default=None, gt=0, le=MAX_ARCH)
    source: str | None = None  # where these figures come from (the model's config.json URL)
    # Multi-token-prediction layers the checkpoint carries (config.json num_nextn_predict_layers or
    # mtp_num_hidden_layers): speculative method mtp drafts with them; 0 or unset with an architecture: it cannot.
    mtp_layers: Whole | None = Field(default=None, ge=0, le=MAX_ARCH)

    @model_validator(mode="after")
    def _consistent(self) -> Architecture:
        if self.kv_layers is not None and self.kv_layers > self.layers:
            raise Invalid(
                f"kv_layers {self.kv_layers} is more than layers {self.layers}",
                "count only the layers with full attention in the model's config.json",
            )
        if self.attention_heads % self.kv_heads:
            raise Invalid(
                f"attention_heads {self.attention_heads} is not a multiple of kv_heads {self.kv_heads}",
                "copy both from the model's config.json (num_attention_heads, num_key_value_heads)",
            )
        return self


MAX_SPECULATIVE_TOKENS = 64  # far above the 1 to 8 drafts per step any published recipe uses
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")  # a Hugging Face branch, tag or commit


class SpeculativeSettings(BaseModel):
    """Speculative decoding (a recipe's `speculative:`): rendered as vLLM's --speculative-config JSON by
    recipes/speculative.py, which checks the method and options against the pinned vLLM's own SpeculativeConfig.
    The draft (`model`, its `weights_gb` and `architecture`) is part of the model: pulled with it and counted in
    the memory budget (docs/speculative.md)."""

    model_config = ConfigDict(extra="forbid")

    method: str = Field(description="vLLM's method name: eagle3, mtp, ngram, draft_model, ... (its SpeculativeMethod)")
    model: str | None = None  # the draft model or EAGLE head (Hugging Face id); none for ngram, suffix, mtp
    revision: str | None = None  # the draft's revision (branch, tag or commit)
    num_speculative_tokens: Whole = Field(gt=0, le=MAX_SPECULATIVE_TOKENS)
    weights_gb: Number | None = Field(default=None, gt=0, le=MAX_WEIGHTS_GB)  # the draft's weights in memory
    architecture: Architecture | None = None  # the draft's config.json figures: its KV cache in the budget
    options: dict[str, Any] = Field(default_factory=dict)  # the method's own SpeculativeConfig fields

    @field_validator("method")
    @classmethod
    def _method(cls, v: str) -> str:
        return _plain(v)

    @field_validator("model")
    @classmethod
    def _draft_model(cls, v: str | None) -> str | None:
        if v is not None and (not MODEL_NAME.fullmatch(v) or ".." in v.split("/")):
            raise Invalid("must be a model name like org/draft-model", "check the value")
        return v

    @field_validator("revision")
    @classmethod
    def _revision(cls, v: str | None) -> str | None:
        if v is not None and (not REVISION.fullmatch(v) or ".." in v):
            raise Invalid("must be a branch, tag or commit (letters, digits, '._/-')", "check the value")
        return v

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, value in v.items():
            if not re.fullmatch(r"[a-z_][a-z0-9_]{0,63}", str(key)):
                raise Invalid(f"{key!r} is not an option name", "use vLLM's SpeculativeConfig field names")
            if isinstance(value, str) and (len(value) > 256 or any(ord(c) < 32 for c in value)):
                raise Invalid(f"{key}: a value is one line of at most 256 characters", "check the value")
        return v


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    model: str
    served_model_name: str | None = None
    image: str
    topologies: list[TopologyName] = Field(min_length=1)
    default_topology: TopologyName
    engine: EngineName = "vllm"
    cluster_backend: BackendName = "ray"
    fits_one_node: bool = True
    weights_gb: Number | None = Field(
        default=None, gt=0, le=MAX_WEIGHTS_GB, description="weights in memory, for the fit and preflight"
    )
    # Nodes per engine for cluster and replicas (--tp); unset: cluster spans every node, replicas pairs them.
    tensor_parallel: Whole | None = Field(default=None, ge=1, le=64)
    architecture: Architecture | None = None  # from the model's config.json: checks TP/PP layouts before anything runs
    vllm: VllmSettings = Field(default_factory=VllmSettings)
    sglang: SglangSettings | None = None  # engine: sglang (unset: SGLang's settings' defaults)
    llamacpp: LlamacppSettings | None = None  # engine: llamacpp (required there: the GGUF file)
    env: dict[str, str] = Field(default_factory=dict)
    litellm: LiteLLMSettings = Field(default_factory=LiteLLMSettings)
    overrides: dict[TopologyName, dict[str, Any]] = Field(default_factory=dict)
    guard: GuardSettings | None = None  # the memory guard's lines for this model, over the inventory's cluster.guard
    speculative: SpeculativeSettings | None = None  # a draft proposes tokens the model verifies (docs/speculative.md)

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        """An image definition's name (images/<name>/), or a registry reference (images/image_ref.py)."""
        if is_reference(v):
            error = reference_error(v)
            if error:
                raise error
            return v
        return _plain(v)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        return _plain(v)

    @field_validator("model", "served_model_name")
    @classmethod
    def _model_name(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not MODEL_NAME.fullmatch(v) or ".." in v.split("/"):
            raise Invalid(
                "must be a model name like org/model (letters, digits, '._:/@+-'; at most 256; no spaces, "
                "newlines or escapes; not starting with '-')",
                "check the value",
            )
        return v

    @field_validator("description")
    @classmethod
    def _description(cls, v: str) -> str:
        if len(v) > 500 or any(ord(c) < 32 or ord(c) == 127 for c in v):
            raise Invalid(
                "a description is one line of at most 500 characters",
                "shorten it",
            )
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        out = {}
        for key, value in v.items():
            if not ENV_NAME.fullmatch(str(key)):
                raise Invalid(
                    f"{key!r} is not an environment variable name",
                    "use letters, digits and _",
                )
            if SECRET_NAME.search(str(key)):
                raise Invalid(
                    f"{key} looks like a secret",
                    "put it in the inventory's secrets file",
                )
            if isinstance(value, bool):
                value = "1" if value else "0"
            value = str(value)
            if "\n" in value or "\0" in value:
                raise Invalid(
                    f"{key}: a value cannot hold a newline",
                    "write it on one line",
                )
            out[str(key)] = value
        return out

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        problems: list[Invalid] = []
        if self.default_topology not in self.topologies:
            problems.append(
                Invalid.at(
                    "default_topology",
                    f"{self.default_topology} is not in topologies",
                    f"pick one of {', '.join(self.topologies)}",
                )
            )
        if not self.fits_one_node:
            single = [t for t in self.topologies if t in ("solo", "2xsolo")]
            if single:
                problems.append(
                    Invalid.at(
                        "topologies",
                        f"{', '.join(single)} need the model on one node, and fits_one_node is false",
                        "list only cluster",
                    )
                )
        if self.engine == "llamacpp" and self.llamacpp is None:
            problems.append(
                Invalid.at("llamacpp", "engine llamacpp needs the GGUF file", "add llamacpp: {gguf: FILE.gguf}")
            )
        for other in ("sglang", "llamacpp"):
            if getattr(self, other) is not None and self.engine != other:
                problems.append(
                    Invalid.at(other, f"settings of another engine (engine is {self.engine})", f"remove {other}")
                )
        for topo in self.overrides:
            if topo not in self.topologies and not (topo == "replicas" and "cluster" in self.topologies):
                problems.append(
                    Invalid.at(
                        "overrides",
                        f"{topo} is not in topologies",
                        f"remove overrides.{topo}",
                    )
                )
        if problems:
            raise Invalids(problems)
        return self

    @property
    def public_name(self) -> str:
        return self.served_model_name or self.model


@dataclass
class ResolvedRecipe:
    """A recipe for one topology: validated values plus where each came from and warnings to show."""

    recipe: Recipe
    topology: str
    backend: str
    source: Path
    sources: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.recipe.name


# -- loading ---------------------------------------------------------------------------------------------


def recipe_files(recipes_dir: str | None = None) -> dict[str, Path]:
    """name -> file; a name in an earlier directory hides the same name in a later one."""
    found: dict[str, Path] = {}
    if recipes_dir and not Path(recipes_dir).expanduser().is_dir():
        raise ConfigError(
            Problem(
                str(recipes_dir), "", "--recipes-dir is not a folder", "pass a folder that holds your recipes (*.yaml)"
            )
        )
    for directory in paths.recipe_dirs(recipes_dir):
        if directory.is_dir():
            for path in sorted(directory.glob("*.yaml")):
                found.setdefault(path.stem, path)
    return found


def find_recipe(name: str, recipes_dir: str | None = None) -> Path:
    files = recipe_files(recipes_dir)
    if name in files:
        return files[name]
    close = get_close_matches(name, list(files), n=3, cutoff=0.4)
    fix = f"did you mean {', '.join(close)}?" if close else "see: sparkdeploy recipes list"
    raise ConfigError(Problem("recipes/", name, "no such recipe", fix))


def read_recipe_data(path: Path) -> dict[str, Any]:
    data = load_yaml_file(path, "recipe")
    if not isinstance(data, dict):
        raise ConfigError(
            Problem(str(path), "", "a recipe is a mapping of keys", "see recipes/openai-gpt-oss-120b.yaml")
        )
    return data


def parse_set(pairs: list[str] | tuple[str, ...]) -> list[tuple[str, Any]]:
    """`--set vllm.max_model_len=8192` -> [("vllm.max_model_len", 8192)]; values are YAML scalars or lists."""
    out = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key or not SET_KEY.fullmatch(key) or len(key) > 200 or key.count(".") >= MAX_SET_PARTS:
            raise ConfigError(
                Problem(
                    "--set",
                    key[:60],
                    f"expects KEY=VALUE with a dotted key of at most {MAX_SET_PARTS} parts",
                    "e.g. --set vllm.max_model_len=8192",
                )
            )
        value = parse_yaml_value(raw, f"--set {key}") if raw != "" else ""
        out.append((key, value))
    return out


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(Problem("--set", key, f"{part} is not a mapping", "set a leaf value"))
        node = child
    node[parts[-1]] = value


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) is replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def validate(data: dict[str, Any], source: str) -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, source, Recipe)) from None


def recipe_path(name_or_path: str, recipes_dir: str | None = None) -> Path:
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = find_recipe(name_or_path, recipes_dir)
    return path


def read_any(
    path: Path,
    set_values: list[tuple[str, Any]] = (),  # type: ignore[assignment]
) -> tuple[dict[str, Any], list[tuple[str, Any]], eugr.Imported | None]:
    """A recipe file's data as a sparkdeploy recipe: ours as written, an eugr v1 recipe (`recipe_version`)
    mapped by eugr.py, its placeholders filled from defaults then from the --set values that name them. Returns
    the data, the --set values left for the recipe itself, and the import (None for ours). A sparkrun v2 recipe
    whose runtime is sglang or llama-cpp is mapped by sparkrun.py."""
    data = read_recipe_data(path)
    if sparkrun.is_sparkrun(data):  # a sparkrun v2 recipe of SGLang or llama.cpp (sparkrun.py)
        imported = sparkrun.to_recipe_data(data, path)
        return imported.data, list(set_values), imported
    if not eugr.is_eugr(data):
        return data, list(set_values), None
    raw, params, rest, dropped = eugr.split_sets(data, list(set_values))

    def check(made: dict[str, Any]) -> list[Problem]:  # the schema's problems, reported with the import's in one pass
        try:
            validate(made, str(path))
        except ConfigError as exc:
            return exc.problems
        return []

    imported = eugr.to_recipe_data(raw, path, params, dropped, check, {key for key, _ in rest})
    return imported.data, rest, imported


def load_recipe(name_or_path: str, recipes_dir: str | None = None) -> tuple[Recipe, Path, dict[str, Any]]:
    """The recipe as written (overrides not applied), its file, and its raw data."""
    path = recipe_path(name_or_path, recipes_dir)
    data, _, imported = read_any(path)
    return _validated_file(data, path, imported), path, data


def _validated_file(data: dict[str, Any], path: Path, imported: eugr.Imported | None) -> Recipe:
    """The file's recipe before --set: valid, and (ours) named after its file."""
    recipe = validate(data, str(path))
    if imported is None and recipe.name != path.stem:
        raise ConfigError(
            Problem(str(path), "name", f"{recipe.name!r} differs from the file name", f"set name: {path.stem}")
        )
    return recipe


def resolve(
    name_or_path: str,
    topology: str | None = None,
    backend: str | None = None,
    sets: list[str] | tuple[str, ...] = (),
    recipes_dir: str | None = None,
) -> ResolvedRecipe:
    path = recipe_path(name_or_path, recipes_dir)
    data, set_values, imported = read_any(path, parse_set(sets))
    _validated_file(data, path, imported)
    # --set applies to the whole recipe first, so it can also change topologies or overrides.
    raw = copy.deepcopy(data)
    for key, value in set_values:
        _set_dotted(raw, key, value)
    recipe = validate(raw, f"{path} (with --set)" if set_values else str(path))
    topo = topology or recipe.default_topology
    check_topology(recipe, topo, path)
    base = {k: v for k, v in raw.items() if k != "overrides"}
    overrides = raw.get("overrides") or {}
    topo_override = overrides.get(topo) or {}
    if topo == "replicas":  # each replica is a cluster engine: cluster's overrides, then replicas' own
        topo_override = deep_merge(overrides.get("cluster") or {}, topo_override)
    merged = deep_merge(base, topo_override)
    merged["overrides"] = raw.get("overrides") or {}
    for key, value in set_values:  # --set wins over the topology override
        if not key.startswith("overrides."):
            _set_dotted(merged, key, value)
    final = validate(merged, f"{path} (overrides.{topo})")

    sources: dict[str, str] = {}
    defaults = _leaves(
        Recipe.model_validate(
            {k: raw[k] for k in ("name", "description", "model", "image", "topologies", "default_topology")}
        ).model_dump(exclude={"overrides"})
    )
    for key in defaults:
        sources[key] = "default"
    for key in _leaves(base):
        sources[key] = path.name
    for key in _leaves(topo_override):
        sources[key] = f"{path.name} overrides.{topo}"
    for key, _ in set_values:
        if not key.startswith("overrides."):
            for leaf in _leaves({key: None}):
                sources[leaf] = "--set"
    chosen_backend = backend or final.cluster_backend
    if backend and backend not in BACKENDS:
        raise ConfigError(Problem("--backend", backend, "unknown backend", f"one of {', '.join(BACKENDS)}"))
    resolved = ResolvedRecipe(final, topo, chosen_backend if topo in MULTI_NODE_ENGINES else "", path, sources)
    if imported is not None:
        resolved.warnings += [
            escape_controls(f"eugr recipe {imported.eugr_name!r}: {note}") for note in imported.not_carried
        ]
    if backend and topo not in MULTI_NODE_ENGINES:
        resolved.warnings.append(f"--backend {backend} applies to the cluster topology only; {topo} ignores it")
    if topo in ("2xsolo", "replicas") and final.litellm.routing_strategy == "least-busy":
        resolved.warnings.append(LEAST_BUSY_WARNING)
    if final.vllm.compilation.eager_allreduce and final.vllm.enforce_eager:
        resolved.warnings.append(
            "vllm.compilation.eager_allreduce has no effect with vllm.enforce_eager: true (no CUDA graphs are captured)"
        )
    return resolved


def check_topology(recipe: Recipe, topology: str, path: Path) -> None:
    if topology not in TOPOLOGIES:
        close = get_close_matches(topology, TOPOLOGIES, n=1)
        fix = f"did you mean {close[0]}?" if close else f"one of {', '.join(TOPOLOGIES)}"
        raise ConfigError(Problem("--topology", topology, "unknown topology", fix))
    if topology in recipe.topologies or (topology == "replicas" and "cluster" in recipe.topologies):
        return
    if topology in ("solo", "2xsolo") and not recipe.fits_one_node:
        need = f"needs about {recipe.weights_gb:g} GB for its weights alone" if recipe.weights_gb else "does not fit"
        raise ConfigError(
            Problem(
                str(path),
                "topologies",
                f"{recipe.name} {need}, more than one DGX Spark's {SPARK_MEMORY_GB} GB of unified memory, so "
                f"{topology} (a whole copy of the model per node) cannot run it",
                "use --topology cluster (TP=2 splits the weights across both nodes)",
            )
        )
    raise ConfigError(
        Problem(
            str(path),
            "topologies",
            f"{recipe.name} does not support {topology}",
            f"use one of {', '.join(recipe.topologies)}",
        )
    )
