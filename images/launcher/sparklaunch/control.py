"""How the ranks of one engine stay in lockstep (the control plane of seed 004).

Every step, rank 0 hands the same `StepInput` (new requests, aborts) to every rank, every rank applies
it and steps its engine replica, then all ranks meet in one small collective. With real vLLM the
engine's NCCL all-reduces already synchronise the GPUs; the extra CPU collective costs ~0.1 ms and gives
two things the GPU path does not: a check that the ranks produced the same number of tokens (they must,
with identical inputs) and a prompt error, or a timeout, when a rank is gone. Rank 0 also sends empty
inputs while idle (a heartbeat) so a dead rank is noticed before the next request arrives.

`LocalControl` is the one-rank case; `GlooControl` uses torch.distributed with the gloo backend (CPU,
TCP) as torchrun or vLLM's own --nnodes mode would set it up. Ray's variant is in vllm_sim.ray_exec.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from .protocol import Delta, StepInput

log = logging.getLogger("sparklaunch.control")

StepFn = Callable[[StepInput], list[Delta]]


class RankFailure(RuntimeError):
    """Another rank is gone, hung past the timeout, or out of step."""


class LocalControl:
    world_size = 1
    rank = 0
    needs_heartbeat = False

    def start(self) -> None:
        pass

    def step(self, inp: StepInput, fn: StepFn) -> list[Delta]:
        return fn(inp)

    def close(self) -> None:
        pass


class GlooControl:
    """Lockstep over a gloo process group. `init_method` None means env:// (torchrun's variables)."""

    needs_heartbeat = True

    def __init__(
        self,
        rank: int,
        world_size: int,
        init_method: str | None = None,
        timeout_s: float = 30.0,
        rendezvous_timeout_s: float = 900.0,
    ):
        self.rank, self.world_size = rank, world_size
        self.init_method = init_method or "env://"
        self.timeout_s = timeout_s
        self.rendezvous_timeout_s = rendezvous_timeout_s
        self._dist = None
        self.steps = 0

    def start(self) -> None:
        """Rendezvous: blocks until every rank has joined (or the rendezvous timeout passes).

        With tcp://HOST:PORT rank 0 hosts the store and waits up to `rendezvous_timeout_s` for the others
        (a worker node may start minutes after the head); once joined, every collective has the much
        shorter `timeout_s`, so a dead or hung rank is noticed quickly. env:// is torchrun's: its agents
        have already gathered every node.
        """
        import torch.distributed as dist

        self._dist = dist
        if dist.is_initialized():
            return
        log.info("rank %d/%d joining %s", self.rank, self.world_size, self.init_method)
        timeout = timedelta(seconds=self.timeout_s)
        if self.init_method.startswith("tcp://"):
            host, port = self.init_method[len("tcp://") :].rsplit(":", 1)
            store = dist.TCPStore(
                host,
                int(port),
                self.world_size,
                is_master=self.rank == 0,
                timeout=timedelta(seconds=self.rendezvous_timeout_s),
                wait_for_workers=True,
            )
            dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.world_size, timeout=timeout)
        else:
            dist.init_process_group(
                "gloo", init_method=self.init_method, rank=self.rank, world_size=self.world_size, timeout=timeout
            )
        log.info("rank %d: all %d ranks joined", self.rank, self.world_size)

    def step(self, inp: StepInput, fn: StepFn) -> list[Delta]:
        self._broadcast(inp.to_bytes())
        if inp.shutdown:
            return []
        out = fn(inp)
        self._sync(len(out))
        return out

    def serve_worker(self, fn: StepFn) -> None:
        """Loop of ranks > 0: receive, step, meet; returns when rank 0 orders a shutdown."""
        while True:
            inp = StepInput.from_bytes(self._broadcast(None))
            if inp.shutdown:
                return
            self._sync(len(fn(inp)))

    def close(self) -> None:
        if self._dist is not None and self._dist.is_initialized():
            try:
                self._dist.destroy_process_group()
            except Exception as e:  # noqa: BLE001 - a dead peer can make teardown fail; nothing left to save
                log.debug("destroy_process_group: %s", e)

    # -- collectives ----------------------------------------------------------------------------
    def _broadcast(self, payload: bytes | None) -> bytes:
        import torch

        try:
            size = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
            self._dist.broadcast(size, src=0)
            if self.rank == 0:
                buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            else:
                buf = torch.empty(int(size.item()), dtype=torch.uint8)
            self._dist.broadcast(buf, src=0)
        except RuntimeError as e:
            raise RankFailure(f"broadcast to the other ranks failed: {e}") from e
        return payload if payload is not None else bytes(buf.numpy())

    def _sync(self, produced: int) -> None:
        import torch

        t = torch.tensor([produced], dtype=torch.int64)
        try:
            self._dist.all_reduce(t)
        except RuntimeError as e:
            raise RankFailure(f"per-step all-reduce failed: {e}") from e
        self.steps += 1
        if int(t.item()) != produced * self.world_size:
            raise RankFailure(
                f"ranks out of step: rank {self.rank} produced {produced} tokens, the sum is {int(t.item())}"
            )
