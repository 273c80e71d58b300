"""The one memory budget of an engine on a node: what vLLM takes, what must fit inside it, what the node has.

vLLM reserves `gpu_memory_utilization x total` when it starts (the pool it allocates from; on a DGX Spark the
GPU's memory is the node's unified memory). Inside that reservation go the node's share of the weights, the
compile/activation peak of its profile run and the KV cache; the KV cache gets what is left, and the engine
refuses to start when that cannot hold one sequence of max_model_len. Outside it the node keeps the OS
reserve. So:

- the node fits when its free memory >= util x total + OS reserve (what preflight and doctor's gpu.memory
  check, one formula: sparkdeploy/doctor/gpu.py `memory`);
- the engine starts when weights + peak + KV of one max_model_len sequence <= util x total;
- full concurrency (max_num_seqs sequences of max_model_len at once) fits when the KV room holds them all;
  otherwise vLLM still starts and queues/preempts (a note, not a failure).

Every figure is in bytes. Where each comes from (docs/memory-budget.md):
- weights: the recipe's weights_gb (GB, 10^9 bytes) / the number of nodes the engine spans, plus a speculative
  draft's `speculative.weights_gb` / its tensor parallel size (vLLM's draft_tensor_parallel_size, by default the
  engine's): the draft is loaded into the same pool (docs/speculative.md);
- KV bytes per token and node: 2 (K and V) x kv_layers x max(1, kv_heads / engine size) x head_dim x dtype
  bytes (kv_cache_dtype fp8*: 1, otherwise 2), from the recipe's architecture (its config.json); a recipe
  without architecture facts gets no KV figure and the budget says it is an estimate without one; a speculative
  draft adds its own KV per token the same way (its `speculative.architecture`), and mtp drafting from the
  model's own `architecture.mtp_layers` adds those layers' KV;
- max_num_seqs: the recipe's, else the engine's default (vLLM's 256; recipes/engines/ `Reservation`);
- the compile/activation peak: PEAK_BYTES, a constant estimate (see its comment);
- the OS reserve: OS_RESERVE_BYTES;
- total and free: the node's facts (nvidia-smi where it reports numbers, the lab's stand-in included, which is
  SIMULATED; else /proc/meminfo MemTotal and MemAvailable, as on a DGX Spark where nvidia-smi says [N/A]), or,
  without a node, DGX_SPARK_TOTAL_BYTES.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkdeploy.recipes.engines.registered import engine_of
from sparkdeploy.recipes.recipe import Architecture, Recipe

if TYPE_CHECKING:  # annotations only: the facts package pulls in SSH (paramiko), which a dry run from a wheel lacks
    from sparkdeploy.facts import NodeFacts

GIB = 2**30
MIB = 2**20
OS_RESERVE_BYTES = 8 * GIB  # the OS, Docker, page cache and the engine's process outside vLLM's pool
# vLLM's profile run peak (activations at max_num_batched_tokens, CUDA graphs, torch.compile workspace, NCCL
# buffers) on top of the weights. An estimate, not a GB10 measurement: vLLM logs the real figure at start
# ("torch peak memory increase" + "non-torch forward increase memory" in its memory profiling line); replace
# it with a Spark's figure when one is recorded.
PEAK_BYTES = 4 * GIB
# A DGX Spark without a node to ask: the figure this project's captured meminfo and lab stand-in carry
# (nvidia-smi memory.total 122570 MiB, MemTotal 125513728 kB: 119.7 GiB of the 128 GB unified memory).
DGX_SPARK_TOTAL_BYTES = 122570 * MIB
MAX_UTILIZATION = 0.95  # recipes.VllmSettings' upper bound


def kv_dtype_bytes(kv_cache_dtype: str | None) -> int:
    return 1 if (kv_cache_dtype or "").startswith("fp8") else 2


@dataclass
class Budget:
    node: str
    total: int  # the pool vLLM's utilization multiplies
    free: int | None  # free now (None: not read)
    source: str  # where total/free come from
    util: float
    weights: int | None  # this node's share (None: the recipe has no weights_gb)
    engine_size: int
    kv_per_token: int | None  # None: no architecture facts
    max_model_len: int | None
    max_num_seqs: int
    peak: int = PEAK_BYTES
    os_reserve: int = OS_RESERVE_BYTES
    simulated: bool = False
    notes: list[str] = field(default_factory=list)
    draft_weights: int = 0  # the speculative draft's share, included in weights
    draft_kv_per_token: int = 0  # the draft's (or MTP layers') KV a token, included in kv_per_token
    # the recipe fields of the engine's reservation and longest sequence, named in the advice
    util_field: str = "vllm.gpu_memory_utilization"
    length_field: str = "vllm.max_model_len"

    @property
    def reserve(self) -> int:
        """What vLLM takes at start: util x total."""
        return int(self.util * self.total)

    @property
    def need(self) -> int:
        """Free memory the node needs before the engine starts."""
        return self.reserve + self.os_reserve

    @property
    def estimated(self) -> bool:
        """No KV figure: the recipe has no architecture facts (or no max_model_len, or no weights_gb)."""
        return self.kv_per_seq is None or self.weights is None

    @property
    def kv_per_seq(self) -> int | None:
        if self.kv_per_token is None or self.max_model_len is None:
            return None
        return self.kv_per_token * self.max_model_len

    @property
    def kv_full(self) -> int | None:
        """KV cache of max_num_seqs sequences of max_model_len at once."""
        per = self.kv_per_seq
        return None if per is None else per * self.max_num_seqs

    @property
    def kv_room(self) -> int | None:
        """What vLLM's pool leaves for the KV cache after the weights and the peak."""
        return None if self.weights is None else self.reserve - self.weights - self.peak

    @property
    def starts(self) -> bool:
        """The weights, the peak and one max_model_len sequence fit inside util x total."""
        room = self.kv_room
        if room is None:
            return True  # nothing to say without weights_gb
        return room >= (self.kv_per_seq or 1)

    @property
    def node_fits(self) -> bool | None:
        return None if self.free is None else self.free >= self.need

    @property
    def fits(self) -> bool:
        return self.starts and self.node_fits is not False

    @property
    def full_sequences(self) -> int | None:
        """How many max_model_len sequences the KV room holds at once."""
        room, per = self.kv_room, self.kv_per_seq
        if room is None or per is None:
            return None
        return max(0, room // per)

    @property
    def start_util(self) -> float | None:
        """The smallest gpu_memory_utilization (two decimals, rounded up) at which the weights, the peak and one
        max_model_len sequence of KV fit inside util x total: the least share the engine starts with (None
        without weights_gb)."""
        if self.weights is None:
            return None
        want = self.weights + self.peak + (self.kv_per_seq or 0)
        return math.ceil(want / self.total * 100) / 100

    @property
    def suggestion(self) -> str:
        """The setting that would fit ('' when it fits as it is)."""
        if not self.starts:
            util = self.start_util
            assert util is not None  # starts is False only with weights
            usable = None if self.free is None else (self.free - self.os_reserve) / self.total
            if util <= MAX_UTILIZATION and (usable is None or util <= usable):
                return f"raise {self.util_field} to {util:.2f}"
            room = self.kv_room or 0
            if self.kv_per_token and room > self.kv_per_token * 256:
                return f"lower {self.length_field} to {room // self.kv_per_token // 256 * 256}"
            return "the weights do not fit one node's share: use a topology that splits them over more nodes (cluster)"
        if self.node_fits is False:
            assert self.free is not None
            util = math.floor((self.free - self.os_reserve) / self.total * 100) / 100
            lower = Budget(**{**self.__dict__, "util": util, "notes": []}) if util > 0 else None
            if lower is not None and lower.starts:
                return (
                    f"lower {self.util_field} to {util:.2f} (the most this node's free memory allows), "
                    "or free memory on the node"
                )
            return "free memory on the node (stop what holds it), or use a topology that splits the weights (cluster)"
        return ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "source": self.source,
            "simulated": self.simulated,
            "total_bytes": self.total,
            "free_bytes": self.free,
            "gpu_memory_utilization": self.util,
            "reserve_bytes": self.reserve,
            "weights_bytes": self.weights,
            "engine_size": self.engine_size,
            "kv_bytes_per_token": self.kv_per_token,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "kv_per_seq_bytes": self.kv_per_seq,
            "kv_full_bytes": self.kv_full,
            "kv_room_bytes": self.kv_room,
            "full_sequences": self.full_sequences,
            "peak_bytes": self.peak,
            "os_reserve_bytes": self.os_reserve,
            "need_bytes": self.need,
            "starts": self.starts,
            "node_fits": self.node_fits,
            "fits": self.fits,
            "estimated": self.estimated,
            "suggestion": self.suggestion,
            "draft_weights_bytes": self.draft_weights,
            "draft_kv_bytes_per_token": self.draft_kv_per_token,
            "notes": self.notes,
        }


