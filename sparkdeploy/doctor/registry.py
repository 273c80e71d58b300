"""Every check, registered in one place: id, what it checks, scope, timeout, and whether `up` runs it.

Adding a check is one function in its group's module plus one line here. Ids are `group.name`; `--only`
selects by prefix (`--only network`, `--only gpu.mem`). Order here is the order of the report.

The checks with `preflight=NAME` are deploy-critical: `up` runs exactly these (PREFLIGHT) over the facts it
read, before anything changes, and shows them under NAME (sparkdeploy/deploy/preflight.py). One function per check
for both: a formula cannot differ between doctor and `up`.
"""

from __future__ import annotations

from sparkdeploy.checks import Check, Scope

from . import access, containers, endpoint, engine, gpu, image, nccl_probe, roce
from . import guard_crash as guard
from . import inventory_checks as inventory
from . import model_cache as model
from . import network_checks as network
from . import testinfra_run as owner_tests
from .check_context import ClusterCheck, NodeCheck


def preflight_check(
    id: str,
    title: str,
    fn: NodeCheck | ClusterCheck,
    *,
    preflight: str,
    scope: Scope = "node",
    timeout_s: float = 20.0,
    needs_recipe: bool = False,
    gate: bool = False,
) -> Check:
    """A deploy-critical check: `up` runs it over the facts it read, so `fn` takes a CheckContext (no session on
    the nodes: mypy rejects one typed to need it, and a body that asks for it)."""
    return Check(id, title, fn, scope, timeout_s, needs_recipe, preflight=preflight, gate=gate)


