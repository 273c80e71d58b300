"""`--distributed-executor-backend ray`: the other ranks are Ray actors on the other nodes.

As with vLLM's Ray executor, the head joins the Ray cluster already running on its node
(`ray.init(address="auto")`, after `ray start --head` / `ray start --address=HEAD:6379` on the nodes),
needs one node per GPU of the engine (a GB10 node has one), and places one worker actor on each other
node. Every step it sends the step's input to the actors, steps its own replica, and waits for them
(the actors sleep the same simulated step, like GPUs meeting in an all-reduce). If an actor or its
node dies, or does not answer within the collective timeout, the step fails and /health turns 503.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict

from sparklaunch.control import RankFailure, StepFn
from sparklaunch.driver import apply_and_step
from sparklaunch.protocol import Delta, StepInput

from .config import ServeConfig

log = logging.getLogger("vllm_sim.ray")


class SimRank:
    """One non-head rank: a replica of the engine that steps when told to. Wrapped by ray.remote."""

    def __init__(self, cfg_fields: dict):
        from .adapter import SimAdapter

        self.adapter = SimAdapter(ServeConfig(**cfg_fields))

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def step(self, payload: bytes) -> int:
        inp = StepInput.from_bytes(payload)
        if inp.shutdown:
            return 0
        return len(apply_and_step(self.adapter, inp))


class RayControl:
    needs_heartbeat = True

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.world_size = cfg.world_size
        self.rank = 0
        self.timeout_s = cfg.collective_timeout_s
        self.actors: list = []
        self._ray = None

    def start(self) -> None:
        if self._ray is not None:  # started by the CLI before the server, so a bad cluster fails fast
            return
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        address = os.environ.get("RAY_ADDRESS", "auto")
        try:
            ray.init(address=address, namespace="vllm-sim", log_to_driver=False, ignore_reinit_error=True)
        except Exception as e:  # ConnectionError, RuntimeError, ...: no cluster to join
            raise RankFailure(f"cannot join a running Ray cluster (address {address}): {e}") from e
        self._ray = ray
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if len(nodes) < self.world_size:
            raise RankFailure(
                f"the Ray cluster has {len(nodes)} alive node(s), tensor_parallel_size x "
                f"pipeline_parallel_size = {self.world_size} needs {self.world_size} (one GPU per node)"
            )
        here = ray.get_runtime_context().get_node_id()
        others = [n["NodeID"] for n in nodes if n["NodeID"] != here][: self.world_size - 1]
        remote_cls = ray.remote(num_cpus=0, max_restarts=0)(SimRank)
        fields = asdict(self.cfg)
        self.actors = [
            remote_cls.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False), name=None).remote(
                fields
            )
            for node in others
        ]
        placed = ray.get([a.node_id.remote() for a in self.actors], timeout=max(60.0, self.timeout_s))
        log.info("ray: head on node %s, worker actors on %s", here[:12], [p[:12] for p in placed])

    def step(self, inp: StepInput, fn: StepFn) -> list[Delta]:
        ray = self._ray
        refs = [a.step.remote(inp.to_bytes()) for a in self.actors]
        out = [] if inp.shutdown else fn(inp)
        try:
            counts = ray.get(refs, timeout=self.timeout_s)
        except (ray.exceptions.RayError, TimeoutError) as e:
            raise RankFailure(f"a Ray worker rank failed: {type(e).__name__}: {e}") from e
        if not inp.shutdown and any(c != len(out) for c in counts):
            raise RankFailure(f"ranks out of step: head produced {len(out)} tokens, workers {counts}")
        return out

    def close(self) -> None:
        if self._ray is None:
            return
        for a in self.actors:
            try:
                self._ray.kill(a)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self._ray.shutdown()
