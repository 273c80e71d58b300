"""The facts that took over the last reads outside facts/ (issue 37 item 4): models pull's numeric ids and missing
cache folders, the image store (push, push --from, registry pull), how our containers ended (crashes: `status`,
doctor's engine.crashes) and push --from's layer store check, each parsed from real lab output.

lab-every-fact.txt: scripts/capture_fact_samples.py on the lab's head node (nothing deployed: no container ended).
lab-store-readable.txt: the `store` set on the lab's head node asked for one image ID it holds and one it does
not (the `sha256:000...` one)."""

from __future__ import annotations

from pathlib import Path

from sparkdeploy.daytwo import crashes
from sparkdeploy.facts import parse
from sparkdeploy.facts.catalog import CRASHES, crash_records
from sparkdeploy.facts.parsers import Section, parse_sections
from sparkdeploy.images.inventory_images import node_images

SAMPLES = Path(__file__).parent / "samples"
EVERY = (SAMPLES / "lab-every-fact.txt").read_text()


def test_models_pull_reads_the_numeric_ids_and_the_missing_cache_folders():
    f = parse("spark1", EVERY)
    assert (f.uid, f.gid) == ("1000", "1000")
    # innermost first, up to the first folder there (the home)
    assert f.hf_missing == [
        "/home/spark/.cache/huggingface/hub",
        "/home/spark/.cache/huggingface",
        "/home/spark/.cache",
    ]


def test_the_image_store_fact_is_what_a_push_reads():
    f = parse("spark1", EVERY)
    assert f.image_store is not None and f.image_store.rc == 0
    images = node_images("spark1", f.image_store)
    assert (images.root_dir, images.driver) == ("/var/lib/docker", "overlay2")
    assert images.free_bytes and images.zstd and not images.containerd_store
    assert {i.name for i in images.managed()} >= {"vllm-sim", "guard", "litellm-proxy"}


def test_the_crashes_fact_reads_the_node_clock_and_no_environment():
    f = parse("spark1", EVERY)
    assert f.crashes is not None and f.crashes.inspect == [] and f.crashes.events == []
    assert crashes.history_of(f.crashes).now.isoformat() == f.crashes.now.replace("Z", "+00:00")
    assert "Env" not in CRASHES  # Config.Env holds the secrets of --env-file


def test_the_crashes_fact_parses_its_inner_sections():
    text = (
        "@@sparkdeploy-crashes@@ inspect\n"
        '{"id":"c1","name":"/sparkdeploy-vllm","state":{"Running":true},"restarts":2,"role":"engine"}\n'
        "not json\n"
        "@@sparkdeploy-crashes@@ events\n"
        '{"action":"die","time":1764320000000000000,"id":"c1","code":"137"}\n'
        "@@sparkdeploy-crashes@@ now\n2026-11-28T06:33:28Z\n"
    )
    r = crash_records(Section(text, "", 0))
    assert [d["name"] for d in r.inspect] == ["/sparkdeploy-vllm"] and len(r.events) == 1
    assert r.now == "2026-11-28T06:33:28Z"


def test_the_store_check_names_only_the_ids_root_may_read():
    text = (SAMPLES / "lab-store-readable.txt").read_text()
    assert "store_readable" in parse_sections(text)
    f = parse("spark1", text)
    assert f.store_readable == {"sha256:2a5859d97f6690b1818b1b041e772e46cf9b68c251499c3382fc91fedf899974"}


def test_the_crashes_fact_of_a_node_where_an_engine_was_oom_killed_then_removed():
    """lab-crashes-after-oom.txt: the crashes set on spark1 after tests/daytwo's OOM and kill lab test (its
    containers removed since, their engine events kept): an OOM kill, then `docker rm -f`'s kills."""
    f = parse("spark1", (SAMPLES / "lab-crashes-after-oom.txt").read_text())
    assert f.crashes is not None and f.crashes.inspect == [] and len(f.crashes.events) == 10
    oomed = "b08571145bfbe15392472d7f492d3013d040c470a030dd98979fb0bf98ecf036"
    exits = crashes._exits_from_events(f.crashes.events)[oomed]
    assert [(e.oom, e.by_docker, e.code) for e in exits] == [(True, False, 137), (False, True, 137)]
    assert crashes.history_of(f.crashes).containers == {}  # removed: no container to report
