"""Each fact's parser fed real output: tests/facts/samples/lab-node-doctor.txt is the `doctor` set read from a
lab node (Debian, a real Docker engine, real /proc and ip; nvidia-smi, ibv_devinfo and ethtool are the lab's
SIMULATED stand-ins), captured over SSH with `facts.command("doctor", ...)` asking for the lab's vllm-sim image
and one that is not there; its `routes` and `state_dirs` sections were captured later the same way from another
lab node with nothing deployed. The stack samples were read from the lab's head node with a stack running
(chat on spark1, coder on spark2, the gateway with a key, the guards): lab-stack-down.txt is the `down` set with
the inventory's state dir (every folder of ours), lab-stack-gateway.txt the gateway's state dir (its routes;
secrets.env's sha256 line taken out), lab-after-down-keys-kept.txt the `leftovers` set after `down` (the
gateway's keys kept). And the script run here, for real, where nvidia-smi is missing."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sparkdeploy import facts as facts_mod
from sparkdeploy.deploy.stack import routes as gateway_routes
from sparkdeploy.facts import FACTS, FactArgs, parse, parse_sections
from sparkdeploy.facts.catalog import (
    ACCESS,
    CRASHES_SET,
    DAYZERO,
    DOCTOR,
    DOWN,
    GUARD,
    HISTORY,
    IMAGE_STORE_SET,
    LEFTOVERS,
    PULL,
    RESOURCES,
    STATE,
    STORE_SET,
    TOP,
)

SAMPLES = Path(__file__).parent / "samples"
SAMPLE = (SAMPLES / "lab-node-doctor.txt").read_text()
SIM = "sparkdeploy/vllm-sim:3cba9f084bdb"


def test_every_fact_is_in_the_sample_and_the_doctor_set():
    sections = parse_sections(SAMPLE)
    # engine_errors (issue 43) has its real sample in lab-cluster-*-rank-dead.txt: tests/facts/test_rank_dead_facts.py
    # manifests (doctor's stack ports) and guard_status (guard.crash), issue 37: their real sample is in
    # lab-every-fact.txt (test_fact_samples.py)
    assert set(DOCTOR) - {"engine_errors", "manifests", "guard_status"} == set(sections)
    # day zero's: tests/facts/test_dayzero_facts.py; top's and the guard's: lab-every-fact.txt
    # models pull's, the image store's, the crashes' and push --from's store check (issue 37 item 4): lab-every-fact.txt
    readers = (DOCTOR, DAYZERO, ACCESS, TOP, GUARD, PULL, IMAGE_STORE_SET, CRASHES_SET, STORE_SET)
    assert set(FACTS) == set().union(*readers)
    assert set(HISTORY) <= set(DOCTOR)
    assert set(STATE) | set(RESOURCES) | set(DOWN) | set(LEFTOVERS) <= set(DOCTOR)


def test_lab_node_parsed():
    f = parse("spark1", SAMPLE)
    assert f.home == "/home/spark"
    assert f.docker_ok and f.docker_version == "20.10.24+dfsg1" and not f.docker_error
    assert (f.docker_root, f.docker_driver) == ("/var/lib/docker", "overlay2")
    assert f.user == "spark" and "docker" in f.groups
    assert f.containers == [] and f.other_names == {}
    assert f.images == {
        SIM: "sha256:101fdde9782c44b7da1183e20f9e74408406366406f2f596220d106248feb054",
        "sparkdeploy/nope:000000000000": None,
    }
    assert f.image_errors == {}  # "no such image" is absence, not an error
    assert f.state_dir_mode is None and f.files == {} and f.manifest is None  # nothing deployed yet
    assert f.routes is None and f.routes_error == "" and f.state_dirs == {}
    assert f.listening == {22, 0x9E45}  # sshd (v4 and v6) and Docker's embedded DNS on 127.0.0.11
    assert (f.mem_total_mb, f.mem_available_mb) == (24684084 // 1024, 21769632 // 1024)
    assert f.cpus == 2
    assert f.gpu is not None and f.gpu.simulated and f.gpu.rc == 0
    assert f.gpu.gpus[0]["name"] == "NVIDIA GB10" and f.gpu.gpus[0]["driver_version"] == "580.95.05"
    assert (f.gpu_mem_total_mb, f.gpu_mem_free_mb) == (122570, 122570)
    assert f.free_memory_mb == 122570  # the stand-in's figure wins over /proc/meminfo (SIMULATED)
    assert f.resources and not f.model_cached
    assert f.disk_free_mb == {"home": 15868276 // 1024, "hf_cache": 15868276 // 1024, "docker": 15868276 // 1024}
    assert f.disk["docker"].mount == "/var/lib/docker" and f.disk["docker"].avail == 15868276 * 1024
    assert f.kernel == "6.18.44-fc-v669"
    net = f.network
    assert net is not None and net.links["enp1s0f1np1"].mtu == 9000 and net.links["enp1s0f1np1"].up
    assert net.links["enp1s0f1np1"].addresses == ["172.31.72.11/24"]
    assert net.speeds == {"enp1s0f1np1": 200000} and net.simulated_speed
    rdma = f.rdma
    assert rdma is not None and rdma.rc == 0 and rdma.simulated
    assert sorted(rdma.devices) == ["roceP2p1s0f1", "rocep1s0f1"] and rdma.devices["rocep1s0f1"].active
    assert any(g.ipv4 == "172.31.72.11" and g.version == "v2" for g in rdma.gids)


def test_broken_outputs_degrade_to_what_they_say():
    text = (
        "@@sparkdeploy-facts@@ home\n/home/spark\n"
        "@@sparkdeploy-facts@@ images\nsparkdeploy/x:1 -\n#err sparkdeploy/x:1 Cannot connect to the Docker daemon\n"
        "@@sparkdeploy-facts@@ gpu\n\n@@sparkdeploy-facts@@ gpu.err\nbash: nvidia-smi: command not found\n"
        "@@sparkdeploy-facts@@ gpu.rc 127\n"
        "@@sparkdeploy-facts@@ manifest\n{not json\n"
        "@@sparkdeploy-facts@@ network\n\n@@ethtool enp1s0f1np1\nno such device\n"
    )
    f = parse("spark1", text)
    assert f.images == {"sparkdeploy/x:1": None} and "Cannot connect" in f.image_errors["sparkdeploy/x:1"]
    assert f.gpu is not None and f.gpu.rc == 127 and f.gpu.gpus == [] and "not found" in f.gpu.error
    assert f.gpu_mem_total_mb is None
    assert f.manifest is None and f.manifest_error.startswith("not valid JSON")
    assert f.network is not None and f.network.links == {} and f.network.speeds == {"enp1s0f1np1": None}


def test_the_script_runs_here_for_real(tmp_path):
    """The real script on this machine, with a PATH without nvidia-smi or ibv_devinfo: those facts say so."""
    r = subprocess.run(
        facts_mod.command(("meminfo", "gpu", "rdma", "kernel", "listen"), FactArgs()),
        capture_output=True,
        text=True,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=30,
    )
    f = parse("here", r.stdout)
    assert f.home == str(tmp_path)
    assert f.mem_total_mb and f.mem_available_mb and f.mem_available_mb <= f.mem_total_mb
    assert f.gpu is not None and f.gpu.rc == 127 and f.gpu.gpus == []
    assert f.rdma is not None and f.rdma.rc == 127 and f.rdma.devices == {}
    assert f.kernel == subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip()


def test_a_stacks_folders_containers_and_routes_parsed():
    f = parse("spark1", (SAMPLES / "lab-stack-down.txt").read_text())
    assert set(parse_sections((SAMPLES / "lab-stack-down.txt").read_text())) == set(DOWN)
    assert sorted(f.state_dirs) == [".sparkdeploy-chat", ".sparkdeploy-gateway", ".sparkdeploy-guard"]
    gw = f.state_dirs[".sparkdeploy-gateway"]
    assert gw.mode == 0o700 and gw.foreign == "" and gw.has_manifest
    assert {"keys.json", "routes.json", "spend", "litellm-config.yaml"} <= set(gw.entries)
    assert f.state_dirs[".sparkdeploy-guard"].entries == ["guard", "guard.entry.sh", "guard.run.sh", "manifest.json"]
    assert [c.name for c in f.containers] == [
        "sparkdeploy-chat-vllm",
        "sparkdeploy-gateway-litellm",
        "sparkdeploy-guard",
    ]

    g = parse("spark1", (SAMPLES / "lab-stack-gateway.txt").read_text())
    assert g.routes is not None and g.files["routes.json"].sha256
    routes = gateway_routes.parse(g.routes)
    assert routes is not None and routes.out == {}
    assert routes.models() == routes.served() == ["openai/gpt-oss-120b", "qwen3-coder-30b-bf16"]
    assert [e.api_base for e in routes.groups["chat"].engines] == ["http://172.30.77.11:8000/v1"]
    # each engine names its rank 0's watcher and the group it reports (the gateway leaves it out while restarting)
    assert [(e.watch, e.watch_group) for e in routes.groups["coder"].engines] == [
        ("http://172.30.78.12:7390/watch", "coder:spark2")
    ]
    assert routes.groups["coder"].engines[0].health_url == "http://172.30.77.12:8001/health"
    assert routes.as_json() == g.routes  # what the node holds is what Routes writes


def test_what_down_leaves_is_read_back():
    f = parse("spark1", (SAMPLES / "lab-after-down-keys-kept.txt").read_text())
    assert set(parse_sections((SAMPLES / "lab-after-down-keys-kept.txt").read_text())) == set(LEFTOVERS)
    assert f.containers == [] and list(f.state_dirs) == [".sparkdeploy-gateway"]
    assert f.state_dirs[".sparkdeploy-gateway"].entries == ["keys.json", "spend"]
    assert not f.state_dirs[".sparkdeploy-gateway"].has_manifest
