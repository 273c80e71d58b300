"""How long one engine step takes on a bandwidth-bound GPU (GB10: 273 GB/s unified memory).

A step runs every scheduled token (decodes and prefill chunks) through the model once. Its time is
the sum of:
- launch: per-layer Python/kernel-launch cost (large without CUDA graphs: `--enforce-eager`);
- memory: weights streamed once per step (dense parts + the distinct experts the batch routes to;
  TP=2 streams half per GPU) plus the KV cache the decodes read;
- compute: 2 x active params per token (prefill-heavy steps become compute-bound);
- communication (TP > 1): 2 all-reduces per layer; each pays a latency that depends on whether it
  runs eagerly (18 us over CX7) or inside a CUDA graph (46 us), seed 004, plus bytes / fabric bandwidth.
  TP=N > 2 (SIMULATED, not measured: no seed has four Sparks): a ring all-reduce takes 2(N-1) steps and
  each rank sends 2(N-1)/N of the payload, so the latency measured at N=2 (two steps) scales by N-1 and
  the bytes by 2(N-1)/N; both factors are 1 at N=2, so the calibrated TP=2 model is unchanged
  (docs/multinode.md derives it);
- per-sequence cost (sampling, scheduling, detokenizing) and a per-step cost for multi-GPU executors.
No overlap between memory and compute is assumed; the fitted efficiencies absorb it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .catalog import Catalog, Hardware, ModelProfile

GB = 1e9
WHOLE_MODEL_QUANTS = ("fp8", "int8", "int4", "awq", "gptq", "nvfp4", "compressed")


@dataclass(frozen=True)
class ExecConfig:
    """The parts of the serve configuration that change step time."""

    tp: int = 1
    quantization: str | None = None
    mxfp4_layers: frozenset[str] = frozenset()
    kv_cache_dtype: str = "auto"
    graph_mode: str = "full_and_piecewise"  # eager | piecewise | full_and_piecewise | full
    allreduce_split: bool = False  # vllm::all_reduce is a splitting op (eager all-reduce)


@dataclass(frozen=True)
class StepShape:
    """What a step computes, as the scheduler built it."""

    decode_seqs: int = 0
    decode_context: int = 0  # sum of context lengths of the decoding sequences
    prefill_tokens: int = 0
    prefill_attention: float = 0.0  # sum over prefill chunks of chunk x mean attended length
    num_seqs: int = 0
    verify_tokens: int = 0  # speculative decoding: the drafted tokens the target verifies beside each decode

    @property
    def tokens(self) -> int:
        return self.decode_seqs + self.prefill_tokens + self.verify_tokens


@lru_cache(maxsize=65536)
def distinct_experts(tokens: int, experts: int, per_token: int, knee: float, exponent: float) -> float:
    """Expected number of experts (per layer) that at least one of `tokens` routes to.

    Up to `knee` tokens route independently (uniform over the experts: a single decode reads k of E
    experts, two read about 2k). Past it, tokens of one batch increasingly pick the same experts, so the
    number of effectively independent routings grows as knee x (tokens / knee) ** exponent: the seeds'
    decode step time grows about 40% per doubling of the batch, not the 90% uniform routing would give,
    while a 1024-token prefill still reads every expert.
    """
    if tokens <= 0 or experts <= 0:
        return 0.0
    effective = tokens if tokens <= knee else knee * (tokens / knee) ** exponent
    return experts * (1.0 - (1.0 - per_token / experts) ** effective)


def ring_factors(ranks: int) -> tuple[float, float]:
    """(latency factor, bytes factor) of a ring all-reduce over `ranks` against the two-rank one measured:
    2(N-1) steps vs 2, and 2(N-1)/N of the payload sent per rank vs 1."""
    return float(ranks - 1), 2.0 * (ranks - 1) / ranks


class StepCostModel:
    """Turns a StepShape into seconds for one model on one kind of GPU."""

    def __init__(self, catalog: Catalog, hw: Hardware, model: ModelProfile, ex: ExecConfig):
        self.hw, self.model, self.ex = hw, model, ex
        f = hw.fitted
        self._bw = hw.mem_bw_gbs * GB * f["bw_efficiency"]
        tp_eff = f["tp_compute_efficiency"] if ex.tp > 1 else 1.0
        self._flops = f["prefill_tflops"] * 1e12 * ex.tp * tp_eff
        self._knee = float(model.fitted.get("routing_knee_tokens", 1.0))
        self._exponent = float(model.fitted.get("routing_exponent", 1.0))

        quant = (ex.quantization or model.default_quantization).lower()
        b_quant = catalog.bytes_per_weight(quant)
        b_bf16 = catalog.bytes_per_weight("bf16")
        whole = any(q in quant for q in WHOLE_MODEL_QUANTS)
        layers = ex.mxfp4_layers
        self.b_expert = b_quant
        self.b_attention = b_quant if whole or {"qkv", "o"} & layers else b_bf16
        self.b_lm_head = b_quant if whole or "lm_head" in layers else b_bf16
        self.b_other = b_quant if (whole or not model.is_moe) else b_bf16
        p = model.params
        self.dense_bytes = p["attention"] * self.b_attention + p["lm_head"] * self.b_lm_head + p["other"] * self.b_other
        self.expert_bytes = p["expert_per_layer"] * self.b_expert  # one expert in one layer

        kv_elem = catalog.kv_bytes_per_element(ex.kv_cache_dtype)
        if model.kv_latent_dim:  # MLA: one latent per token and layer, the same on every TP rank
            per_layer = model.kv_latent_dim * kv_elem
        else:  # K and V heads, split over the TP ranks
            per_layer = 2 * model.num_kv_heads * model.head_dim * kv_elem / ex.tp
        self.kv_bytes_full = per_layer * model.kv_layers  # per token and GPU, growing layers
        self.kv_bytes_window = per_layer * model.window_layers  # per token and GPU, sliding layers

    # -- memory sizes (used by the scheduler's KV budget too) -----------------------------------------
    def weight_bytes_total(self) -> float:
        """All weights one GPU holds (embedding included; every expert resident)."""
        m = self.model
        experts = m.expert_layers * m.experts * self.expert_bytes
        return (self.dense_bytes + m.params["embedding"] * self.b_lm_head + experts) / self.ex.tp

    def kv_bytes_per_token(self) -> float:
        """KV bytes per token per GPU, counting sliding-window layers as full (vLLM pages both)."""
        return self.kv_bytes_full + self.kv_bytes_window

    # -- step time --------------------------------------------------------------------------------
    def breakdown(self, s: StepShape) -> dict[str, float]:
        m, hw, ex, f = self.model, self.hw, self.ex, self.hw.fitted
        t = s.tokens
        if t == 0:
            return {}
        eager = ex.graph_mode == "eager"
        decode_only = s.prefill_tokens == 0
        full_graph = ex.graph_mode in ("full", "full_and_piecewise") and decode_only

        launch = m.layers * (f["launch_us_per_layer_eager"] if eager else f["launch_us_per_layer_graph"]) * 1e-6

        experts = distinct_experts(t, m.experts, m.experts_per_token, self._knee, self._exponent) if m.is_moe else 0.0
        weights = (self.dense_bytes + m.expert_layers * experts * self.expert_bytes) / ex.tp
        window = m.sliding_window or 0
        kv = (
            s.decode_context * self.kv_bytes_full + min(s.decode_context, s.decode_seqs * window) * self.kv_bytes_window
        )
        memory = (weights + kv) / self._bw

        attn_flops = 4.0 * m.kv_layers * m.hidden_size * s.prefill_attention
        compute = (2.0 * m.active_params * t + attn_flops) / self._flops

        comm = 0.0
        if ex.tp > 1:
            n_ar = 2 * m.layers + 1
            if eager:
                lat = hw.allreduce_eager_us
            elif ex.allreduce_split and not full_graph:
                lat = hw.allreduce_eager_us + hw.piecewise_split_us
            else:
                lat = hw.allreduce_graph_us
            payload = t * m.hidden_size * 2.0  # bf16 activations
            steps, share = ring_factors(ex.tp)
            comm = (
                n_ar * (lat * steps * 1e-6 + share * payload / (hw.fabric_gbs * GB)) + f["distributed_step_us"] * 1e-6
            )

        seqs = s.num_seqs * f["per_seq_us"] * 1e-6
        return {"launch": launch, "memory": memory, "compute": compute, "comm": comm, "seqs": seqs}

    def step_seconds(self, s: StepShape) -> float:
        return sum(self.breakdown(s).values())
