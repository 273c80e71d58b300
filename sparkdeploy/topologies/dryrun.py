"""Describe a deployment without touching any host: per node, in order, every file and every command.

Secret files show their variable names with masked values; the whole text is also passed through the
secrets mask, so a secret that leaked into any other file would still not be printed.
"""

from __future__ import annotations

from typing import Any

from sparkdeploy.recipes.engines.registered import engine_of
from sparkdeploy.topologies.deployment import Deployment


def describe(dep: Deployment) -> dict[str, Any]:
    r = dep.recipe
    out: dict[str, Any] = {
        "recipe": r.name,
        "topology": r.topology,
        "backend": r.backend or None,
        "image": dep.image_tag,
        "image_definition": dep.image.name,
        "vllm_version": dep.image.vllm_version,
        "engine": engine_of(dep.recipe.recipe).name,
        "engine_version": engine_of(dep.recipe.recipe).describe(dep.image),
        "endpoint": dep.endpoint,
        "model": dep.model_name,
        "backends": dep.backends,
        "warnings": dep.warnings,
        "nodes": [],
    }
    for nd in dep.nodes:
        files = {f.name: f for f in nd.files}
        steps = []
        for kind, text in nd.fresh_steps():
            if kind == "write":
                f = files[text]
                steps.append(
                    {
                        "write": f"~/{nd.state_dir}/{f.name}",
                        "mode": f"{f.mode:04o}",
                        "secret": f.secret,
                        "content": f.shown(),
                    }
                )
            else:
                steps.append({"run": text})
        out["nodes"].append(
            {
                "name": nd.node.name,
                "mgmt_ip": nd.node.mgmt_ip,
                "role": nd.node.role,
                "containers": [
                    {"name": c.name, "role": c.role, "image": c.image, "config_hash": c.config_hash}
                    for c in nd.containers
                ],
                "steps": steps,
            }
        )
    masked: dict[str, Any] = mask(dep, out)
    return masked


def mask(dep: Deployment, data: Any) -> Any:
    """Every string of a JSON-shaped value (str, list, dict) through the secrets mask."""
    if isinstance(data, str):
        return dep.secrets.mask(data)
    if isinstance(data, list):
        return [mask(dep, x) for x in data]
    if isinstance(data, dict):
        return {k: mask(dep, v) for k, v in data.items()}
    return data


def as_text(desc: dict[str, Any]) -> str:
    lines = []
    backend = f" (backend {desc['backend']})" if desc["backend"] else ""
    lines.append("DRY RUN: nothing is changed on any node.")
    lines.append(f"recipe {desc['recipe']}, topology {desc['topology']}{backend}")
    if desc["engine"] == "vllm":  # the line every vLLM dry run has always had (the goldens)
        lines.append(f"image {desc['image']} (definition {desc['image_definition']}, vLLM {desc['vllm_version']})")
    else:
        lines.append(f"image {desc['image']} (definition {desc['image_definition']}, {desc['engine_version']})")
    lines.append(f"endpoint {desc['endpoint']} (model {desc['model']})")
    for url in desc["backends"]:
        lines.append(f"backend {url}")
    for w in desc["warnings"]:
        lines.append(f"warning: {w}")
    for node in desc["nodes"]:
        lines.append("")
        lines.append(f"== {node['name']} {node['mgmt_ip']} ({node['role']}) ==")
        for i, step in enumerate(node["steps"], 1):
            if "run" in step:
                lines.append(f"{i:>2}. run   {step['run']}")
            else:
                tag = ", secret: values masked" if step["secret"] else ""
                lines.append(f"{i:>2}. write {step['write']} (mode {step['mode']}{tag})")
                for content_line in step["content"].rstrip("\n").split("\n"):
                    lines.append(f"      | {content_line}")
    return "\n".join(lines) + "\n"
