"""The link to deploy: the endpoint of what is deployed now (sparkdeploy.deploy.status), and bringing a topology
up for a sweep (sparkdeploy.deploy.up). Metadata comes from the rendered deployment (recipe, topology,
backend, routing, image tag, engine and its version, simulated, nodes) and from status (image IDs of the containers).
The proxy master key comes from the inventory's secrets file (or the environment) and stays in memory."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, cast

from sparkdeploy.bench.benchy import Endpoint
from sparkdeploy.deploy.down import remove
from sparkdeploy.deploy.progress import Reporter
from sparkdeploy.deploy.status import cluster_status
from sparkdeploy.deploy.up import deploy
from sparkdeploy.errors import ConfigError, NothingDeployed, Problem, StepFailed
from sparkdeploy.images import build
from sparkdeploy.images.definitions import ImageDefinition, load_definition
from sparkdeploy.recipes.engines.registered import engine_version as recipe_engine
from sparkdeploy.simulated import headers_say_simulated
from sparkdeploy.topologies.context import load_deployment
from sparkdeploy.topologies.deployment import Deployment


def status_json(inventory: str | None) -> dict[str, Any]:
    """What `sparkdeploy status --json` reports (deploy's public contract), read through the library."""
    return cluster_status(inventory)


def _engine_images(status: dict[str, Any], field: str) -> dict[str, str]:
    """{node: value of `field`} for the engine containers (not the proxy) that status lists."""
    out: dict[str, str] = {}
    for n in status.get("nodes") or []:
        for c in n.get("containers") or []:
            if c.get(field) and c.get("role") != "proxy":
                out[n.get("name", "?")] = c[field]
    return out


def _running_definition(dep: Deployment) -> ImageDefinition:
    """The image definition of the tag that runs (the lab's image_override puts vllm-sim in place of the
    recipe's image): sparkdeploy/<name>:<hash> -> <name>."""
    name = dep.image_tag.rsplit("/", 1)[-1].split(":", 1)[0]
    try:
        return load_definition(name)
    except Exception:  # noqa: BLE001 - no definition for the tag: the tag is what is shown
        return dep.image


def endpoint_of(
    inventory: str | None,
    recipe: str | None,
    topology: str | None,
    backend: str | None = None,
    sets: tuple[str, ...] | list[str] = (),
    recipes_dir: str | None = None,
    status: dict[str, Any] | None = None,
) -> Endpoint:
    """The endpoint and metadata of a deployment (rendered locally; nothing connects anywhere but status)."""
    dep = load_deployment(inventory, recipe, topology, backend, tuple(sets), recipes_dir)
    routing = dep.recipe.recipe.litellm.routing_strategy if dep.topology == "2xsolo" else None
    # nodes per engine (cluster: TP x PP over every node; replicas: one TP group each; solo, 2xsolo: 1)
    running = _running_definition(dep)
    md: dict[str, Any] = {
        "recipe": dep.recipe.name,
        "topology": dep.topology,
        "backend": dep.backend or None,
        "routing": routing,
        "image": dep.image_tag,
        "image_definition": running.name,
        "recipe_image": dep.image.name,
        # the engine and its version (SGLang 0.5.23, ...); vllm_version only for vLLM (older results have only it)
        **recipe_engine(dep.recipe.recipe, running).as_dict(),
        "vllm_version": running.vllm_version if dep.recipe.recipe.engine == "vllm" else None,
        "simulated": bool(running.simulated),
        "simulated_evidence": f"the running image {running.name} is marked simulated" if running.simulated else None,
        "inventory": dep.inventory.source,
        "nodes": [{"name": nd.node.name, "mgmt_ip": nd.node.mgmt_ip, "role": nd.node.role} for nd in dep.nodes],
        "backends": list(dep.backends),
        "engine_groups": [list(g) for g in dep.engine_groups],
    }
    if status is not None:
        ids = _engine_images(status, "image_id")
        md["image_ids"] = ids
        unique = sorted(set(ids.values()))
        md["image_id"] = unique[0] if len(unique) == 1 else (", ".join(unique) or None)
    key = dep.secrets.get("LITELLM_MASTER_KEY")
    return Endpoint(base_url=dep.endpoint, model=dep.model_name, api_key=key, metadata=md)


def current_endpoint(inventory: str | None, routing: str | None = None) -> Endpoint:
    """What `sparkdeploy status` says is deployed now."""
    status = status_json(inventory)
    if not status.get("deployed") or not status.get("endpoint"):
        raise NothingDeployed(
            status.get("inventory") or "the inventory's nodes",
            "run `sparkdeploy up` first, or pass --endpoint URL --model NAME",
        )
    if not status.get("healthy"):
        raise StepFailed(f"the deployment at {status['endpoint']} is not healthy (see `sparkdeploy status`)")
    sets = [f"litellm.routing_strategy={routing}"] if routing else []
    ep = endpoint_of(
        inventory, status.get("recipe"), status.get("topology"), status.get("backend"), sets, status=status
    )
    if status.get("endpoint") and ep.base_url != status["endpoint"].rstrip("/"):
        ep.metadata["endpoint_rendered"] = ep.base_url
        ep.base_url = Endpoint(status["endpoint"], ep.model).base_url
    if status.get("model"):
        ep.model = status["model"]
    running = sorted(set(_engine_images(status, "image").values()))
    if running and running != [ep.metadata.get("image")]:  # what runs, not what this checkout would render now
        ep.metadata["image_rendered"] = ep.metadata.get("image")
        ep.metadata["image"] = ", ".join(running)
    return ep


@dataclass
class EngineProbe:
    vllm_version: str | None
    simulated: bool | None  # None: the engine answered neither question
    evidence: str  # where `simulated` came from, recorded with the results


def _request(
    url: str, api_key: str | None, body: dict[str, Any] | None, timeout: float
) -> tuple[int, list[tuple[str, str]], Any]:
    """(status, headers, JSON body or None) of one request; status 0 when nothing answered."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to it, as llama-benchy goes
    try:
        with opener.open(req, timeout=timeout) as resp:
            raw = resp.read()
            status, headers = resp.status, list(resp.headers.items())
    except urllib.error.HTTPError as exc:
        return exc.code, list(exc.headers.items()) if exc.headers else [], None
    except (OSError, ValueError):  # refused, timed out, not HTTP
        return 0, [], None
    try:
        return status, headers, json.loads(raw)
    except ValueError:
        return status, headers, None


def _root(endpoint: Endpoint) -> str:
    return endpoint.base_url[: -len("/v1")] if endpoint.base_url.endswith("/v1") else endpoint.base_url


def _version(endpoint: Endpoint, timeout_s: float) -> tuple[str | None, list[tuple[str, str]]]:
    """GET /version: vLLM answers it (not under /v1); a proxy does not: then unknown. (version, headers)"""
    status, headers, body = _request(_root(endpoint) + "/version", None, None, timeout_s)
    ok = status == 200 and isinstance(body, dict) and body.get("version")
    return (str(body["version"]) if ok else None), headers


def engine_version(endpoint: Endpoint, timeout_s: float = 3.0) -> str | None:
    return _version(endpoint, timeout_s)[0]


def probe_engine(endpoint: Endpoint, timeout_s: float = 10.0) -> EngineProbe:
    """Ask the engine behind a URL its vLLM version and whether it is simulated (sparkdeploy.simulated: vllm-sim's
    X-Simulated-By header, which LiteLLM passes on). First GET /version (an engine answers it, not under /v1);
    without the marker there (a proxy has no /version), one chat completion of one token through the URL itself."""
    version, headers = _version(endpoint, timeout_s)
    if headers_say_simulated(headers):
        return EngineProbe(version, True, "GET /version answered with X-Simulated-By")
    status, headers, _ = _request(
        endpoint.base_url + "/chat/completions",
        endpoint.api_key,
        {"model": endpoint.model, "max_tokens": 1, "messages": [{"role": "user", "content": "Say OK."}]},
        timeout_s,
    )
    if headers_say_simulated(headers):
        return EngineProbe(version, True, "a one-token chat completion answered with X-Simulated-By")
    if status == 200:
        return EngineProbe(version, False, "a one-token chat completion carried no simulator marker")
    why = f"HTTP {status}" if status else "no answer"
    return EngineProbe(version, None, f"a one-token chat completion failed ({why}): not known")


def bench_endpoint(
    inventory: str | None,
    url: str | None,
    model: str | None,
    recipe: str | None,
    topology: str | None,
    backend: str | None,
    routing: str | None,
    mark_simulated: bool,
) -> Endpoint:
    """`bench`'s endpoint: --endpoint URL (with --model; recipe, topology, backend and routing recorded with
    it) or the deployed one (those options then refused: status says them); vLLM's version asked of it."""
    if url:
        if not model:
            raise ConfigError(Problem("--endpoint", url, "needs --model NAME (the served model name)", "add --model"))
        md = {"recipe": recipe, "topology": topology or "unknown", "backend": backend, "routing": routing}
        ep = url_endpoint(url, model, api_key_from_env(), md, mark_simulated)
    else:
        if model or recipe or topology or backend or mark_simulated:
            raise ConfigError(
                Problem(
                    "bench",
                    "",
                    "--model/--recipe/--topology/--backend/--simulated describe an --endpoint",
                    "drop them: the deployed endpoint's come from `sparkdeploy status`",
                )
            )
        ep = current_endpoint(inventory, routing)
    if ep.metadata.get("vllm_version") is None and ep.metadata.get("engine", "vllm") == "vllm":  # vLLM's GET /version
        ep.metadata["vllm_version"] = engine_version(ep)
        if ep.metadata.get("engine") == "vllm" and ep.metadata.get("engine_version") is None:
            ep.metadata["engine_version"] = ep.metadata["vllm_version"]
    return ep


