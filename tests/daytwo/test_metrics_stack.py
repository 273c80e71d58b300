"""`up --metrics` renders Prometheus on the head node: a scrape target per engine (and the proxy with its key
from a 0600 file, never in the config or on a command line); the dry run masks that key file."""

from __future__ import annotations

import copy

import yaml

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.config.secrets import Secrets
from sparkdeploy.recipes.recipe import resolve
from sparkdeploy.topologies import build_deployment
from sparkdeploy.topologies.dryrun import as_text, describe
from sparkdeploy.topologies.metrics_stack import KEY_FILE, PROMETHEUS_CONTAINER
from tests.conftest import SECRET_HF, SECRET_KEY, TWO_NODES


def deployment(topology, metrics=True, inventory=None):
    inv = Inventory.model_validate(inventory or TWO_NODES)
    secrets = Secrets({"HF_TOKEN": SECRET_HF, "LITELLM_MASTER_KEY": SECRET_KEY}, source="test")
    return build_deployment(inv, resolve("openai-gpt-oss-120b", topology, None, ()), secrets, metrics=metrics)


def _config(nd) -> dict:
    return yaml.safe_load(nd.file("prometheus.yml").content)


def test_2xsolo_scrapes_both_engines_and_the_proxy_with_its_key_file():
    dep = deployment("2xsolo")
    head = dep.node("spark1")
    assert dep.metrics_url == "http://192.0.2.1:9090"
    prom = next(c for c in head.containers if c.name == PROMETHEUS_CONTAINER)
    assert prom.role == "metrics" and prom.ports == (9090,) and prom.health_port is None
    assert all(c.name != PROMETHEUS_CONTAINER for c in dep.node("spark2").containers)
    jobs = {j["job_name"]: j for j in _config(head)["scrape_configs"]}
    assert [t["targets"] for t in jobs["vllm"]["static_configs"]] == [["192.0.2.1:8000"], ["192.0.2.2:8000"]]
    assert jobs["litellm"]["static_configs"][0]["targets"] == ["192.0.2.1:4000"]
    assert jobs["litellm"]["authorization"]["credentials_file"] == f"/sparkdeploy/{KEY_FILE}"
    key = head.file(KEY_FILE)
    assert key.mode == 0o600 and key.secret and key.content == SECRET_KEY + "\n"
    text = as_text(describe(dep))
    assert SECRET_KEY not in text and SECRET_KEY not in head.file("prometheus.yml").content
    assert SECRET_KEY not in head.file("prometheus.entry.sh").content


def test_solo_on_a_worker_still_puts_prometheus_on_the_head():
    inv = copy.deepcopy(TWO_NODES)
    dep = deployment("solo", inventory=inv)
    assert [c.name for c in dep.node("spark1").containers] == [
        "sparkdeploy-vllm",
        PROMETHEUS_CONTAINER,
        "sparkdeploy-guard",
    ]
    assert "litellm" not in {j["job_name"] for j in _config(dep.node("spark1"))["scrape_configs"]}


def test_off_by_default_and_on_from_the_inventory():
    assert deployment("solo", metrics=None).metrics_url is None
    inv = copy.deepcopy(TWO_NODES)
    inv["cluster"]["metrics"] = True
    assert deployment("solo", metrics=None, inventory=inv).metrics_url == "http://192.0.2.1:9090"
    assert deployment("solo", metrics=False, inventory=inv).metrics_url is None
