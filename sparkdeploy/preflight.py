"""Checks on every node before anything changes anywhere; any failure aborts the whole run.

Pure logic over the facts read from each node (facts.py): reachable over SSH (host key checked), Docker
usable by the SSH user, no foreign container holding one of our names, the run image present with one image
ID on every node, the ports free or held by our own containers, enough free memory for the node's share of
the weights plus headroom (unified memory: over-commit wedges a Spark), and disk for the weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkdeploy.deployment import Deployment, NodeDeployment
from sparkdeploy.facts import NodeFacts
from sparkdeploy.inventory import Node
from sparkdeploy.plan import StepKind, plan_node, short_id

HEADROOM_GB = 8.0  # on top of the weights: the OS, Docker, the CUDA context, activations
MIN_FREE_DISK_GB = 2.0
GIB = 1024  # MiB per GiB
PROXY_ROLES = ("proxy",)


@dataclass
class Check:
    node: str
    name: str  # ssh | docker | state-dir | names | image | ports | memory | disk
    ok: bool
    detail: str
    fix: str = ""
    missing_image: str | None = None  # an image reference a push would fix

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "check": self.name, "ok": self.ok, "detail": self.detail, "fix": self.fix}


def image_definition_name(ref: str) -> str:
    """sparkdeploy/vllm-sim:0123456789ab -> vllm-sim (the argument of `sparkdeploy images push`)."""
    repo = ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref
    return repo.rsplit("/", 1)[-1]


def weights_share_gb(dep: Deployment, nd: NodeDeployment) -> float | None:
    weights = dep.recipe.recipe.weights_gb
    if weights is None:
        return None
    return weights / dep.engine_size(nd.node.name)  # a TP/PP engine splits the weights over its nodes


def run(dep: Deployment, facts: dict[str, NodeFacts | Exception], simulated: bool = False) -> list[Check]:
    """All checks for every node of the inventory; `facts[name]` is the node's facts or why they are missing."""
    checks: list[Check] = []
    by_name = {nd.node.name: nd for nd in dep.nodes}
    for node in dep.inventory.nodes:
        f = facts.get(node.name)
        if f is None or isinstance(f, Exception):
            checks.append(Check(node.name, "ssh", False, str(f) if f else "not checked", _ssh_fix(f)))
            continue
        checks.append(Check(node.name, "ssh", True, f"{node.ssh.user or ''}@{node.mgmt_ip}".lstrip("@")))
        if not f.docker_ok:
            checks.append(
                Check(
                    node.name,
                    "docker",
                    False,
                    f"docker does not answer for the SSH user: {f.docker_error}",
                    "start Docker on the node and let the SSH user run it without sudo "
                    "(sudo usermod -aG docker USER, then log in again)",
                )
            )
            continue
        checks.append(Check(node.name, "docker", True, f"Docker {f.docker_version}"))
        if f.state_dir_foreign:
            checks.append(_foreign_state_dir(dep, node, f))
        nd = by_name.get(node.name)
        if nd is None:
            continue
        checks.extend(_names(nd, f))
        checks.extend(_images(nd, f))
        checks.extend(_ports(nd, f))
        checks.append(_memory(dep, nd, f))
        checks.extend(_disk(dep, nd, f, simulated))
    checks.extend(_same_image_ids(dep, facts))
    return checks


def _foreign_state_dir(dep: Deployment, node: Node, f: NodeFacts) -> Check:
    """A path in the state dir the SSH user does not own: files there cannot be replaced. Docker's daemon makes
    a missing bind-mount source as root, so a container restarted after its folder was removed leaves one."""
    user = node.ssh.user or "$USER"  # ssh.user is validated as a plain user name (inventory.USER_NAME)
    state_dir = f"~/{dep.inventory.cluster.state_dir}"
    return Check(
        node.name,
        "state-dir",
        False,
        f"{f.state_dir_foreign} is not owned by the SSH user {user} (often root: Docker creates a missing "
        f"bind-mount folder as root); sparkdeploy cannot replace files there",
        f"on {node.name}: sudo chown -R {user}: {state_dir}",
    )


def _ssh_fix(error: Exception | None) -> str:
    text = str(error or "")
    if "sparkdeploy trust" in text:
        return ""  # the message already names the command
    if "authentication" in text:
        return "check ssh.user and ssh.key in the inventory"
    return "check that the node is on, sshd runs, and mgmt_ip and ssh.port are right"


def _names(nd: NodeDeployment, f: NodeFacts) -> list[Check]:
    out = []
    for c in nd.containers:
        if c.name in f.other_names:
            out.append(
                Check(
                    nd.node.name,
                    "names",
                    False,
                    f"a container named {c.name} exists and is not sparkdeploy's (no io.sparkdeploy.managed label)",
                    f"rename or remove that container yourself (docker rm -f {c.name})",
                )
            )
    if not out:
        out.append(Check(nd.node.name, "names", True, "no foreign container holds our names"))
    return out


def _images(nd: NodeDeployment, f: NodeFacts) -> list[Check]:
    out = []
    for ref in sorted({c.image for c in nd.containers}):
        image_id = f.images.get(ref)
        if image_id:
            out.append(Check(nd.node.name, "image", True, f"{ref} ({short_id(image_id)})"))
        else:
            name = image_definition_name(ref)
            # a registry image (not one of our sparkdeploy/<definition> tags) is pulled, not pushed
            fix = (
                f"sparkdeploy images push {name}"
                if ref.startswith("sparkdeploy/")
                else f"sparkdeploy images pull {ref}"
            )
            out.append(
                Check(
                    nd.node.name,
                    "image",
                    False,
                    f"{ref} is not on {nd.node.name}",
                    fix,
                    missing_image=ref,
                )
            )
    return out


