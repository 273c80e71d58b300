"""`up` with a registry image (deploy/up.py): every node of the deployment holds it before anything is planned
(images/registry_pull.py pulls it once and spreads it over the fabric)."""

from __future__ import annotations

from collections.abc import Callable

from sparkdeploy.deploy.progress import Reporter
from sparkdeploy.deploy.up_result import UpResult
from sparkdeploy.errors import StepFailed
from sparkdeploy.images.image_ref import RegistryImage
from sparkdeploy.images.registry_pull import dry_run_lines, pull_and_spread
from sparkdeploy.recipes.engines.registered import engine_of
from sparkdeploy.topologies.deployment import Deployment


def for_deployment(
    dep: Deployment, out: Reporter, result: UpResult, dry_run: bool, rerender: Callable[[], Deployment]
) -> Deployment:
    """`up` with a registry image: make every node of the deployment hold it (pulled once, digest checked, sent
    over the fabric), then render again when its CLI was read just now, so its flags are checked before any
    container starts (a flag it lacks: exit 2, nothing started). `--dry-run` only says what it would do."""
    image = dep.image
    assert isinstance(image, RegistryImage)
    nodes = [nd.node for nd in dep.nodes if image.tag in {c.image for c in nd.containers}]
    if not nodes:
        return dep
    if dry_run:
        for line in dry_run_lines(image.reference, nodes, None):
            out.progress(f"would {line}")
        return dep
    # another engine's image (SGLang): its flags are its pinned parser's (recipes/engines/), no vLLM CLI to read
    vllm = engine_of(dep.recipe.recipe).name == "vllm"
    pulled = pull_and_spread(image.reference, dep.inventory, nodes, say=out.progress, read_vllm_cli=vllm)
    result.registry_image = pulled.as_dict()
    for warning in pulled.warnings:
        out.warn(warning)
    if pulled.failed:
        raise StepFailed(
            f"{image.reference} did not reach every node (pulled on {pulled.node}): "
            + "; ".join(f"{node}: {why}" for node, why in sorted(pulled.failed.items()))
            + ". No container was changed."
        )
    return rerender() if (vllm and image.cli is None) or image.digest != pulled.digest else dep