def url_endpoint(
    url: str, model: str, api_key: str | None, metadata: dict[str, Any], mark_simulated: bool = False
) -> Endpoint:
    """`bench --endpoint URL`: an endpoint sparkdeploy did not render; the engine says whether it is simulated
    (mark_simulated: the user says so for an engine that does not carry vllm-sim's marker)."""
    ep = Endpoint(url, model, api_key, dict(metadata, source="--endpoint"))
    probe = probe_engine(ep)
    ep.metadata["vllm_version"] = probe.vllm_version
    ep.metadata["simulated"] = True if mark_simulated else probe.simulated
    ep.metadata["simulated_evidence"] = "--simulated" if mark_simulated and not probe.simulated else probe.evidence
    return ep


def api_key_from_env() -> str | None:
    """--endpoint mode: the key from SPARKDEPLOY_API_KEY, else LITELLM_MASTER_KEY (never a command-line value)."""
    return os.environ.get("SPARKDEPLOY_API_KEY") or os.environ.get("LITELLM_MASTER_KEY") or None


def expected_image(endpoint: Endpoint) -> dict[str, str]:
    """What a stored result must have run to count as the same measurement: the image ID this machine's Docker
    engine has for the tag deploy would run (a tag can change while the image stays the same), else the tag."""
    tag = cast(str, endpoint.metadata.get("image"))  # endpoint_of always names the image
    try:
        image_id = build.docker_client().images.get(tag).id
    except Exception:  # noqa: BLE001 - no engine here, or the tag is not built here: compare tags
        image_id = None
    return {"image_id": image_id} if image_id else {"image": tag}


