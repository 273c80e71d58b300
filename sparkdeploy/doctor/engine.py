"""engine.*: the Docker engine runs (version), disk for images, weights and the state dir, and no foreign
container holds one of our names. `disk` and `names` are preflight checks of `up` too."""

from __future__ import annotations

from sparkdeploy.checks import Result, fail, ok, skip, warn
from sparkdeploy.config.inventory import Node
from sparkdeploy.facts import ContainerFact, NodeFacts
from sparkdeploy.facts.parsers import gib, version_tuple

from .check_context import CheckContext

MIN_VERSION = (20, 10)
# Docker's root fails below MIN_FREE_DISK_GIB (nothing can start) and warns below DISK_WARN_GIB: one vLLM GPU image
# is 15-25 GB unpacked, and a new version lands while the old one still runs. (doctor failed below 20 GiB and
# preflight below 2: one formula now, and a lab on a host with 17 GiB free must still deploy.)
DISK_WARN_GIB = 50
MIN_FREE_DISK_GIB = 2  # the HF cache beyond the weights, and the state dir in $HOME


def state_text(c: ContainerFact) -> str:
    """Docker's words for a container's state, as `docker ps` writes them (Paused, Exited (137), ...)."""
    if c.status == "exited":
        return f"Exited ({c.exit_code})"
    return c.status.capitalize()


def running(run: CheckContext, node: Node) -> Result:
    f = run.node_facts(node)
    expected = f"running, >= {'.'.join(map(str, MIN_VERSION))}"
    if not f.docker_ok:
        return fail(
            f"not running: {f.docker_error or 'no answer'}",
            expected,
            "sudo systemctl start docker (and `systemctl enable docker` so it survives a reboot)",
        )
    if version_tuple(f.docker_version) < MIN_VERSION:
        return warn(f"Docker {f.docker_version} (old)", expected, "upgrade Docker (DGX OS: sudo apt upgrade docker-ce)")
    driver = f.docker_driver if f.has("docker_info") else ""  # `up`'s preflight reads STATE, without docker_info
    return ok(f"Docker {f.docker_version}" + (f" ({driver})" if driver else ""), expected)


def _disk_rows(run: CheckContext, f: NodeFacts) -> list[tuple[str, float, float, str]]:
    """(where, fail below GiB, warn below GiB, why) for each place a deployment writes to."""
    dep = run.deployment
    weights = dep.recipe.recipe.weights_gb if dep else None
    spec = dep.recipe.recipe.speculative if dep else None
    if weights and spec and spec.model and spec.weights_gb:  # the draft is pulled with the model (issue 39)
        weights += spec.weights_gb
    need_hf, why = float(MIN_FREE_DISK_GIB), "the model is in the cache"
    if run.simulated_image:
        why = "simulated image: no weights are downloaded"
    elif not f.model_cached and weights:
        need_hf = weights + MIN_FREE_DISK_GIB
        why = f"the model is not in {run.inventory.cluster.hf_cache} yet: {weights:g} GB to download"  # type: ignore[union-attr]  # checks run only with an inventory
    rows = [("hf_cache", need_hf, need_hf, why)] if dep else []
    root = f.docker_root if f.has("docker_info") else ""  # as above: not in `up`'s set
    where = f" {root}" if root else ""
    rows.append(("docker", MIN_FREE_DISK_GIB, DISK_WARN_GIB, f"Docker's data root{where}: images"))
    rows.append(("home", MIN_FREE_DISK_GIB, MIN_FREE_DISK_GIB, "the state dir"))
    return rows


def disk(run: CheckContext, node: Node) -> list[Result]:
    """Free disk where a deployment writes: the HF cache (the weights unless cached or simulated), Docker's
    data root (images) and $HOME (the state dir)."""
    f = run.node_facts(node)
    if not (f.has("resources") and f.resources):  # read only where something starts
        return [skip("nothing new starts on this node")]
    out = []
    fix = "free space: docker image prune (removes unused images), or move the Docker root to a larger disk"
    for where, fail_gib, warn_gib, why in _disk_rows(run, f):
        free_mb = f.disk_free_mb.get(where)
        if free_mb is None:
            continue  # df could not read it (the place does not exist yet)
        free = free_mb * 2**20
        usage = f.disk.get(where)
        expected = f">= {warn_gib:.0f} GiB free ({why})"
        measured = f"{where}: {gib(free)} free" + (f" on {usage.mount}" if usage else "")
        if free < fail_gib * 2**30:
            mount = usage.mount if usage else where
            why_fix = (
                fix
                if where == "docker"
                else f"free {fail_gib - free / 2**30:.0f} GiB on {mount} of {f.node}"
                + (
                    " (`sparkdeploy models list` shows what the cache holds), or set cluster.hf_cache to a folder on "
                    "a larger disk"
                    if where == "hf_cache"
                    else ""
                )
            )
            out.append(fail(measured + f", needs {fail_gib:.0f} GiB ({why})", expected, why_fix))
        elif free < warn_gib * 2**30:
            out.append(warn(measured, expected, fix))
        else:
            out.append(ok(measured + f" ({why})", expected))
    return out


def names(run: CheckContext, node: Node) -> list[Result]:
    """A container named like one of ours that is not sparkdeploy's (no io.sparkdeploy.managed label)."""
    nd = run.node_deployment(node)
    if nd is None:
        return [skip(f"this recipe/topology runs nothing on {node.name}")]
    f = run.node_facts(node)
    expected = "no foreign container holds our names"
    out = [
        fail(
            f"a container named {c.name} exists and is not sparkdeploy's (no io.sparkdeploy.managed label)",
            expected,
            f"rename or remove that container yourself (docker rm -f {c.name})",
        )
        for c in nd.containers
        if c.name in f.other_names
    ]
    return out or [ok("no foreign container holds our names", expected)]
