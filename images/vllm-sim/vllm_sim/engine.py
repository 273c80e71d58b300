"""The simulated engine: scheduler + step-cost model + text source, with no clock of its own.

`step()` returns the new tokens and how long the step would take on the simulated GPU; whoever drives
it decides what to do with that time: the serving adapter sleeps it (adapter.py), the predictor adds it
to a virtual clock (predict.py). Given the same requests in the same order, every rank's engine makes
the same decisions, which is what lets ranks run in lockstep like vLLM's external_launcher ranks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from sparklaunch.protocol import Delta, EngineStats, GenRequest

from .catalog import Catalog, Hardware, ModelProfile, default_catalog
from .config import GIB, ConfigError, ServeConfig
from .scheduler import BLOCK_SIZE, Scheduler, SchedulerLimits, Seq
from .speculative import Speculation
from .textgen import Output, TextGen
from .timing import ExecConfig, StepCostModel, StepShape
from .tokenizer import SimTokenizer, default_tokenizer

log = logging.getLogger("vllm_sim.engine")

# vLLM reserves memory for activations of the largest batch when it profiles; the sim charges this many
# bytes per batched token (hidden states, MoE intermediates) plus a fixed runtime overhead.
ACTIVATION_BYTES_PER_TOKEN = 64 * 1024
RUNTIME_OVERHEAD_GIB = 2.0


@dataclass
class _Req:
    req: GenRequest
    seq: Seq
    out: Output

    @property
    def emitted(self) -> int:
        return self.out.emitted


@dataclass(frozen=True)
class EnginePlan:
    """Resolved limits, for logs and tests."""

    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_blocks: int
    kv_cache_gib: float
    weights_gib: float
    # the memory plan in bytes (one GPU), as vLLM's profile run settles it; SIMULATED: nothing is allocated
    total_bytes: int = 0  # the hardware profile's memory (what CUDA reports on the simulated GPU)
    reserve_bytes: int = 0  # gpu_memory_utilization x total
    weights_bytes: int = 0
    peak_bytes: int = 0  # activations at max_num_batched_tokens + the runtime overhead
    kv_bytes_per_token: float = 0.0
    gpu_memory_utilization: float = 0.0
    cache_dtype: str = "auto"

    @property
    def kv_cache_bytes(self) -> int:
        """Available KV cache memory: util x total - weights - peak (vLLM's `available_kv_cache_memory`)."""
        return self.reserve_bytes - self.weights_bytes - self.peak_bytes

    @property
    def kv_cache_tokens(self) -> int:
        """GPU KV cache size in tokens: whole blocks x block size."""
        return self.kv_blocks * BLOCK_SIZE

    @property
    def max_concurrency(self) -> float:
        return self.kv_cache_tokens / self.max_model_len

    def startup_lines(self) -> list[str]:
        """vLLM's start-up lines about the KV cache (gpu_worker.py, kv_cache_utils.py), with the sim's numbers,
        each marked SIMULATED (the regexes an owner uses on a real vLLM log match them too)."""
        tag = "(SIMULATED by vllm-sim: nothing allocated)"
        return [
            f"Available KV cache memory: {self.kv_cache_bytes / GIB:.2f} GiB {tag}",
            f"GPU KV cache size: {self.kv_cache_tokens:,} tokens {tag}",
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x {tag}",
        ]

    def cache_config_info(self) -> dict[str, str]:
        """Labels of vLLM's `vllm:cache_config_info` gauge (CacheConfig.metrics_info(): the fields as strings)."""
        return {
            "block_size": str(BLOCK_SIZE),
            "cache_dtype": self.cache_dtype,
            "gpu_memory_utilization": str(self.gpu_memory_utilization),
            "num_gpu_blocks": str(self.kv_blocks),
        }

    def memory_plan(self) -> dict[str, int]:
        """The plan's parts in bytes, for the sim-only `vllm_sim:memory_plan_bytes` gauge."""
        return {
            "total": self.total_bytes,
            "reserve": self.reserve_bytes,
            "weights": self.weights_bytes,
            "peak": self.peak_bytes,
            "kv_cache": self.kv_cache_bytes,
            "kv_per_token": int(self.kv_bytes_per_token),
        }


def exec_config(cfg: ServeConfig) -> ExecConfig:
    return ExecConfig(
        tp=cfg.tp,
        quantization=cfg.quantization,
        mxfp4_layers=cfg.mxfp4_layers,
        kv_cache_dtype=cfg.kv_cache_dtype,
        graph_mode=cfg.graph_mode,
        allreduce_split=cfg.allreduce_split,
    )


def plan_engine(cfg: ServeConfig, hw: Hardware, model: ModelProfile, cost: StepCostModel) -> EnginePlan:
    """vLLM's start-up arithmetic: defaults, then memory for weights, activations and KV cache."""
    max_len = cfg.max_model_len or model.max_position_embeddings
    # The generic profile's max_position_embeddings is not the model's: checking against it would refuse a
    # valid recipe (and restart in a loop), so an unknown model takes the max_model_len asked (and says so).
    if model.known and max_len > model.max_position_embeddings:
        raise ConfigError(
            f"User-specified max_model_len ({max_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={model.max_position_embeddings} in model's config.json)."
        )
    mnbt = cfg.max_num_batched_tokens or hw.default_max_num_batched_tokens
    if not cfg.enable_chunked_prefill and mnbt < max_len:
        raise ConfigError(
            f"max_num_batched_tokens ({mnbt}) is smaller than max_model_len ({max_len}) with chunked prefill "
            "disabled: longer sequences could never be scheduled."
        )
    seqs = cfg.max_num_seqs or hw.default_max_num_seqs
    cap = model.fitted.get("max_running_seqs")
    if cap:
        seqs = min(seqs, int(cap))

    budget = cfg.gpu_memory_utilization * hw.memory_gib * GIB
    weights = cost.weight_bytes_total()
    activations = mnbt * ACTIVATION_BYTES_PER_TOKEN + RUNTIME_OVERHEAD_GIB * GIB
    kv_bytes = budget - weights - activations
    if weights > budget:
        raise ConfigError(
            f"Model weights take {weights / GIB:.1f} GiB per GPU, more than gpu_memory_utilization="
            f"{cfg.gpu_memory_utilization} of {hw.memory_gib} GiB allows ({budget / GIB:.1f} GiB)."
        )
    if kv_bytes <= 0:
        raise ConfigError(
            "No available memory for the cache blocks. "
            "Try increasing `gpu_memory_utilization` when initializing the engine."
        )
    per_token = cost.kv_bytes_per_token()
    blocks = int(kv_bytes // (per_token * BLOCK_SIZE))
    if blocks * BLOCK_SIZE < max_len:
        raise ConfigError(
            f"To serve at least one request with the models's max seq len ({max_len}), "
            f"({max_len * per_token / GIB:.2f} GiB KV cache is needed, which is larger than the available KV "
            f"cache memory ({kv_bytes / GIB:.2f} GiB). Try increasing `gpu_memory_utilization` or decreasing "
            "`max_model_len` when initializing the engine."
        )
    return EnginePlan(
        max_len,
        mnbt,
        seqs,
        blocks,
        kv_bytes / GIB,
        weights / GIB,
        total_bytes=int(hw.memory_gib * GIB),
        reserve_bytes=int(budget),
        weights_bytes=int(weights),
        peak_bytes=int(activations),
        kv_bytes_per_token=per_token,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        cache_dtype=cfg.kv_cache_dtype,
    )


def unknown_model_line(model: str, max_model_len: int | None, catalog: Catalog) -> str:
    """The one line a start with a model the catalog lacks logs: what the sim does instead, and the fix."""
    default = catalog.model(model).max_position_embeddings
    asked = f"max_model_len {max_model_len} is taken as asked" if max_model_len else f"max_model_len is {default}"
    return (
        f"NO PROFILE for model {model!r} in vllm_sim/data/models.yaml (known: {', '.join(catalog.known_models)}): "
        f"SIMULATED with the generic 'default' profile (a dense 8B) and {asked}, unchecked against the "
        "model's config.json; add the model's entry to models.yaml for its own architecture and limits"
    )


class SimEngine:
    def __init__(self, cfg: ServeConfig, catalog: Catalog | None = None, tokenizer: SimTokenizer | None = None):
        self.cfg = cfg
        self.catalog = catalog or default_catalog()
        if cfg.hardware not in self.catalog.hardware:
            raise ConfigError(f"unknown VLLM_SIM_HARDWARE {cfg.hardware!r}; known: {sorted(self.catalog.hardware)}")
        self.hw = self.catalog.hardware[cfg.hardware]
        self.model = self.catalog.model(cfg.model)
        if not self.model.known:
            log.warning(unknown_model_line(cfg.model, cfg.max_model_len, self.catalog))
        self.cost = StepCostModel(self.catalog, self.hw, self.model, exec_config(cfg))
        self.plan = plan_engine(cfg, self.hw, self.model, self.cost)
        p = self.plan
        log.info(
            "model %s (sim profile %s), tp=%d, mode=%s, graphs=%s, max_model_len=%d, max_num_batched_tokens=%d, "
            "max_num_seqs=%d, KV cache %.1f GiB (%d blocks), weights %.1f GiB/GPU",
            cfg.model,
            self.model.name,
            cfg.tp,
            cfg.mode,
            cfg.graph_mode,
            p.max_model_len,
            p.max_num_batched_tokens,
            p.max_num_seqs,
            p.kv_cache_gib,
            p.kv_blocks,
            p.weights_gib,
        )
        for line in p.startup_lines():
            log.info("%s", line)
        self.tokenizer = tokenizer or default_tokenizer()
        self.text = TextGen(self.tokenizer)
        self.scheduler = Scheduler(
            SchedulerLimits(
                max_num_batched_tokens=self.plan.max_num_batched_tokens,
                max_num_seqs=self.plan.max_num_seqs,
                kv_blocks=self.plan.kv_blocks,
                chunked_prefill=cfg.enable_chunked_prefill,
            )
        )
        self._reqs: dict[str, _Req] = {}
        try:
            self.speculation = Speculation.from_config(cfg.speculative_config)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"--speculative-config: {e}") from None
        if self.speculation is not None:
            log.info(
                "speculative decoding SIMULATED: method %s, %d tokens (acceptance modelled from each prompt's "
                "repetition; no draft runs)",
                self.speculation.method,
                self.speculation.k,
            )
        self.steps = 0
        self.last_shape = StepShape()

    @property
    def max_model_len(self) -> int:
        return self.plan.max_model_len

    def add_request(self, req: GenRequest) -> None:
        if req.request_id in self._reqs:
            raise ValueError(f"duplicate request id {req.request_id}")
        seq = Seq(req.request_id, max(1, req.prompt_len))
        out = Output(
            self.text,
            self.tokenizer,
            req.intent,
            self.cfg.chat.tool_call_parser,
            req.sampling.get("stop"),
            bool(req.sampling.get("include_stop_str_in_output")),
        )
        self._reqs[req.request_id] = _Req(req, seq, out)
        if self.speculation is not None:
            self.speculation.add(req.request_id, req.prompt_token_ids)
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        if self._reqs.pop(request_id, None) is not None:
            self.scheduler.abort(request_id)
            if self.speculation is not None:
                self.speculation.drop(request_id)

    def has_unfinished(self) -> bool:
        return bool(self._reqs)

    def stats(self) -> EngineStats:
        return EngineStats(len(self.scheduler.running), len(self.scheduler.waiting), self.scheduler.kv_usage())

    def _logprobs(self, req: GenRequest, text: str) -> list[dict] | None:
        """Simulated logprobs: the sim's 'model' is certain of every token it writes (logprob 0; the other
        candidates -9999, vLLM's stand-in for -inf). Shapes only; there is no distribution here."""
        if req.sampling.get("logprobs") is None:
            return None
        n = int(req.sampling["logprobs"] or 0)
        alts = [w for w in self.text.words if w != text.strip()][: max(0, n - 1)]
        top = [[text, 0.0]] + [[" " + w, -9999.0] for w in alts] if n else []
        return [{"token": text, "logprob": 0.0, "top": top}]

    def step(self) -> tuple[list[Delta], float]:
        """Schedule and 'run' one step: the new tokens, and the step's simulated duration in seconds."""
        batch = self.scheduler.schedule()
        if not batch.items:
            return [], 0.0
        seconds = self.cost.step_seconds(batch.shape)
        spec = self.speculation
        if spec is not None and batch.shape.prefill_tokens == 0 and batch.shape.decode_seqs:
            # verify k drafts beside each decode, draft them, and spread the step over the tokens it yields
            decoding = [item.seq.request_id for item in batch.items if item.samples]
            verify = replace(batch.shape, verify_tokens=spec.verify_tokens(decoding))
            seconds = (self.cost.step_seconds(verify) + spec.draft_seconds(seconds)) / spec.step(decoding)
        self.last_shape = batch.shape
        self.steps += 1
        deltas: list[Delta] = []
        for seq in self.scheduler.complete(batch):
            r = self._reqs[seq.request_id]
            tid, text, stopped_by = r.out.next()
            ended = stopped_by is not None or (r.out.script_done and not r.req.ignore_eos)  # EOS after a call
            done = ended or r.emitted >= r.req.max_tokens
            reason = "stop" if ended or r.req.eos_at_max else "length"
            delta = Delta(
                seq.request_id,
                [tid],
                text,
                finished=done,
                finish_reason=reason if done else None,
                prompt_tokens=r.req.prompt_len,
                completion_tokens=r.emitted,
                stop_reason=stopped_by,
                logprobs=self._logprobs(r.req, text),
            )
            deltas.append(delta)
            if done:
                self.scheduler.finish(seq)
                del self._reqs[seq.request_id]
                if spec is not None:
                    spec.drop(seq.request_id)
        return deltas, seconds
