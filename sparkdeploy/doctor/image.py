"""image.*: the recipe's image (the inventory's image_override when set) is on every node that runs it, with
the same image ID everywhere; torch and NCCL inside it are the same version on every node.

Versions are read by running the image: `docker run --rm --network none --entrypoint python3 IMAGE -c ...`
(no GPU needed: torch reports the NCCL version it was built with). NCCL builds that differ between nodes
are a classic cross-node hang. The lab's vllm-sim image has a CPU torch without NCCL: that is reported as
such (SIMULATED), not as a pass of an NCCL comparison that did not happen.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sparkdeploy.errors import StepFailed
from sparkdeploy.inventory import Node

from . import engine, gather
from .model import Result, fail, ok, skip, warn
from .session import DoctorRun, NodeSession

VERSIONS_PY = r"""
import json
out = {}
# Broad on purpose: torch in an unknown image fails in many ways (ImportError, OSError for a missing CUDA
# library, RuntimeError from a build without NCCL), importing it or asking it; each failure is the finding.
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    try:
        v = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as exc:
        out["nccl"] = None
        out["nccl_error"] = (type(exc).__name__ + ": " + str(exc))[:160]
    try:
        import torch.distributed as dist
        out["nccl_backend"] = bool(dist.is_available() and dist.is_nccl_available())
    except Exception:
        out["nccl_backend"] = False
except Exception as exc:
    out["torch"] = None
    out["torch_error"] = (type(exc).__name__ + ": " + str(exc))[:160]
try:
    import importlib.metadata as md
    out["vllm"] = md.version("vllm")
except ImportError:  # PackageNotFoundError: no vLLM in this image
    out["vllm"] = None
print("@@versions@@" + json.dumps(out))
"""

PRESENT_SCRIPT = r"""
shift 3
i=0
for ref in "$@"; do sec "img$i" docker image inspect --format '{{.Id}}' "$ref"; i=$((i+1)); done
"""


def required(run: DoctorRun, node: Node) -> list[str]:
    nd = run.node_deployment(node)
    return sorted({c.image for c in nd.containers}) if nd else []


def serving_image(run: DoctorRun, node: Node) -> str | None:
    nd = run.node_deployment(node)
    if not nd:
        return None
    return next((c.image for c in nd.containers if c.role != "proxy"), None)


def parse_ids(secs: dict, refs: list[str], node: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, ref in enumerate(refs):
        sec = secs.get(f"img{i}")
        if sec is not None and sec.rc == 0 and sec.out.strip():
            out[ref] = sec.out.strip()
        elif sec is not None and "no such image" in (sec.err + sec.out).lower():
            out[ref] = None
        else:  # the engine did not say "no such image": not proof of absence
            why = ((sec.err or sec.out).strip().splitlines() or ["no answer"])[-1] if sec else "no answer"
            raise StepFailed(f"{node}: docker image inspect {ref} failed: {why}")
    return out


def ids(run: DoctorRun, node: Node) -> dict[str, str | None]:
    """Image IDs of the node's required images (inspected in the node's one batched facts command)."""
    refs = required(run, node)
    return run.facts(node, "image.ids", lambda s: parse_ids(gather.base(run, node), refs, node.name))


def _versions(session: NodeSession, ref: str) -> dict:
    res = session.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", ref, "-c", VERSIONS_PY], timeout=120
    )
    for line in res.stdout.splitlines():
        if line.startswith("@@versions@@"):
            return json.loads(line[len("@@versions@@") :])
    tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or [f"exit {res.exit_code}"]
    return {"error": tail[0]}


def _cache_path() -> Path:
    from sparkdeploy import paths

    return paths.state_dir() / "doctor" / "image-versions.json"


def _cached(image_id: str) -> dict | None:
    try:
        return json.loads(_cache_path().read_text()).get(image_id)
    except (OSError, ValueError, AttributeError):
        return None


def _remember(image_id: str, value: dict) -> None:
    """Versions per image ID on this machine: an ID is a content hash, the same ID is the same torch."""
    from sparkdeploy import paths
    from sparkdeploy.errors import ConfigError

    path = _cache_path()
    try:
        paths.state_folder(path=path.parent)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        data[image_id] = value
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except (OSError, ConfigError):
        pass  # a cache only


def versions(run: DoctorRun, node: Node) -> dict | None:
    """torch/NCCL of the node's serving image, read once per image ID (per run, and cached on this machine)."""
    ref = serving_image(run, node)
    if ref is None or not engine.facts(run, node)["running"]:
        return None
    image_id = ids(run, node).get(ref)
    if image_id is None:
        return None

    def read() -> dict:
        cached = _cached(image_id)
        if cached is not None:
            return dict(cached, cached=True)
        value = _versions(run.session(node), ref)
        if "error" not in value:
            _remember(image_id, value)
        return value

    return run.memo.get(("image.versions", image_id), read)


def _peers_needing(run: DoctorRun, node: Node, ref: str) -> list[Node]:
    return [
        p for p in run.peers(node) if run.reachable(p) and ref in required(run, p) and engine.facts(run, p)["running"]
    ]