def kv_bytes_per_token(recipe: Recipe, engine_size: int) -> int | None:
    """2 x kv_layers x max(1, kv_heads / engine size) x head_dim x dtype bytes: one node's share of one token.
    A TP group splits the KV heads (replicated when it is larger than them); PP splits the layers instead,
    which gives the same share."""
    arch = recipe.architecture
    if arch is None or arch.head_dim is None:
        return None
    layers = arch.kv_layers or arch.layers
    heads = max(1.0, arch.kv_heads / max(1, engine_size))
    return int(
        2 * layers * heads * arch.head_dim * kv_dtype_bytes(engine_of(recipe).reservation(recipe).kv_cache_dtype)
    )


def _arch_kv(arch: Architecture | None, layers: int | None, size: int, dtype: str | None) -> int | None:
    if arch is None or arch.head_dim is None or not layers:
        return None
    return int(2 * layers * max(1.0, arch.kv_heads / max(1, size)) * arch.head_dim * kv_dtype_bytes(dtype))


def draft_share(recipe: Recipe, engine_size: int) -> tuple[int, int, list[str]]:
    """(weights bytes, KV bytes a token, notes) of the recipe's speculative draft on one node of the engine."""
    spec = recipe.speculative
    if spec is None:
        return 0, 0, []
    notes: list[str] = []
    tp = spec.options.get("draft_tensor_parallel_size")
    size = tp if isinstance(tp, int) and tp > 0 else engine_size
    dtype = spec.options.get("kv_cache_dtype") or engine_of(recipe).reservation(recipe).kv_cache_dtype
    weights = int(spec.weights_gb * 1e9 / max(1, size)) if spec.weights_gb is not None else 0
    if spec.model:
        if spec.weights_gb is None:
            notes.append(f"the speculative draft {spec.model} has no weights_gb: its weights are not counted")
        arch = spec.architecture
        kv = _arch_kv(arch, (arch.kv_layers or arch.layers) if arch else None, size, dtype)
        if kv is None:
            notes.append(f"the speculative draft {spec.model} has no architecture: its KV cache is not counted")
        kv = kv or 0
        what = f"the speculative draft {spec.model}"
    else:
        arch = recipe.architecture
        kv = _arch_kv(arch, arch.mtp_layers if arch else None, size, dtype) or 0
        what = f"{spec.method} drafting from the model's own MTP layers"
    if weights or kv:
        notes.append(f"{what}: {gib(weights)} of weights and {kv / 1024:g} KiB a token of KV counted")
    return weights, kv, notes


