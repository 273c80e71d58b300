"""The engine loop: one thread that collects new requests, steps the engine, and hands out tokens.

It runs in its own thread because a step blocks (a GPU step, a simulated step's sleep, a collective)
and the HTTP server must keep accepting requests meanwhile, as in seed 004 (API thread + engine loop).
Per iteration: drain the intake queue into one StepInput, let the control plane run the step on every
rank, then pass the deltas (buffered per `--stream-interval`) to the listener, which is the HTTP side.
Any failure of the step or of another rank marks the engine dead: /health turns 503 and every request
in flight ends with an error, as vLLM does when its engine core dies.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Protocol

from .adapters import EngineAdapter
from .control import LocalControl
from .metrics import Counters, Latencies
from .protocol import Delta, EngineStats, GenRequest, StepInput

log = logging.getLogger("sparklaunch.driver")


class EngineDead(RuntimeError):
    pass


class Listener(Protocol):
    def deltas(self, deltas: list[Delta]) -> None: ...  # called from the engine thread
    def dead(self, reason: str) -> None: ...


def apply_and_step(adapter: EngineAdapter, inp: StepInput) -> list[Delta]:
    """What every rank does with a StepInput; identical inputs give identical outputs."""
    for rid in inp.abort:
        adapter.abort_request(rid)
    for req in inp.new:
        adapter.add_request(req)
    if not adapter.has_unfinished():
        return []
    return adapter.step()


class StreamBuffer:
    """vLLM's --stream-interval: send the first token at once, then every `interval` tokens, and the end."""

    def __init__(self, interval: int):
        self.interval = max(1, interval)
        self._held: dict[str, Delta] = {}

    def push(self, deltas: list[Delta]) -> list[Delta]:
        if self.interval == 1:
            return deltas
        out: list[Delta] = []
        for d in deltas:
            held = self._held.pop(d.request_id, None)
            if held is not None:
                logprobs = (held.logprobs or []) + (d.logprobs or []) if (held.logprobs or d.logprobs) else None
                d = Delta(
                    d.request_id,
                    held.token_ids + d.token_ids,
                    held.text + d.text,
                    d.finished,
                    d.finish_reason,
                    d.prompt_tokens,
                    d.completion_tokens,
                    d.error,
                    d.stop_reason,
                    logprobs,
                )
            first = d.completion_tokens == len(d.token_ids)
            if d.finished or first or len(d.token_ids) >= self.interval:
                out.append(d)
            else:
                self._held[d.request_id] = d
        return out

    def drop(self, request_id: str) -> None:
        self._held.pop(request_id, None)


class EngineDriver:
    def __init__(self, adapter: EngineAdapter, control=None, *, stream_interval: int = 1, heartbeat_s: float = 0.5):
        self.adapter = adapter
        self.control = control or LocalControl()
        self.heartbeat_s = heartbeat_s
        self.counters = Counters()
        self.latencies = Latencies()
        self.stats = EngineStats()
        self.ready = threading.Event()
        self.dead_reason: str | None = None
        self.listener: Listener | None = None
        self._intake: queue.Queue[tuple[str, object]] = queue.Queue()
        self._buffer = StreamBuffer(stream_interval)
        self._thread: threading.Thread | None = None
        self._live: set[str] = set()

    # -- called from the HTTP side ---------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return self.ready.is_set() and self.dead_reason is None and self._thread is not None and self._thread.is_alive()

    def start(self, listener: Listener) -> None:
        self.listener = listener
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def submit(self, req: GenRequest) -> None:
        if self.dead_reason is not None:
            raise EngineDead(self.dead_reason)
        if not self.ready.is_set():
            raise EngineDead("engine is not ready yet (waiting for every rank to join)")
        self.latencies.arrived(req.request_id)
        self._intake.put(("new", req))

    def abort(self, request_id: str) -> None:
        self.latencies.dropped(request_id)
        self._intake.put(("abort", request_id))

    def shutdown(self, timeout: float = 10.0) -> None:
        self._intake.put(("shutdown", None))
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.control.start()
        except Exception as e:  # noqa: BLE001 - any rendezvous failure ends this rank, reported
            self._die(f"rank rendezvous failed: {type(e).__name__}: {e}")
            return
        self.ready.set()
        try:
            while True:
                inp = self._collect()
                if inp is None:  # idle, nothing to say, no heartbeat needed
                    continue
                deltas = self.control.step(inp, self._local_step)
                if inp.shutdown:
                    break
                self.stats = self.adapter.stats()
                self._publish(deltas)
        except Exception as e:
            log.exception("engine loop failed")
            self._die(f"{type(e).__name__}: {e}")
            return
        finally:
            self.control.close()

    def _local_step(self, inp: StepInput) -> list[Delta]:
        for req in inp.new:
            self._live.add(req.request_id)
        for rid in inp.abort:
            self._live.discard(rid)
            self._buffer.drop(rid)
        return apply_and_step(self.adapter, inp)

    def _collect(self) -> StepInput | None:
        """Drain the intake; when idle, block (up to the heartbeat) and let simultaneous arrivals coalesce."""
        inp = StepInput()
        busy = self.adapter.has_unfinished()
        try:
            if busy:
                item = self._intake.get_nowait()
            else:
                item = self._intake.get(timeout=self.heartbeat_s)
                window = getattr(self.adapter, "batch_window_s", 0.0)
                if window > 0 and item[0] == "new":
                    time.sleep(window)
        except queue.Empty:
            item = None
        while item is not None:
            kind, value = item
            if kind == "new":
                inp.new.append(value)  # type: ignore[arg-type]
            elif kind == "abort":
                inp.abort.append(value)  # type: ignore[arg-type]
            elif kind == "shutdown":
                inp.shutdown = True
            try:
                item = self._intake.get_nowait()
            except queue.Empty:
                item = None
        if inp.is_empty() and not busy and not self.control.needs_heartbeat:
            return None
        return inp

    def _publish(self, deltas: list[Delta]) -> None:
        c = self.counters
        for d in deltas:
            first = d.completion_tokens == len(d.token_ids)
            self.latencies.output(d.request_id, first, d.finished)
            if first:  # first output: the prompt is done
                c.prompt_tokens += d.prompt_tokens
            c.generation_tokens += len(d.token_ids)
            if d.finished:
                c.finished[d.finish_reason or "stop"] = c.finished.get(d.finish_reason or "stop", 0) + 1
                self._live.discard(d.request_id)
        out = self._buffer.push(deltas)
        if out and self.listener is not None:
            self.listener.deltas(out)

    def _die(self, reason: str) -> None:
        self.dead_reason = reason
        log.error("engine dead: %s", reason)
        if self.listener is not None:
            self.listener.dead(reason)
