"""sparkdeploy.daytwo.top: the Prometheus text parser, histogram_quantile, and the monitor's rates and shares."""

from __future__ import annotations

import math

import pytest

from sparkdeploy.daytwo import top

TEXT = """# HELP vllm:num_requests_running x
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m \\"q\\""} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0
vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m",le="0.1"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m",le="1.0"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m",le="+Inf"} 4.0
garbage line
"""


def test_parse_metrics():
    m = top.parse_metrics(TEXT)
    assert m["vllm:num_requests_running"] == [({"engine": "0", "model_name": 'm "q"'}, 3.0)]
    assert top._buckets(m, "vllm:time_to_first_token_seconds") == [(0.1, 1.0), (1.0, 3.0), (math.inf, 4.0)]


def test_quantile_like_prometheus():
    b = [(0.1, 1.0), (1.0, 3.0), (math.inf, 4.0)]
    assert top.quantile(0.5, b) == pytest.approx(0.1 + 0.9 * (2 - 1) / 2)  # rank 2 inside (0.1, 1.0]
    assert top.quantile(0.25, b) == pytest.approx(0.1)
    assert top.quantile(0.95, b) == 1.0  # in +Inf: the highest finite bound
    assert top.quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None


def _target(node, kind="engine"):
    return top.Target(
        node, "sparkdeploy-litellm" if kind == "proxy" else "sparkdeploy-vllm", kind, f"http://{node}/metrics"
    )


def test_monitor_rates_window_and_shares():
    e1, e2, proxy = _target("spark1"), _target("spark2"), _target("spark1", "proxy")
    mon = top.Monitor([e1, e2, proxy], window_s=60)
    t0 = 100.0
    b0 = [(0.1, 0.0), (1.0, 0.0), (math.inf, 0.0)]
    b1 = [(0.1, 2.0), (1.0, 4.0), (math.inf, 4.0)]
    mon.history[e1].extend(
        [
            top.Sample(t0, running=0, waiting=0, kv=0.0, prompt=0, generation=100, ttft=b0),
            top.Sample(t0 + 2, running=2, waiting=1, kv=0.5, prompt=400, generation=300, ttft=b1),
        ]
    )
    mon.history[e2].extend([top.Sample(t0, error="URLError: refused")])
    mon.history[proxy].extend(
        [
            top.Sample(t0, requests={"spark1": 10, "spark2": 10}),
            top.Sample(t0 + 2, requests={"spark1": 13, "spark2": 11}),
        ]
    )
    snap = mon.snapshot()
    one, two = snap["engines"]
    assert one["generation_tokens_per_s"] == 100.0 and one["prompt_tokens_per_s"] == 200.0
    assert one["running"] == 2 and one["waiting"] == 1 and one["kv_cache_usage"] == 0.5
    assert one["ttft_p50_s"] == pytest.approx(0.1) and one["ttft_basis"] == "window"
    assert one["request_share"] == pytest.approx(0.75) and two["request_share"] == pytest.approx(0.25)
    assert two["error"] == "URLError: refused" and "running" not in two
    assert snap["request_share_basis"] == "window"


def test_the_proxy_share_keeps_its_own_basis_and_the_caption_reads():
    """Issue 30: the share's basis was the last engine's TTFT basis ("proxy share over the since the engine
    started")."""
    from sparkdeploy.cli.top_cmd import _caption

    e1, e2, proxy = _target("spark1"), _target("spark2"), _target("spark1", "proxy")
    mon = top.Monitor([e1, e2, proxy], window_s=60)
    b = [(0.1, 1.0), (math.inf, 1.0)]
    mon.history[e1].extend([top.Sample(100.0, generation=0, ttft=b), top.Sample(102.0, generation=10, ttft=b)])
    mon.history[e2].extend([top.Sample(102.0, generation=10, ttft=b)])  # one sample: TTFT since it started
    mon.history[proxy].extend(
        [top.Sample(100.0, requests={"spark1": 1, "spark2": 1}), top.Sample(102.0, requests={"spark1": 3, "spark2": 2})]
    )
    snap = mon.snapshot()
    assert snap["engines"][1]["ttft_basis"] == "since the engine started"
    assert snap["request_share_basis"] == "window"
    assert "proxy share over 60 s" in _caption(snap)
    once = top.Monitor([e1, e2, proxy], window_s=60, since_start=True)
    once.history = mon.history
    assert "proxy share since the proxy started" in _caption(once.snapshot())


def test_counter_reset_is_not_negative():
    assert top._rate(5, 100, 2.0) == 0.0
    assert top._delta_buckets([(1.0, 1.0)], [(1.0, 5.0)]) == [(1.0, 1.0)]


def test_node_targets_from_the_light_read():
    """top reads the facts set TOP (node state only through facts/): the running containers of ours and every
    folder's manifest, in the facts script's own framing, parsed by the facts layer."""
    from sparkdeploy.config.inventory import Node
    from sparkdeploy.facts import parse

    node = Node(
        name="spark1", role="head", mgmt_ip="192.0.2.1", fabric_ip="198.51.100.1/24", fabric_ifaces=["enp1s0f1np1"]
    )
    text = (
        "@@sparkdeploy-facts@@ home\n/home/spark\n"
        "@@sparkdeploy-facts@@ running\n"
        "sparkdeploy-vllm\tbackend\t\nsparkdeploy-litellm\tproxy\t\nsparkdeploy-prometheus\tmetrics\t\n"
        "sparkdeploy-chat-vllm\tbackend\tchat\n"
        "@@sparkdeploy-facts@@ manifests\n"
        "@@manifest .sparkdeploy\n"
        '{"containers": [{"name": "sparkdeploy-vllm", "health_port": 8000},'
        ' {"name": "sparkdeploy-litellm", "health_port": 4000},'
        ' {"name": "sparkdeploy-prometheus", "health_port": null}]}\n'
        "@@manifest .sparkdeploy-chat\n"
        '{"containers": [{"name": "sparkdeploy-chat-vllm", "health_port": 8001}]}\n'
        "@@manifest .sparkdeploy-broken\nnot json\n"
    )
    facts = parse("spark1", text)
    assert top.node_targets(node, facts) == [
        top.Target("spark1", "sparkdeploy-vllm", "engine", "http://192.0.2.1:8000/metrics"),
        top.Target("spark1", "sparkdeploy-litellm", "proxy", "http://192.0.2.1:4000/metrics"),
        top.Target("spark1", "sparkdeploy-chat-vllm", "engine", "http://192.0.2.1:8001/metrics"),
    ]
    assert top.node_targets(node, facts, "chat") == [
        top.Target("spark1", "sparkdeploy-chat-vllm", "engine", "http://192.0.2.1:8001/metrics")
    ]
    assert sorted(facts.manifests) == [".sparkdeploy", ".sparkdeploy-chat"]  # the broken one names nothing
