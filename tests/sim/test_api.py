"""The sim's OpenAI-compatible HTTP API, against a real server process on a free port."""

from __future__ import annotations

import concurrent.futures
import json
import sys
import time

import pytest
import requests

from tests.sim.conftest import MODEL, SEED_ARGS, Proc, free_port, sim_env, wait_http


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the read-mostly tests of this module (starting one costs about a second)."""
    port = free_port()
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    proc = Proc(
        [
            sys.executable,
            "-m",
            "vllm_sim",
            "serve",
            MODEL,
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--served-model-name",
            MODEL,
            "gpt-oss",
            *SEED_ARGS,
            "--stream-interval",
            "1",
        ],
        sim_env(0.02),
        log,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/health", proc=proc.p)
        yield base
    finally:
        proc.stop()


def chat(base, **body):
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "the quick river crosses the bridge"}]}
    payload.update(body)
    return requests.post(base + "/v1/chat/completions", json=payload, timeout=30)


def sse_events(resp) -> list:
    events = []
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            data = line[6:]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_models_lists_every_served_name(server):
    data = requests.get(server + "/v1/models", timeout=5).json()["data"]
    assert [m["id"] for m in data] == [MODEL, "gpt-oss"]
    assert data[0]["root"] == MODEL and data[0]["max_model_len"] == 4096


def test_chat_non_streamed_says_it_is_simulated(server):
    r = chat(server, max_tokens=7)
    assert r.status_code == 200
    assert r.headers["X-Simulated-By"] == "vllm-sim"
    body = r.json()
    assert body["object"] == "chat.completion"
    msg = body["choices"][0]["message"]
    assert msg["role"] == "assistant" and msg["content"].startswith("[simulated by vllm-sim]")
    assert body["choices"][0]["finish_reason"] == "length"
    # prompt: 6 words + chat template (<|start|> user <|message|> ... <|end|> <|start|> assistant <|message|>)
    assert body["usage"] == {"prompt_tokens": 6 + 7, "completion_tokens": 7, "total_tokens": 20}


def test_second_served_name_is_accepted_and_echoed(server):
    r = chat(server, model="gpt-oss", max_tokens=2)
    assert r.status_code == 200 and r.json()["model"] == "gpt-oss"


def test_chat_stream_with_usage_and_token_ids(server):
    r = requests.post(
        server + "/v1/chat/completions",
        stream=True,
        timeout=30,
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "a b c"}],
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        },
    )
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    first, *content, usage, _ = events
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(content) == 5 and all(len(c["choices"][0]["token_ids"]) == 1 for c in content)
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 4 + ["length"]
    text = "".join(c["choices"][0]["delta"]["content"] for c in content)
    assert text == "[simulated by vllm-sim] no model"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    assert usage["usage"]["prompt_tokens"] == 3 + 7


def test_stream_without_include_usage_has_no_usage_chunk(server):
    r = requests.post(
        server + "/v1/chat/completions",
        stream=True,
        timeout=30,
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": True},
    )
    events = sse_events(r)
    assert all("usage" not in e for e in events if e != "[DONE]")
    assert all(e["choices"] for e in events if e != "[DONE]")


def test_completions_string_and_token_ids(server):
    r = requests.post(
        server + "/v1/completions", timeout=30, json={"model": MODEL, "prompt": "one two three four", "max_tokens": 3}
    )
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "[simulated by vllm-sim]"
    assert body["usage"]["prompt_tokens"] == 4
    r = requests.post(
        server + "/v1/completions",
        timeout=30,
        json={
            "model": MODEL,
            "prompt": [5, 6, 7, 8, 9],
            "max_tokens": 1,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = sse_events(r)
    assert events[0]["object"] == "text_completion" and events[0]["choices"][0]["text"] == "[simulated"
    assert events[-2]["usage"]["prompt_tokens"] == 5


def test_unknown_model_is_404_like_vllm(server):
    r = chat(server, model="nope", max_tokens=1)
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "The model `nope` does not exist."


def test_too_long_request_is_400(server):
    r = chat(server, max_tokens=5000)
    assert r.status_code == 400
    assert "maximum context length is 4096 tokens" in r.json()["error"]["message"]


def test_missing_max_tokens_ends_with_stop(server):
    body = chat(server).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == 256


def test_bad_json_is_400(server):
    r = requests.post(
        server + "/v1/chat/completions", data=b"{not json", timeout=5, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400


def test_health_ping_version_corpus(server):
    assert requests.get(server + "/health", timeout=5).status_code == 200
    assert requests.get(server + "/ping", timeout=5).status_code == 200
    assert requests.post(server + "/ping", timeout=5).status_code == 200
    assert requests.get(server + "/version", timeout=5).json() == {"version": "0.32.0"}
    corpus = requests.get(server + "/sim/corpus.txt", timeout=5)
    assert corpus.status_code == 200 and len(corpus.text.split()) > 50000
    info = requests.get(server + "/sim/info", timeout=5).json()
    assert (
        info["simulated"] is True and info["graph_mode"] == "eager" and info["plan"]["max_num_batched_tokens"] == 32768
    )


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            assert f'model_name="{MODEL}"' in line
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_metrics_count_tokens(server):
    before = requests.get(server + "/metrics", timeout=5).text
    r = chat(server, max_tokens=4)
    prompt = r.json()["usage"]["prompt_tokens"]
    after = requests.get(server + "/metrics", timeout=5).text
    assert _metric(after, "vllm:prompt_tokens_total") - _metric(before, "vllm:prompt_tokens_total") == prompt
    assert _metric(after, "vllm:generation_tokens_total") - _metric(before, "vllm:generation_tokens_total") == 4
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert _metric(after, gauge) == 0.0
    assert "# TYPE vllm:prompt_tokens counter" in after
    assert _metric(after, "vllm_sim:simulated") == 1.0


def test_gauges_while_busy(sim_server):
    """Running/waiting/KV gauges move while requests are in flight (max_num_seqs 2 forces a queue)."""
    base, _ = sim_server(*SEED_ARGS, "--max-num-seqs", "2", time_scale=0.5)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(chat, base, max_tokens=60) for _ in range(4)]
        seen = []
        for _ in range(40):
            text = requests.get(base + "/metrics", timeout=5).text
            seen.append(
                (
                    _metric(text, "vllm:num_requests_running"),
                    _metric(text, "vllm:num_requests_waiting"),
                    _metric(text, "vllm:kv_cache_usage_perc"),
                )
            )
            if seen[-1][:2] == (2, 2):  # not at the first request waiting: the 4th may not have arrived yet
                break
            time.sleep(0.05)
        assert all(f.result().status_code == 200 for f in futures)
    assert any(run == 2 and wait == 2 and kv > 0 for run, wait, kv in seen), seen


def test_api_key_guards_v1_only(sim_server):
    base, _ = sim_server("--api-key", "sekret", "--max-model-len", "4096")
    assert requests.get(base + "/v1/models", timeout=5).status_code == 401
    assert requests.get(base + "/v1/models", headers={"Authorization": "Bearer wrong"}, timeout=5).status_code == 401
    assert requests.get(base + "/v1/models", headers={"Authorization": "Bearer sekret"}, timeout=5).status_code == 200
    assert requests.get(base + "/health", timeout=5).status_code == 200


def test_stream_interval_groups_tokens(sim_server):
    base, _ = sim_server("--max-model-len", "4096", "--stream-interval", "4")
    r = requests.post(
        base + "/v1/chat/completions",
        stream=True,
        timeout=30,
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 10,
            "stream": True,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
        },
    )
    counts = [
        len(e["choices"][0]["token_ids"])
        for e in sse_events(r)
        if e != "[DONE]" and e["choices"] and "token_ids" in e["choices"][0]
    ]
    assert counts == [1, 4, 4, 1]  # first token at once, then every 4, then the rest at the end


def test_metrics_report_the_kv_cache_as_vllm(server):
    """vLLM's `vllm:cache_config_info` (num_gpu_blocks, block_size, gpu_memory_utilization) and the sim's
    SIMULATED memory plan: the blocks /sim/info planned, the KV bytes = reserve - weights - peak."""
    text = requests.get(server + "/metrics", timeout=5).text
    plan = requests.get(server + "/sim/info", timeout=5).json()["plan"]
    info = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
    assert len(info) == 1, text
    assert f'num_gpu_blocks="{plan["kv_blocks"]}"' in info[0] and 'block_size="16"' in info[0]
    parts = {
        line.split('part="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm_sim:memory_plan_bytes{")
    }
    assert parts["kv_cache"] == parts["reserve"] - parts["weights"] - parts["peak"] > 0
    assert plan["kv_blocks"] * 16 * parts["kv_per_token"] <= parts["kv_cache"]