def estimate(
    recipe: Recipe,
    engine_size: int,
    node: str,
    total: int,
    free: int | None,
    source: str,
    simulated: bool = False,
) -> Budget:
    """The budget of `recipe`'s engine on one node of an engine spanning `engine_size` nodes."""
    engine = engine_of(recipe)
    r = engine.reservation(recipe)
    notes = []
    weights = int(recipe.weights_gb * 1e9 / max(1, engine_size)) if recipe.weights_gb is not None else None
    if weights is None:
        notes.append("the recipe has no weights_gb: weights and KV room not estimated")
    kv = kv_bytes_per_token(recipe, engine_size)
    if kv is None:
        notes.append("ESTIMATE without KV cache: the recipe has no architecture facts (head_dim, kv_heads, layers)")
    if r.max_model_len is None:
        notes.append(f"no {r.length_field}: {engine.title} uses the model's own, the KV per sequence is not estimated")
    if r.max_num_seqs is None:
        notes.append(f"max_num_seqs not set: {engine.title}'s default {r.default_num_seqs}")
    draft_weights, draft_kv, draft_notes = draft_share(recipe, engine_size)
    notes += draft_notes
    if weights is not None:
        weights += draft_weights
    if kv is not None:
        kv += draft_kv
    util = r.fraction
    if util is None:  # no share (llama.cpp): what the weights, the peak and every sequence's KV take
        full = (kv or 0) * (r.max_model_len or 0) * (r.max_num_seqs or r.default_num_seqs)
        util = min(MAX_UTILIZATION, max(0.05, math.ceil(((weights or 0) + PEAK_BYTES + full) / total * 100) / 100))
        notes.append(f"{engine.title} takes what it needs (no share of the node): counted as {util:.2f} of it")
    return Budget(
        node=node,
        total=total,
        free=free,
        source=source,
        util=util,
        weights=weights,
        engine_size=engine_size,
        kv_per_token=kv,
        max_model_len=r.max_model_len,
        max_num_seqs=r.max_num_seqs or r.default_num_seqs,
        simulated=simulated,
        notes=notes,
        draft_weights=draft_weights,
        draft_kv_per_token=draft_kv,
        util_field=r.fraction_field or f"{engine.title}'s memory (it takes what it needs: lower its context)",
        length_field=r.length_field,
    )