class Deployer:
    """Brings one topology of a recipe up for a sweep (deploy converges: a different topology replaces the one
    running) and returns its endpoint."""

    def __init__(
        self,
        inventory: str | None,
        recipe: str,
        recipes_dir: str | None = None,
        timeout_s: float | None = None,
        sets: tuple[str, ...] = (),
    ) -> None:
        self.inventory, self.recipe, self.recipes_dir = inventory, recipe, recipes_dir
        self.timeout_s, self.sets = timeout_s, tuple(sets)

    def sets_for(self, routing: str | None) -> tuple[str, ...]:
        return self.sets + ((f"litellm.routing_strategy={routing}",) if routing else ())

    def __call__(self, topology: str, routing: str | None) -> Endpoint:
        sets = self.sets_for(routing)
        kwargs: dict[str, Any] = {
            "recipe": self.recipe,
            "topology": topology,
            "inventory": self.inventory,
            "sets": sets,
            "recipes_dir": self.recipes_dir,
        }
        if self.timeout_s:
            kwargs["timeout"] = self.timeout_s
        deploy(reporter=Reporter(), **kwargs)  # its progress on stderr: stdout stays the sweep's (--json)
        try:
            status = status_json(self.inventory)
        except (StepFailed, ConfigError):
            status = None
        return endpoint_of(self.inventory, self.recipe, topology, None, sets, self.recipes_dir, status=status)

    def down(self) -> None:
        remove(self.inventory, reporter=Reporter())