def _same_image_ids(dep: Deployment, facts: dict[str, NodeFacts | Exception]) -> list[Check]:
    ids: dict[str, dict[str, str]] = {}
    for nd in dep.nodes:
        f = facts.get(nd.node.name)
        if not isinstance(f, NodeFacts):
            continue
        for ref in {c.image for c in nd.containers}:
            if f.images.get(ref):
                ids.setdefault(ref, {})[nd.node.name] = f.images[ref]  # type: ignore[assignment]
    out = []
    for ref, per_node in sorted(ids.items()):
        if len(set(per_node.values())) > 1:
            seen = ", ".join(f"{n} {short_id(i)}" for n, i in sorted(per_node.items()))
            out.append(
                Check(
                    ",".join(sorted(per_node)),
                    "image",
                    False,
                    f"{ref} has different image IDs on the nodes ({seen})",
                    f"sparkdeploy images push {image_definition_name(ref)} (the same image everywhere)",
                )
            )
    return out


def _ours_running(f: NodeFacts) -> list[str]:
    return [c.name for c in f.containers if c.running or c.restarting]


def _ports(nd: NodeDeployment, f: NodeFacts) -> list[Check]:
    manifest_ports: dict[int, str] = {}
    for entry in (f.manifest or {}).get("containers") or []:
        if isinstance(entry, dict):
            for p in entry.get("ports") or []:
                if isinstance(p, int):
                    manifest_ports[p] = str(entry.get("name", ""))
    running = set(_ours_running(f))
    out = []
    for c in nd.containers:
        for port in c.ports:
            if port not in f.listening:
                out.append(Check(nd.node.name, "ports", True, f"{port} free ({c.name})"))
            elif manifest_ports.get(port) in running or (running and port not in manifest_ports):
                holder = manifest_ports.get(port) or ", ".join(sorted(running))
                out.append(Check(nd.node.name, "ports", True, f"{port} held by our {holder}"))
            else:
                out.append(
                    Check(
                        nd.node.name,
                        "ports",
                        False,
                        f"port {port} (needed by {c.name}) is in use by another program",
                        "stop that program, or choose another port in the inventory "
                        "(cluster.vllm_port, proxy_port, master_port, ray_port)",
                    )
                )
    return out


def _memory(dep: Deployment, nd: NodeDeployment, f: NodeFacts) -> Check:
    share = weights_share_gb(dep, nd)
    engines = [c for c in nd.containers if c.role not in PROXY_ROLES]
    free = f.free_memory_mb
    free_text = f"{free / GIB:.1f} GiB free" if free is not None else "free memory unknown"
    if not engines:
        return Check(nd.node.name, "memory", True, "no engine on this node")
    if share is None:
        return Check(nd.node.name, "memory", True, f"not checked: the recipe has no weights_gb ({free_text})")
    need = share + HEADROOM_GB
    node_plan = plan_node(dep, nd, f)
    engine_names = {c.name for c in engines}
    restarts = [
        s for s in node_plan.steps if s.kind == StepKind.START_CONTAINER and s.change and s.target in engine_names
    ]
    if not restarts:
        return Check(nd.node.name, "memory", True, "our engine runs unchanged")
    if not f.resources:
        return Check(nd.node.name, "memory", False, "free memory was not read", "run again")
    running = _ours_running(f)
    if running:
        return Check(
            nd.node.name,
            "memory",
            True,
            f"{free_text} while our {', '.join(running)} run; they are removed before the new engine "
            f"starts (needs {need:.0f} GiB)",
        )
    if free is None:
        return Check(
            nd.node.name, "memory", False, "cannot read free memory (/proc/meminfo, nvidia-smi)", "check the node"
        )
    if free / GIB < need:
        return Check(
            nd.node.name,
            "memory",
            False,
            f"{free_text}; needs {share:.0f} GiB of weights + {HEADROOM_GB:.0f} GiB headroom = {need:.0f} GiB "
            f"(unified memory: over-commit wedges the node)",
            "stop what uses the memory on the node, or use a topology that splits the weights (cluster)",
        )
    return Check(nd.node.name, "memory", True, f"{free_text} >= {need:.0f} GiB ({share:.0f} weights + headroom)")


def _disk(dep: Deployment, nd: NodeDeployment, f: NodeFacts, simulated: bool) -> list[Check]:
    if not f.resources:
        return [Check(nd.node.name, "disk", True, "nothing new starts on this node")]
    out = []
    weights = dep.recipe.recipe.weights_gb
    need_hf = MIN_FREE_DISK_GB
    why = "the model is in the cache"
    if simulated:
        why = "simulated image: no weights are downloaded"
    elif not f.model_cached and weights:
        need_hf = weights + MIN_FREE_DISK_GB
        why = f"the model is not in {dep.inventory.cluster.hf_cache} yet: {weights:g} GB to download"
    for where, need, reason in (
        ("hf_cache", need_hf, why),
        ("docker", MIN_FREE_DISK_GB, "Docker's data root"),
        ("home", MIN_FREE_DISK_GB, "the state dir"),
    ):
        free = f.disk_free_mb.get(where)
        if free is None:
            continue
        if free / GIB < need:
            out.append(
                Check(
                    nd.node.name,
                    "disk",
                    False,
                    f"{where}: {free / GIB:.1f} GiB free, needs {need:.0f} GiB ({reason})",
                    "free disk space on the node",
                )
            )
        else:
            out.append(Check(nd.node.name, "disk", True, f"{where}: {free / GIB:.0f} GiB free ({reason})"))
    return out


def failures(checks: list[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]
