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
from typing import Any

from sparkdeploy.checks import Result, fail, ok, skip, warn
from sparkdeploy.config.inventory import Node
from sparkdeploy.config.userfile import load_json_file
from sparkdeploy.errors import ConfigError, StepFailed
from sparkdeploy.nodeside import ship
from sparkdeploy.recipes.engines.registered import engine_of, engine_version

from .check_context import CheckContext, SessionContext
from .doctor_run import NodeSession


def required(run: CheckContext, node: Node) -> list[str]:
    nd = run.node_deployment(node)
    return sorted({c.image for c in nd.containers}) if nd else []


def serving_image(run: CheckContext, node: Node) -> str | None:
    nd = run.node_deployment(node)
    if not nd:
        return None
    return next((c.image for c in nd.containers if c.role != "proxy"), None)


def ids(run: CheckContext, node: Node) -> dict[str, str | None]:
    """Image IDs of the node's required images (the fact `images`, read in the node's one facts command); an
    engine error other than "no such image" is not proof of absence: it is raised."""
    f = run.node_facts(node)
    for ref in required(run, node):
        if ref in f.image_errors:
            raise StepFailed(f"{node.name}: docker image inspect {ref} failed: {f.image_errors[ref]}")
    return {ref: f.images.get(ref) for ref in required(run, node)}


def _engine_up(run: CheckContext, node: Node) -> bool:
    return run.node_facts(node).docker_ok


def _versions(session: NodeSession, ref: str) -> dict[str, Any]:
    # nodeside/image_versions.py, shipped whole in the command line (nodeside/ship.py), run by the image's python3
    python, *program = ship.argv("image-versions")
    res = session.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", python, ref, *program], timeout=120
    )
    for line in res.stdout.splitlines():
        if line.startswith("@@versions@@"):
            found: dict[str, Any] = json.loads(line[len("@@versions@@") :])
            return found
    tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or [f"exit {res.exit_code}"]
    return {"error": tail[0]}


def _cache_path() -> Path:
    from sparkdeploy import paths

    return paths.state_dir() / "doctor" / "image-versions.json"


def _cached(image_id: str) -> dict[str, Any] | None:
    try:
        cached: dict[str, Any] | None = load_json_file(_cache_path(), "image versions cache").get(image_id)
        return cached
    except (ConfigError, AttributeError):
        return None


def _remember(image_id: str, value: dict[str, Any]) -> None:
    """Versions per image ID on this machine: an ID is a content hash, the same ID is the same torch."""
    from sparkdeploy import paths

    path = _cache_path()
    try:
        paths.state_folder(path=path.parent)
        try:
            data = load_json_file(path, "image versions cache")
        except ConfigError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        data[image_id] = value
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except (OSError, ConfigError):
        pass  # a cache only


def versions(run: SessionContext, node: Node) -> dict[str, Any] | None:
    """torch/NCCL of the node's serving image, read once per image ID (per run, and cached on this machine)."""
    ref = serving_image(run, node)
    if ref is None or not _engine_up(run, node):
        return None
    image_id = ids(run, node).get(ref)
    if image_id is None:
        return None

    def read() -> dict[str, Any]:
        cached = _cached(image_id)
        if cached is not None:
            return dict(cached, cached=True)
        value = _versions(run.session(node), ref)
        if "error" not in value:
            _remember(image_id, value)
        return value

    return run.memo.get(("image.versions", image_id), read)


def _peers_needing(run: SessionContext, node: Node, ref: str) -> list[Node]:
    return [p for p in run.peers(node) if run.reachable(p) and ref in required(run, p) and _engine_up(run, p)]


def image_definition_name(ref: str) -> str:
    """sparkdeploy/vllm-sim:0123456789ab -> vllm-sim (the argument of `sparkdeploy images push`)."""
    repo = ref.rsplit(":", 1)[0] if ":" in ref.rsplit("/", 1)[-1] else ref
    return repo.rsplit("/", 1)[-1]


def present(run: CheckContext, node: Node) -> list[Result]:
    """One row per image the node runs: present (its ID), or missing with the push that fixes it."""
    refs = required(run, node)
    if not refs:
        return [skip(f"this recipe/topology runs nothing on {node.name}")]
    if not _engine_up(run, node):
        return [skip("engine not running (see engine.running)")]
    have = ids(run, node)
    sim = run.simulated_image
    expected = "present, same image ID on every node"
    out = []
    for ref in refs:
        image_id = have.get(ref)
        if image_id:
            out.append(ok(f"{ref} ({image_id[7:19]})", expected, simulated=sim))
            continue
        out.append(
            fail(f"{ref} is not on {node.name}", expected, _missing_fix(ref, node), simulated=sim, missing_image=ref)
        )
    return out


