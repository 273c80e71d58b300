"""sparklaunch's pieces in-process: the engine loop, stream buffering, the control plane's checks, and the
real-vLLM adapter's pure logic against fakes (vLLM itself cannot run here: no GPU)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import ClassVar

import pytest

from sparklaunch.adapters.vllm_engine import DeltaTracker, VllmAdapter, sampling_kwargs
from sparklaunch.control import LocalControl
from sparklaunch.driver import EngineDead, EngineDriver, StreamBuffer, apply_and_step
from sparklaunch.protocol import Delta, GenRequest, ServeOptions, StepInput
from sparklaunch.torchrun import choose_engine, rank_env


class Listener:
    def __init__(self):
        self.got: list[Delta] = []
        self.dead_reason: str | None = None
        self.event = threading.Event()

    def deltas(self, ds: list[Delta]) -> None:
        self.got += ds
        if any(d.finished for d in ds):
            self.event.set()

    def dead(self, reason: str) -> None:
        self.dead_reason = reason
        self.event.set()


class FakeAdapter:
    """Produces `n` tokens per request, one per step; can be told to fail."""

    simulated = False
    batch_window_s = 0.0
    served_model_names: ClassVar[list[str]] = ["m"]
    model_root = "m"
    max_model_len = 100

    def __init__(self, fail_at_step: int | None = None):
        self.live: dict[str, list[int]] = {}
        self.steps = 0
        self.fail_at_step = fail_at_step
        self.seen_batches: list[list[str]] = []

    def add_request(self, req):
        self.live[req.request_id] = [0, req.max_tokens, req.prompt_len]

    def abort_request(self, rid):
        self.live.pop(rid, None)

    def has_unfinished(self):
        return bool(self.live)

    def step(self):
        self.steps += 1
        if self.fail_at_step == self.steps:
            raise RuntimeError("GPU fell off the bus")
        self.seen_batches.append(sorted(self.live))
        out = []
        for rid, st in list(self.live.items()):
            st[0] += 1
            done = st[0] >= st[1]
            out.append(Delta(rid, [st[0]], f" t{st[0]}", done, "length" if done else None, st[2], st[0]))
            if done:
                del self.live[rid]
        return out

    def stats(self):
        from sparklaunch.protocol import EngineStats

        return EngineStats(len(self.live), 0, 0.0)


def test_driver_serves_requests_and_counts_tokens():
    adapter, listener = FakeAdapter(), Listener()
    driver = EngineDriver(adapter, LocalControl(), heartbeat_s=0.05)
    driver.start(listener)
    assert driver.ready.wait(5) and driver.healthy
    driver.submit(GenRequest("a", [1, 2, 3], 3))
    assert listener.event.wait(5)
    assert [d.token_ids for d in listener.got] == [[1], [2], [3]] and listener.got[-1].finished
    assert driver.counters.prompt_tokens == 3 and driver.counters.generation_tokens == 3
    assert driver.counters.finished == {"length": 1}
    driver.shutdown()
    assert not driver.healthy


def test_driver_death_fails_requests_and_health():
    adapter, listener = FakeAdapter(fail_at_step=2), Listener()
    driver = EngineDriver(adapter, LocalControl(), heartbeat_s=0.05)
    driver.start(listener)
    driver.ready.wait(5)
    driver.submit(GenRequest("a", [1], 5))
    assert listener.event.wait(5)
    assert "GPU fell off the bus" in listener.dead_reason and not driver.healthy
    with pytest.raises(EngineDead):
        driver.submit(GenRequest("b", [1], 1))


def test_driver_abort_stops_a_request():
    adapter, listener = FakeAdapter(), Listener()
    driver = EngineDriver(adapter, LocalControl(), heartbeat_s=0.05)
    driver.start(listener)
    driver.ready.wait(5)
    driver.submit(GenRequest("long", [1], 10_000))
    time.sleep(0.05)
    driver.abort("long")
    deadline = time.monotonic() + 5
    while adapter.live and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not adapter.live
    driver.shutdown()


def test_rendezvous_failure_is_death():
    class NoPeers(LocalControl):
        def start(self):
            raise TimeoutError("rank 1 never came")

    listener = Listener()
    driver = EngineDriver(FakeAdapter(), NoPeers())
    driver.start(listener)
    assert listener.event.wait(5) and "rank 1 never came" in listener.dead_reason
    with pytest.raises(EngineDead):
        driver.submit(GenRequest("a", [1], 1))


def test_apply_and_step_applies_aborts_and_new_requests_in_order():
    adapter = FakeAdapter()
    apply_and_step(adapter, StepInput(new=[GenRequest("x", [1], 5), GenRequest("y", [1], 5)]))
    out = apply_and_step(adapter, StepInput(abort=["x"]))
    assert [d.request_id for d in out] == ["y"]
    assert apply_and_step(FakeAdapter(), StepInput()) == []


def test_step_input_round_trip_is_json():
    inp = StepInput(
        new=[GenRequest("r", [1, 2], 7, prompt="p", sampling={"temperature": 0.5}, eos_at_max=True)], abort=["q"]
    )
    data = inp.to_bytes()
    assert data.startswith(b"{") and StepInput.from_bytes(data) == inp


def test_stream_buffer_first_token_then_every_n_then_end():
    buf = StreamBuffer(3)
    sent = []
    for i in range(1, 8):
        sent += buf.push([Delta("r", [i], f"{i}", i == 7, "length" if i == 7 else None, 5, i)])
    assert [d.token_ids for d in sent] == [[1], [2, 3, 4], [5, 6, 7]]
    assert sent[-1].finished and sent[1].text == "234"
    assert StreamBuffer(1).push([Delta("r", [1], "a")]) == [Delta("r", [1], "a")]


# -- the real-vLLM adapter, with fakes --------------------------------------------------------------


def out(rid, ids, text, finished=False, reason=None, prompt=(1, 2, 3)):
    return SimpleNamespace(
        request_id=rid,
        prompt_token_ids=list(prompt),
        finished=finished,
        outputs=[SimpleNamespace(token_ids=list(ids), text=text, finish_reason=reason)],
    )


def test_delta_tracker_turns_cumulative_outputs_into_deltas():
    t = DeltaTracker()
    t.start("a")
    assert t.deltas([out("a", [5], "He")]) == [Delta("a", [5], "He", False, None, 3, 1)]
    assert t.deltas([out("a", [5], "He")]) == []  # nothing new, not finished: nothing to send
    d = t.deltas([out("a", [5, 6, 7], "Hello!", True, "stop")])
    assert d == [Delta("a", [6, 7], "llo!", True, "stop", 3, 3)]
    assert len(t) == 0 and t.deltas([out("a", [5, 6, 7, 8], "x")]) == []  # forgotten once finished
    t.start("b")
    t.forget("b")
    assert t.deltas([out("b", [1], "x")]) == []


def test_sampling_kwargs_pass_only_what_the_client_set():
    req = GenRequest("r", [1], 12, min_tokens=2, ignore_eos=True, sampling={"temperature": 0.2, "seed": 7, "bogus": 1})
    assert sampling_kwargs(req) == {
        "max_tokens": 12,
        "min_tokens": 2,
        "ignore_eos": True,
        "temperature": 0.2,
        "seed": 7,
    }


def test_vllm_adapter_drives_an_llmengine_shaped_object():
    class FakeEngine:
        def __init__(self):
            self.added, self.aborted, self.n = [], [], 0

        def add_request(self, rid, prompt, params):
            self.added.append((rid, prompt, params))

        def abort_request(self, ids):
            self.aborted += ids

        def has_unfinished_requests(self):
            return self.n < 2

        def step(self):
            self.n += 1
            return [out("r1", [9] * self.n, "ab"[: self.n], self.n == 2, "length" if self.n == 2 else None)]

    class Tok:
        def encode(self, text, add_special_tokens=True):
            assert add_special_tokens is False
            return [len(w) for w in text.split()]

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "|".join(m["content"] for m in messages) + ("|A:" if add_generation_prompt else "")

    opts = ServeOptions("0.0.0.0", 8000, ["m"], [], 1, 2, 1)
    eng = FakeEngine()
    a = VllmAdapter(eng, lambda **kw: kw, Tok(), opts, "org/m", 4096)
    assert a.render_chat([{"role": "user", "content": "hi"}]) == "hi|A:" and a.encode("ab c") == [2, 1]
    a.add_request(GenRequest("r1", [1, 2, 3], 2, sampling={"temperature": 0}))
    assert eng.added == [
        (
            "r1",
            {"prompt_token_ids": [1, 2, 3]},
            {"max_tokens": 2, "min_tokens": 0, "ignore_eos": False, "temperature": 0},
        )
    ]
    assert a.stats().running == 1
    first, second = a.step(), a.step()
    assert first[0].token_ids == [9] and second[0].finished and second[0].text == "b"
    a.abort_request("zz")
    assert eng.aborted == ["zz"] and not a.has_unfinished()


# -- launcher plumbing ---------------------------------------------------------------------------------


def test_rank_env_requires_torchrun():
    with pytest.raises(SystemExit, match="started by torchrun"):
        rank_env({"RANK": "0"})
    assert rank_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}) == (1, 2)


def test_engine_choice(monkeypatch):
    monkeypatch.setenv("SPARKLAUNCH_ENGINE", "vllm")
    assert choose_engine() == "vllm"
    monkeypatch.setenv("SPARKLAUNCH_ENGINE", "auto")
    assert choose_engine() == "sim"  # vLLM is not installed here; vllm_sim is on the path


def test_vllm_logprobs_become_chosen_token_and_ranked_candidates():
    from types import SimpleNamespace as NS

    from sparklaunch.adapters.vllm_engine import token_logprobs

    entry = {
        7: NS(logprob=-0.1, rank=2, decoded_token=" b"),
        5: NS(logprob=-0.05, rank=1, decoded_token=" a"),
        9: NS(logprob=float("-inf"), rank=3, decoded_token=" c"),
    }
    assert token_logprobs([7], [entry]) == [
        {"token": " b", "logprob": -0.1, "top": [[" a", -0.05], [" b", -0.1], [" c", -9999.0]]}
    ]
    assert token_logprobs([7], []) is None
