"""Real vLLM behind the lockstep driver: `LLMEngine` with distributed_executor_backend="external_launcher".

This is seed 004's serve_torchrun.py in adapter form: torchrun starts one process per GPU; each builds
the same engine (vLLM joins the ranks' process group itself and runs its NCCL all-reduces inside
step()); rank 0 tokenizes and broadcasts requests, every rank adds them in the same order and steps;
only rank 0's outputs are sent to clients. vLLM's external_launcher runs the engine in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), every rank sees the same outputs.

It cannot run on the development machines (no GPU, no vLLM install): the vLLM imports are inside
`build()` and the pure parts (sampling parameters, output deltas) are unit-tested with fakes
(tests/sim/test_launcher_vllm.py). Gauges are approximate: LLMEngine does not expose its scheduler's
queue lengths, so `running` counts unfinished requests and KV usage stays 0.
"""

from __future__ import annotations

import os
from typing import Any

from ..chat import ChatFeatures
from ..protocol import Delta, EngineStats, GenRequest, ServeOptions
from .vllm_frontend import HARMONY_MODEL_TYPE, VllmChatFrontend, decode_sampling_params

SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "include_stop_str_in_output",
    "logprobs",
)


def sampling_kwargs(req: GenRequest) -> dict[str, Any]:
    """SamplingParams keyword arguments for a request (only fields the client set, plus lengths)."""
    kw: dict[str, Any] = {"max_tokens": req.max_tokens, "min_tokens": req.min_tokens, "ignore_eos": req.ignore_eos}
    kw.update({k: req.sampling[k] for k in SAMPLING_FIELDS if k in req.sampling})
    return kw


def token_logprobs(ids: list[int], entries: list[Any]) -> list[dict[str, Any]] | None:
    """vLLM's per-position {token id: Logprob} dicts -> sparklaunch's {token, logprob, top} entries."""
    if not entries:
        return None
    out = []
    for tid, entry in zip(ids, entries, strict=False):
        chosen = entry.get(tid)
        ranked = sorted((lp for t, lp in entry.items() if getattr(lp, "rank", None)), key=lambda lp: lp.rank)
        out.append(
            {
                "token": getattr(chosen, "decoded_token", "") or "",
                "logprob": max(getattr(chosen, "logprob", -9999.0), -9999.0),
                "top": [[lp.decoded_token or "", max(lp.logprob, -9999.0)] for lp in ranked],
            }
        )
    return out


class DeltaTracker:
    """Turns vLLM's cumulative RequestOutputs into per-step deltas (new token ids and new text)."""

    def __init__(self) -> None:
        self._sent: dict[str, tuple[int, int]] = {}  # request id -> (tokens sent, characters sent)

    def __len__(self) -> int:
        return len(self._sent)

    def start(self, request_id: str) -> None:
        self._sent[request_id] = (0, 0)

    def forget(self, request_id: str) -> None:
        self._sent.pop(request_id, None)

    def deltas(self, outputs: list[Any]) -> list[Delta]:
        out: list[Delta] = []
        for o in outputs:
            if o.request_id not in self._sent or not o.outputs:
                continue
            c = o.outputs[0]
            n_tok, n_chr = self._sent[o.request_id]
            ids, text = list(c.token_ids[n_tok:]), c.text[n_chr:]
            if not ids and not o.finished:
                continue
            self._sent[o.request_id] = (len(c.token_ids), len(c.text))
            out.append(
                Delta(
                    o.request_id,
                    ids,
                    text,
                    finished=bool(o.finished),
                    finish_reason=c.finish_reason if o.finished else None,
                    prompt_tokens=len(o.prompt_token_ids or []),
                    completion_tokens=len(c.token_ids),
                    stop_reason=getattr(c, "stop_reason", None) if o.finished else None,
                    logprobs=token_logprobs(ids, (getattr(c, "logprobs", None) or [])[n_tok:]),
                )
            )
            if o.finished:
                self.forget(o.request_id)
        return out


class VllmAdapter:
    simulated = False
    batch_window_s = 0.0

    chat_frontend: Any = None  # rank 0: VllmChatFrontend (sparklaunch.chat)

    def __init__(
        self,
        engine: Any,
        sampling_params_cls: Any,
        tokenizer: Any,
        opts: ServeOptions,
        model_root: str,
        max_model_len: int,
    ):
        self.engine, self._sp, self.tokenizer = engine, sampling_params_cls, tokenizer
        self.served_model_names = opts.served_model_names
        self.model_root, self.max_model_len = model_root, max_model_len
        self.tracker = DeltaTracker()

    def encode(self, text: str) -> list[int]:
        # chat text comes rendered by the model's template (which carries its own BOS)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def add_request(self, req: GenRequest) -> None:
        self.tracker.start(req.request_id)
        # a chat request's SamplingParams come whole from rank 0's vLLM front end (structured outputs for
        # tool_choice required/named and response_format included); plain fields otherwise
        params = decode_sampling_params(req.intent, self._sp) or self._sp(**sampling_kwargs(req))
        self.engine.add_request(req.request_id, {"prompt_token_ids": req.prompt_token_ids}, params)

    def abort_request(self, request_id: str) -> None:
        self.tracker.forget(request_id)
        self.engine.abort_request([request_id])

    def has_unfinished(self) -> bool:
        return bool(self.engine.has_unfinished_requests())

    def step(self) -> list[Delta]:
        return self.tracker.deltas(self.engine.step())

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self.tracker), waiting=0, kv_cache_usage=0.0)

    def close(self) -> None:
        pass


def build(
    argv: list[str], rank: int, world_size: int
) -> tuple[VllmAdapter, ServeOptions]:  # pragma: no cover - needs a GPU
    """Parse `vllm serve` arguments with vLLM's own parser and build the rank's engine."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLMEngine, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser(prog="serve_torchrun.py")).parse_args(argv)
    args.model = args.model_tag or args.model
    args.distributed_executor_backend = "external_launcher"
    engine_args = EngineArgs.from_cli_args(args)
    if engine_args.tensor_parallel_size * engine_args.pipeline_parallel_size != world_size:
        raise SystemExit(
            f"tp x pp = {engine_args.tensor_parallel_size * engine_args.pipeline_parallel_size} but "
            f"torchrun started {world_size} ranks"
        )
    engine = LLMEngine.from_engine_args(engine_args)
    opts = ServeOptions(
        host=args.host or "0.0.0.0",
        port=args.port,
        served_model_names=args.served_model_name or [args.model],
        api_keys=list(args.api_key or []),
        stream_interval=getattr(args, "stream_interval", 1) or 1,
        tp=engine_args.tensor_parallel_size,
        pp=engine_args.pipeline_parallel_size,
    )
    max_len = engine.model_config.max_model_len
    adapter = VllmAdapter(engine, SamplingParams, engine.get_tokenizer(), opts, args.model, max_len)
    if rank == 0:  # tools, tool_choice, reasoning, response_format: vLLM's own parsers and request model
        adapter.chat_frontend = VllmChatFrontend(
            ChatFeatures.from_namespace(args),
            adapter.tokenizer,
            opts.served_model_names[0],
            is_harmony=engine.model_config.hf_config.model_type == HARMONY_MODEL_TYPE,
        )
    return adapter, opts
