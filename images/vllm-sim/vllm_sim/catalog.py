"""Hardware and model parameters for the timing model, read from data/models.yaml.

Kept as data, not code, so that calibration changes numbers in one reviewed file and a new model is a
new YAML entry. An entry may name a `base` (a quantized checkpoint of another entry): it takes the base's
facts and overrides some (default_quantization). Unknown model names get the `default` profile: the sim
still serves whatever a recipe asks for, with any max_model_len, and says loudly that it does (engine.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

DATA_DIR = Path(__file__).resolve().parent / "data"
MODELS_FILE = DATA_DIR / "models.yaml"


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_gib: float
    mem_bw_gbs: float
    fabric_gbs: float
    allreduce_eager_us: float
    allreduce_graph_us: float
    piecewise_split_us: float
    default_max_num_batched_tokens: int
    default_max_num_seqs: int
    fitted: dict[str, float]


@dataclass(frozen=True)
class ModelProfile:
    name: str
    known: bool
    max_position_embeddings: int
    layers: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    kv_layers: int
    sliding_window: int | None
    experts: int
    experts_per_token: int
    params: dict[str, float]
    active_params: float
    default_quantization: str
    fitted: dict[str, Any] = field(default_factory=dict)
    moe_layers: int | None = None  # layers with routed experts (None: every layer)
    linear_attention_layers: int = 0  # e.g. Gated DeltaNet: a fixed state per sequence, no per-token KV
    kv_latent_dim: int | None = None  # MLA: elements cached per token and layer (one latent, no K/V heads)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0 and self.experts_per_token > 0

    @property
    def expert_layers(self) -> int:
        return self.layers if self.moe_layers is None else self.moe_layers

    @property
    def window_layers(self) -> int:
        """Sliding-window attention layers: those neither full attention nor linear attention."""
        return self.layers - self.kv_layers - self.linear_attention_layers


@dataclass(frozen=True)
class Catalog:
    hardware: dict[str, Hardware]
    models: dict[str, dict[str, Any]]
    quantization_bytes: dict[str, float]
    kv_cache_bytes: dict[str, float]

    @property
    def known_models(self) -> list[str]:
        return sorted(k for k in self.models if k != "default")

    def raw(self, key: str) -> dict[str, Any]:
        """An entry's facts, its base's first (a quantized checkpoint shares its base model's architecture)."""
        entry = dict(self.models[key])
        base = entry.pop("base", None)
        if base is None:
            return entry
        if base not in self.models or base == key:
            raise KeyError(f"models.yaml: {key}: base {base!r} is not another entry")
        merged = {k: v for k, v in self.raw(base).items() if k != "aliases"}
        merged.update(entry)
        return merged

    def model(self, name: str) -> ModelProfile:
        """Profile for a served model path or HF id; matches the id, an alias, or the last path part."""
        key = self._lookup(name)
        raw = self.raw(key or "default")
        return ModelProfile(
            name=key or "default",
            known=key is not None,
            max_position_embeddings=int(raw["max_position_embeddings"]),
            layers=int(raw["layers"]),
            hidden_size=int(raw["hidden_size"]),
            num_kv_heads=int(raw["num_kv_heads"]),
            head_dim=int(raw["head_dim"]),
            kv_layers=int(raw["kv_layers"]),
            sliding_window=raw.get("sliding_window"),
            experts=int(raw["experts"]),
            experts_per_token=int(raw["experts_per_token"]),
            params={k: float(v) for k, v in raw["params"].items()},
            active_params=float(raw["active_params"]),
            default_quantization=str(raw["default_quantization"]),
            fitted=dict(raw.get("fitted") or {}),
            moe_layers=int(raw["moe_layers"]) if raw.get("moe_layers") is not None else None,
            linear_attention_layers=int(raw.get("linear_attention_layers") or 0),
            kv_latent_dim=int(raw["kv_latent_dim"]) if raw.get("kv_latent_dim") else None,
        )

    def _lookup(self, name: str) -> str | None:
        wanted = name.rstrip("/").lower()
        tail = wanted.rsplit("/", 1)[-1]
        for key, raw in self.models.items():
            if key == "default":
                continue
            names = {key.lower(), key.lower().rsplit("/", 1)[-1]} | {a.lower() for a in raw.get("aliases", [])}
            if wanted in names or tail in names:
                return key
        return None

    def bytes_per_weight(self, quantization: str | None) -> float:
        if not quantization:
            return self.quantization_bytes["bf16"]
        q = quantization.lower()
        for key, value in self.quantization_bytes.items():
            if key in q:  # gpt_oss_mxfp4 -> mxfp4, awq_marlin -> awq, compressed-tensors -> (bf16)
                return float(value)
        return self.quantization_bytes["bf16"]

    def kv_bytes_per_element(self, kv_cache_dtype: str | None) -> float:
        return float(self.kv_cache_bytes.get((kv_cache_dtype or "auto").lower(), 2))


def _hardware(name: str, raw: dict[str, Any]) -> Hardware:
    ar = raw["allreduce_us"]
    return Hardware(
        name=name,
        memory_gib=float(raw["memory_gib"]),
        mem_bw_gbs=float(raw["mem_bw_gbs"]),
        fabric_gbs=float(raw["fabric_gbs"]),
        allreduce_eager_us=float(ar["eager"]),
        allreduce_graph_us=float(ar["cuda_graph"]),
        piecewise_split_us=float(ar["piecewise_split"]),
        default_max_num_batched_tokens=int(raw["default_max_num_batched_tokens"]),
        default_max_num_seqs=int(raw["default_max_num_seqs"]),
        fitted={k: float(v) for k, v in raw["fitted"].items()},
    )


def load_catalog(path: Path | str = MODELS_FILE) -> Catalog:
    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return Catalog(
        hardware={k: _hardware(k, v) for k, v in raw["hardware"].items()},
        models=raw["models"],
        quantization_bytes={k: float(v) for k, v in raw["quantization_bytes"].items()},
        kv_cache_bytes={k: float(v) for k, v in raw["kv_cache_bytes"].items()},
    )


@lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    return load_catalog()
