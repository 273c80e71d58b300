"""Every registered fact has a sample of real lab output, parsed here (issue 37 item 5).

tests/facts/samples/lab-every-fact.txt is the one facts script of EVERY fact of FACTS, run on the lab's head node
by scripts/capture_fact_samples.py (run it again when a fact is added: this test fails until its section is
there). The other samples are the sets the readers ask for, captured in the states their tests describe
(test_facts_catalog.py, test_dayzero_facts.py, test_rank_dead_facts.py); each is parsed here too, and each fact it
holds reads as read."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkdeploy.facts import FACTS, parse, parse_sections
from sparkdeploy.facts.node import FACT_FIELDS

SAMPLES = Path(__file__).parent / "samples"
EVERY = SAMPLES / "lab-every-fact.txt"


def test_every_registered_fact_has_a_section_in_the_captured_sample():
    sections = parse_sections(EVERY.read_text())
    missing = sorted(set(FACTS) - set(sections))
    assert not missing, f"no real sample of {missing}: run scripts/capture_fact_samples.py against your lab"


def test_every_fact_of_the_captured_sample_parses_and_reads_as_read():
    f = parse("spark1", EVERY.read_text())
    for name in FACTS:
        if name in FACT_FIELDS:  # sha fills the sha256 of `files`' entries, no field of its own
            assert f.has(name), name
    assert f.home.startswith("/home/") and f.docker_ok and f.user and f.hostname and f.kernel
    assert f.gpu is not None and f.gpu.simulated and f.gpu.gpus  # the lab's stand-in, and it says so
    assert f.mem_total_mb and f.cpus and f.disk_free_mb.keys() == {"home", "hf_cache", "docker"}
    assert f.network is not None and f.network.links and f.rdma is not None and f.rdma.devices
    assert f.images and any(v is None for v in f.images.values()) and any(v for v in f.images.values())
    assert set(f.sudo) and f.max_mtu and f.rdma_netdevs and f.listening


@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.glob("*.txt")))
def test_each_sample_parses_and_its_facts_read_as_read(sample):
    text = (SAMPLES / sample).read_text()
    f = parse("spark1", text)
    held = [n for n in parse_sections(text) if n in FACT_FIELDS]
    assert held and all(f.has(n) for n in held)
    assert repr(f).startswith("NodeFacts(node='spark1'")