def present(run: DoctorRun, node: Node) -> Result:
    refs = required(run, node)
    if not refs:
        return skip(f"this recipe/topology runs nothing on {node.name}")
    if not engine.facts(run, node)["running"]:
        return skip("engine not running (see engine.running)")
    have = ids(run, node)
    sim = run.simulated_image
    missing = [r for r in refs if have.get(r) is None]
    expected = "present, same image ID on every node"
    if missing:
        user = node.ssh.user or "USER"
        return fail(
            f"missing: {', '.join(missing)}",
            expected,
            f"sparkdeploy images push {missing[0]} --to {node.name} (only missing layers travel; "
            f"`sparkdeploy up` does it too); by hand: docker save {missing[0]} | "
            f"ssh {user}@{node.mgmt_ip} docker load",
            simulated=sim,
        )
    differ = []
    for ref in refs:
        for peer in _peers_needing(run, node, ref):
            other = ids(run, peer).get(ref)
            if other is not None and other != have[ref]:
                differ.append(f"{ref} is {have[ref][7:19]} here, {other[7:19]} on {peer.name}")  # type: ignore[index]  # present: checked above
    shown = ", ".join(f"{r} ({have[r][7:19]})" for r in refs)  # type: ignore[index]  # present: checked above
    if differ:
        return fail(
            "; ".join(differ),
            expected,
            f"the same tag holds different content: sparkdeploy images push {refs[0]} (sets every node "
            "to this machine's image ID)",
            simulated=sim,
        )
    return ok(shown, expected, simulated=sim)


def _fmt(v: dict) -> str:
    if v.get("torch") is None:
        return f"no torch ({v.get('torch_error', '?')})"
    nccl = v.get("nccl") or "none"
    return f"torch {v['torch']}, NCCL {nccl}" + (f", vLLM {v['vllm']}" if v.get("vllm") else "")


def torch_nccl(run: DoctorRun, node: Node) -> Result:
    ref = serving_image(run, node)
    if ref is None:
        return skip(f"no engine of this recipe runs on {node.name}")
    if not engine.facts(run, node)["running"]:
        return skip("engine not running (see engine.running)")
    if ids(run, node).get(ref) is None:
        return skip("image missing (see image.present)")
    v = versions(run, node)
    simulated = run.simulated_image
    expected = "torch and NCCL equal on every node"
    if "error" in v:  # type: ignore[operator]  # versions is a dict here: image and engine checked above
        return fail(
            f"could not run python3 in {ref}: {v['error']}",  # type: ignore[index]  # versions is a dict here: image and engine checked above
            expected,
            f"check the image: docker run --rm --entrypoint python3 {ref} -c 'import torch'",
        )
    if v.get("torch") is None:  # type: ignore[union-attr]  # versions is a dict here: image and engine checked above
        return fail(_fmt(v), expected, "the serving image needs torch: rebuild it from its definition")  # type: ignore[arg-type]  # versions is a dict here: image and engine checked above
    differ = []
    for peer in _peers_needing(run, node, ref):
        pv = versions(run, peer)
        if not pv or "error" in pv:
            continue
        for key in ("torch", "nccl"):
            if pv.get(key) != v.get(key):  # type: ignore[union-attr]  # versions is a dict here: image and engine checked above
                differ.append(f"{key} {v.get(key) or 'none'} here, {pv.get(key) or 'none'} on {peer.name}")  # type: ignore[union-attr]  # versions is a dict here: image and engine checked above
    measured = _fmt(v)  # type: ignore[arg-type]  # versions is a dict here: image and engine checked above
    if differ:
        return fail(
            "; ".join(differ),
            expected,
            "NCCL/torch builds that differ hang or corrupt cross-node all-reduce: run one image ID on "
            "every node (resend it)",
            data=v,
        )
    if v.get("nccl") is None:  # type: ignore[union-attr]  # versions is a dict here: image and engine checked above
        why = v.get("nccl_error", "")  # type: ignore[union-attr]  # versions is a dict here: image and engine checked above
        if simulated:
            return ok(
                measured + " (CPU torch build: no NCCL; SIMULATED image, the probe uses gloo)" + _cache_note(v),  # type: ignore[arg-type]  # versions is a dict here: image and engine checked above
                expected,
                simulated=True,
                data=v,
            )
        if run.deployment.topology == "cluster":  # type: ignore[union-attr]  # needs_recipe: a deployment
            return fail(
                measured,
                expected + ", NCCL present for cluster TP",
                f"this torch has no NCCL ({why}): use a CUDA build of the image",
                data=v,
            )
        return warn(measured, expected, "this torch has no NCCL: fine for solo/2xsolo, not for cluster", data=v)
    return ok(measured + _cache_note(v), expected, data=v)  # type: ignore[arg-type]  # versions is a dict here: image and engine checked above


def _cache_note(v: dict) -> str:
    return "; cached by image ID" if v.get("cached") else ""