def _missing_fix(ref: str, node: Node) -> str:
    """Our images (sparkdeploy/<definition>:<hash>) are pushed node to node; a registry image is pulled once."""
    if not ref.startswith("sparkdeploy/"):
        return f"sparkdeploy images pull {ref} --on {node.name} (pulled once, sent to the other nodes over the fabric)"
    user = node.ssh.user or "USER"
    return (
        f"sparkdeploy images push {image_definition_name(ref)} --to {node.name} (only missing layers "
        f"travel; `sparkdeploy up` pushes it itself when no other check fails); by hand: docker save {ref} | "
        f"ssh {user}@{node.mgmt_ip} docker load"
    )


def same_id(run: CheckContext) -> list[Result]:
    """One tag, one image ID on every node that runs it (a tag rebuilt on one node is different content)."""
    per_ref: dict[str, dict[str, str]] = {}
    for node in run.nodes:
        if not run.reachable(node) or not required(run, node):
            continue
        try:
            have = ids(run, node) if _engine_up(run, node) else {}
        except StepFailed:
            continue  # image.present says it for that node
        for ref, image_id in have.items():
            if image_id:
                per_ref.setdefault(ref, {})[node.name] = image_id
    out = []
    for ref, per_node in sorted(per_ref.items()):
        if len(set(per_node.values())) > 1:
            seen = ", ".join(f"{n} {i[7:19]}" for n, i in sorted(per_node.items()))
            out.append(
                fail(
                    f"{ref} has different image IDs on the nodes ({seen})",
                    "one image ID per tag on every node",
                    f"sparkdeploy images push {image_definition_name(ref)} (the same image everywhere)",
                    node=",".join(sorted(per_node)),
                    simulated=run.simulated_image,
                )
            )
    if not out:
        shown = ", ".join(f"{ref} ({next(iter(p.values()))[7:19]} on {len(p)})" for ref, p in sorted(per_ref.items()))
        out.append(
            ok(shown or "no image to compare", "one image ID per tag on every node", simulated=run.simulated_image)
        )
    return out


def engine(run: CheckContext) -> Result:
    """The engine the deployment serves with and its version, as the recipe and its image say (engines/registered.py
    `engine_version`); in a stack, one row per deployment (the runner names it)."""
    dep = run.deployment
    assert dep is not None, "needs_recipe: a deployment"
    info = engine_version(dep.recipe.recipe, dep.image)
    expected = "the engine's version known (pinned, or read from the image)"
    data = dict(info.as_dict(), image=dep.image_tag)
    measured = f"{info.text} ({dep.image_tag})"
    if info.version is None:
        return warn(
            measured,
            expected,
            f"sparkdeploy images pull {dep.recipe.recipe.image} --on NODE (reads the version from the image)",
            data=data,
            simulated=run.simulated_image,
        )
    return ok(measured, expected, data=data, simulated=run.simulated_image)


def _fmt(v: dict[str, Any]) -> str:
    if v.get("torch") is None:
        return f"no torch ({v.get('torch_error', '?')})"
    nccl = v.get("nccl") or "none"
    cuda = f", CUDA {v['cuda']}" if v.get("cuda") else ""
    return f"torch {v['torch']}{cuda}, NCCL {nccl}" + (f", vLLM {v['vllm']}" if v.get("vllm") else "")


def torch_nccl(run: SessionContext, node: Node) -> Result:
    ref = serving_image(run, node)
    if ref is None:
        return skip(f"no engine of this recipe runs on {node.name}")
    if not _engine_up(run, node):
        return skip("engine not running (see engine.running)")
    if ids(run, node).get(ref) is None:
        return skip("image missing (see image.present)")
    recipe = run.deployment.recipe.recipe if run.deployment is not None else None
    if recipe is not None and not engine_of(recipe).uses_torch:  # llama.cpp: C++, no Python in its image
        return skip(f"{engine_of(recipe).title} ({ref}): no torch or NCCL in its image")
    v = versions(run, node)
    simulated = run.simulated_image
    expected = "torch, CUDA and NCCL equal on every node"
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
        for key in ("torch", "cuda", "nccl"):
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


def _cache_note(v: dict[str, Any]) -> str:
    return "; cached by image ID" if v.get("cached") else ""