CHECKS: list[Check] = [
    Check(
        "inventory.valid",
        "the inventory loads: IPs only, no duplicates, fabric IPs on one subnet",
        inventory.valid,
        scope="cluster",
        timeout_s=10,
    ),
    Check(
        "inventory.recipe",
        "the recipe renders for this inventory and topology",
        inventory.recipe,
        scope="cluster",
        timeout_s=10,
    ),
    preflight_check(
        "access.ssh",
        "SSH reachable with a known host key (never auto-added)",
        access.ssh,
        timeout_s=45,
        preflight="ssh",
        gate=True,
    ),
    preflight_check(
        "access.docker",
        "the SSH user runs docker without sudo",
        access.docker_without_sudo,
        timeout_s=20,
        preflight="docker",
        gate=True,
    ),
    preflight_check(
        "engine.running",
        "the Docker engine runs (version)",
        engine.running,
        timeout_s=20,
        preflight="docker",
        gate=True,
    ),
    preflight_check(
        "access.state_dir",
        "the state dir and its entries are the SSH user's",
        access.state_dir,
        timeout_s=20,
        preflight="state-dir",
    ),
    preflight_check(
        "engine.names",
        "no foreign container holds a name of ours",
        engine.names,
        timeout_s=20,
        needs_recipe=True,
        preflight="names",
    ),
    Check(
        "engine.crashes",
        "no recent OOM kill or restart loop of sparkdeploy's containers (docker events)",
        containers.recent_crashes,
        timeout_s=30,
    ),
    Check("guard.crash", "no crash or power-off in the memory guard's black box", guard.past_crash, timeout_s=30),
    Check("gpu.present", "nvidia-smi present and lists a GB10", gpu.present, timeout_s=20),
    Check(
        "gpu.driver",
        "driver (and kernel) not in the known-bad list (doctor/data/known_bad.yaml)",
        gpu.driver,
        timeout_s=20,
    ),
    Check("gpu.same_driver", "one NVIDIA driver version on every node", gpu.same_driver, scope="cluster", timeout_s=20),
    preflight_check(
        "gpu.memory",
        "the memory budget: free >= gpu_memory_utilization x total + OS reserve; weights + KV fit inside it",
        gpu.memory,
        timeout_s=20,
        needs_recipe=True,
        preflight="memory",
    ),
    preflight_check(
        "engine.disk",
        "free disk: Docker's root (images), the HF cache (the weights unless cached), $HOME (the state dir)",
        engine.disk,
        timeout_s=20,
        preflight="disk",
    ),
    Check("gpu.temperature", "GPU temperature", gpu.temperature, timeout_s=20),
    preflight_check(
        "image.present",
        "the recipe's images are on the node",
        image.present,
        timeout_s=30,
        needs_recipe=True,
        preflight="image",
    ),
    preflight_check(
        "image.same_id",
        "one image ID per tag on every node",
        image.same_id,
        scope="cluster",
        timeout_s=30,
        needs_recipe=True,
        preflight="image",
    ),
    Check(
        "image.engine",
        "the engine the deployment serves with (vLLM, SGLang, llama.cpp) and its version",
        image.engine,
        scope="cluster",
        timeout_s=10,
        needs_recipe=True,
    ),
    Check(
        "model.present",
        "the recipe's model and its speculative draft complete and verified in each engine node's HF cache",
        model.present,
        timeout_s=120,
        needs_recipe=True,
    ),
    Check(
        "image.torch_nccl",
        "torch, CUDA and NCCL versions inside the image equal on every node",
        image.torch_nccl,
        timeout_s=150,
        needs_recipe=True,
    ),
    Check("network.link", "fabric interface present, up, holding the fabric IP", network.link, timeout_s=20),
    Check("network.speed", "fabric link speed 200 Gb/s", network.speed, timeout_s=20),
    Check("network.mtu", "fabric MTU equal on every node (9000 recommended)", network.mtu, timeout_s=20),
    Check(
        "network.ping_df",
        "don't-fragment ping at the full MTU to every peer's fabric IP (both directions)",
        network.ping_df,
        timeout_s=30,
    ),
    Check("network.mgmt", "every peer's management IP reachable from the node", network.mgmt, timeout_s=20),
    Check("network.clock", "clock within 1 s of the head node", network.clock, timeout_s=20),
    preflight_check(
        "network.ports",
        "the topology's ports free or held by our containers",
        network.ports,
        timeout_s=20,
        needs_recipe=True,
        preflight="ports",
    ),
    Check("roce.devices", "RDMA devices present, ports ACTIVE, RoCE MTU 4096", roce.devices, timeout_s=20),
    Check("roce.hcas", "the inventory's HCA names exist on the node", roce.hcas, timeout_s=20),
    Check("roce.gid", "a RoCEv2 GID for the fabric IP (and gid_index matches)", roce.gid, timeout_s=20),
    Check(
        "roce.nccl_env",
        "NCCL_*/GLOO_* interface and HCA names of the rendered node.env exist",
        roce.nccl_env,
        timeout_s=20,
        needs_recipe=True,
    ),
    Check(
        "endpoint.health",
        "running sparkdeploy containers answer /health (2xsolo: proxy sees every backend)",
        endpoint.health,
        timeout_s=45,
    ),
    Check(
        "endpoint.completion",
        "a real one-token completion from every serving endpoint",
        endpoint.completion,
        timeout_s=90,
    ),
    Check(
        "nccl.allreduce",
        "all-reduce sweep in the recipe's image over the fabric (doctor --nccl)",
        nccl_probe.allreduce,
        scope="cluster",
        timeout_s=nccl_probe.PROBE_TIMEOUT_S + 120,
        needs_recipe=True,
        opt_in="nccl",
    ),
    Check(
        owner_tests.CHECK_ID,
        "the owner's testinfra modules on every node (doctor --tests PATH, cluster.doctor_tests)",
        owner_tests.node_tests,
        timeout_s=owner_tests.TIMEOUT_S + 15,
        opt_in="tests",
    ),
]

BY_ID = {c.id: c for c in CHECKS}
PREFLIGHT = [c for c in CHECKS if c.preflight]  # what `up` runs before any change (sparkdeploy/deploy/preflight.py)
assert len(BY_ID) == len(CHECKS), "check ids must be unique"