def nominal(recipe: Recipe, engine_size: int, node: str = "dgx-spark") -> Budget:
    """Against an idle DGX Spark (no node asked): free = total, the OS reserve covers the OS."""
    return estimate(recipe, engine_size, node, DGX_SPARK_TOTAL_BYTES, DGX_SPARK_TOTAL_BYTES, "nominal DGX Spark")


def memory_of(f: NodeFacts) -> tuple[int | None, int | None, str, bool]:
    """(total, free, source, simulated) of a node: nvidia-smi's numbers where it reports them (the lab's
    stand-in does, SIMULATED), else /proc/meminfo (a DGX Spark: unified memory, nvidia-smi says [N/A])."""
    simulated = bool(f.gpu and f.gpu.simulated)
    total, free = f.total_memory_mb, f.free_memory_mb
    if f.gpu_mem_free_mb is not None:
        source = "nvidia-smi" + (" (SIMULATED)" if simulated else "")
    else:
        source, simulated = "unified, /proc/meminfo MemAvailable", False
    return (None if total is None else total * MIB), (None if free is None else free * MIB), source, simulated


def for_node(recipe: Recipe, engine_size: int, f: NodeFacts) -> Budget | None:
    """The budget on a node from its facts (None: its memory was not read)."""
    total, free, source, simulated = memory_of(f)
    if total is None:
        return None
    return estimate(recipe, engine_size, f.node, total, free, source, simulated)


def gib(n: float | None) -> str:
    """Bytes as GiB (MiB below 1 GiB, where one decimal of GiB would read 0.0)."""
    if n is None:
        return "-"
    return f"{n / GIB:.1f} GiB" if abs(n) >= GIB else f"{n / MIB:.0f} MiB"


def shared_room(total_bytes: float) -> float:
    """The most the gpu_memory_utilization values of engines sharing one node may add up to: vLLM reserves
    utilization x total for each at start, and the OS keeps OS_RESERVE_BYTES (a stack's per-node check)."""
    return max(0.0, (total_bytes - OS_RESERVE_BYTES) / total_bytes) if total_bytes > 0 else 0.0
