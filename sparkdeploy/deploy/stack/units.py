"""A stack's own units beside its deployments (deploy/stack/converge.py plans and applies them): the gateway (the
LiteLLM proxy on the head node routing by model name to every deployment, with the auth hook, the spend store and its
routes (deploy/stack/routes.py) shipped beside its config) and the memory guards (ONE per node where any
deployment runs an engine). Pure: rendered from a loaded, built Stack.
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from sparkdeploy import __version__, healthcheck
from sparkdeploy.config.secrets import digest_key, keyed_digest
from sparkdeploy.deploy.plan import SPEND_FOLDER
from sparkdeploy.deploy.stack.file import GATEWAY_PORT, Stack, hold_s, on_demand_figures
from sparkdeploy.deploy.stack.routes import DEMAND_PATH, ROUTES_FILE, Routes, group
from sparkdeploy.deploy.up import simulated
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.labels import DEPLOYMENT_LABEL, LABEL_PREFIX, MANAGED_LABEL
from sparkdeploy.paths import PACKAGE_DIR
from sparkdeploy.recipes.recipe import LiteLLMSettings
from sparkdeploy.topologies import guard as guard_deploy
from sparkdeploy.topologies.base import Context
from sparkdeploy.topologies.deployment import (
    ContainerSpec,
    Deployment,
    FileSpec,
    Listen,
    NodeDeployment,
    config_hash,
    health_path,
)
from sparkdeploy.topologies.render import render
from sparkdeploy.topologies.running_stack import GATEWAY, GUARD, state_dir_of
from sparkdeploy.topologies.twosolo import PROXY_IMAGE

GATEWAY_CONTAINER = f"sparkdeploy-{GATEWAY}-litellm"
HOOK_SOURCE = PACKAGE_DIR / "nodeside" / "gateway" / "gateway_hook.py"  # what runs in the gateway container
SPEND_SOURCE = HOOK_SOURCE.with_name("gateway_spend.py")  # the hook's token counts (keys --max-budget)
SPEND_VOLUME = (SPEND_FOLDER, "/sparkdeploy-spend")  # the gateway's writable state: spend.sqlite (gateway_spend.DB)


# -- the gateway ------------------------------------------------------------------------------------------


def stack_routes(stack: Stack, out: dict[str, str] | None = None) -> Routes:
    """The stack's routes: each deployment one group of its engines (a 2xsolo's or replicas' several), `out` the
    deployments or engines left out (deploy/stack/routes.py)."""
    groups = {}
    budgeted = any(m.on_demand for m in stack.members)  # the activators' eviction figures (docs/stack.md)
    for m in stack.members:
        dep = m.deployment
        assert dep is not None  # built before the gateway
        urls = dep.backends or [dep.endpoint]
        shares = dict.fromkeys(m.engine_nodes(), m.share) if budgeted and m.share is not None else None
        room = cast(dict[str, float], on_demand_figures(stack, m)["room"]) if m.on_demand else None
        groups[m.name] = group(
            m.name, m.model, urls, _watchers(stack, dep, m.name), m.entry.idle_timeout_s, shares, room, hold_s(stack, m)
        )
    return Routes(groups, dict(out or {}))


def _watchers(stack: Stack, dep: Deployment, name: str) -> dict[str, tuple[str, str]]:
    """Each engine's base URL -> (its group, its rank 0's watcher URL), where the stack's guards watch."""
    watch = stack.inventory.cluster.guard.watch
    if not (stack.inventory.cluster.guard.enabled and watch.enabled):
        return {}
    out = {}
    for nd in dep.nodes:
        for c in nd.containers:
            if c.is_engine and c.health_port:  # rank 0 (or a solo engine): it serves the group's HTTP
                url = f"http://{nd.node.url_host}:{c.health_port}/v1"
                out[url] = (f"{name}:{nd.node.name}", f"http://{nd.node.fabric_address}:{watch.port}/watch")
    return out


def gateway_config() -> dict[str, Any]:
    """The gateway's settings; its model list is routes.json's, which the hook loads (an empty one here)."""
    return {
        "model_list": [],
        "router_settings": LiteLLMSettings().router_settings(),
        # the hook's token counter only: no Prometheus callback (`up --stack` has no --metrics, and it cost about
        # 10 % of the proxy's CPU per answer, py-spy); LiteLLM's own `/metrics` is not scraped by anything here
        "litellm_settings": {"callbacks": ["gateway_hook.spend_tracker"]},
        "general_settings": {
            "master_key": "os.environ/LITELLM_MASTER_KEY",
            # keys and model-list reload: sparkdeploy/nodeside/gateway/gateway_hook.py, beside this file in the
            # state dir
            "custom_auth": "gateway_hook.user_api_key_auth",
        },
    }


def gateway_node(stack: Stack, routes: Routes | None = None) -> NodeDeployment:
    """The gateway's files and container on the head node (routes: the stack's, every engine routed, unless
    given). Its config hash leaves out the routes: a deployment added, removed or taken out rewrites routes.json,
    which the running proxy reloads."""
    inv = stack.inventory
    head = stack.head
    name = GATEWAY_CONTAINER
    nd = NodeDeployment(node=head, state_dir=state_dir_of(inv, GATEWAY))
    master = stack.secrets.get("LITELLM_MASTER_KEY")
    node_env = render("node.env.j2", node=head, env={}, recipe_name=GATEWAY, topology="stack")
    secrets_env = render("secrets.env.j2", node=head, secrets={"LITELLM_MASTER_KEY": master} if master else {})
    config = FileSpec(
        "litellm-config.yaml",
        render(
            "litellm-config.yaml.j2",
            config=gateway_config(),
            recipe_name=GATEWAY,
            topology="stack",
            routing_strategy=LiteLLMSettings().routing_strategy,
        ),
    )
    common = {"name": name, "node": head, "recipe_name": GATEWAY, "topology": "stack", "backend": ""}
    entry = FileSpec(
        "litellm.entry.sh",
        render("entry-litellm.sh.j2", **common, port=stack.gateway_port, num_workers=stack.gateway_workers),
        mode=0o755,
    )
    hook = FileSpec("gateway_hook.py", HOOK_SOURCE.read_text(encoding="utf-8"))
    spend = FileSpec("gateway_spend.py", SPEND_SOURCE.read_text(encoding="utf-8"))
    files = [
        FileSpec("node.env", node_env),
        FileSpec("secrets.env", secrets_env, mode=0o600, secret=True),
        entry,
        hook,
        spend,
    ]
    image = load_definition(PROXY_IMAGE).tag
    run_vars: dict[str, Any] = dict(
        common,
        image=image,
        restart="unless-stopped",
        gpus=False,
        entry=entry.name,
        hf_cache=None,
        container_hf_home="/root/.cache/huggingface",
        healthcheck=healthcheck.for_port(stack.gateway_port, health_path("proxy")),
        state_volumes=[SPEND_VOLUME],
    )
    key = digest_key(inv.cluster_id)
    digests = [f.name + ":" + (keyed_digest(key, f.content) if f.secret else f.sha256) for f in files]
    settings = sorted((k, str(v)) for k, v in run_vars.items() if k != "node")
    chash = config_hash(__version__, image, repr(settings), *digests)
    labels = {
        MANAGED_LABEL: "true",
        f"{LABEL_PREFIX}.recipe": GATEWAY,
        f"{LABEL_PREFIX}.topology": "stack",
        f"{LABEL_PREFIX}.backend": "none",
        f"{LABEL_PREFIX}.role": "proxy",
        f"{LABEL_PREFIX}.config-hash": chash,
        DEPLOYMENT_LABEL: GATEWAY,
    }
    run = FileSpec("litellm.run.sh", render("container-run.sh.j2", labels=labels, **run_vars), mode=0o755)
    routes_file = FileSpec(ROUTES_FILE, (routes if routes is not None else stack_routes(stack)).text())
    nd.files = [*files, config, routes_file, run]
    nd.containers.append(
        ContainerSpec(
            name=name,
            role="proxy",
            image=image,
            run_script=run.name,
            config_hash=chash,
            listens=(Listen(stack.gateway_port, "the gateway", GATEWAY_PORT),),
            health_port=stack.gateway_port,
        )
    )
    return nd


def gateway_about(stack: Stack) -> dict[str, Any]:
    return {
        "recipe": GATEWAY,
        "topology": "stack",
        "backend": None,
        "model": None,
        "endpoint": stack.endpoint,
        "backends": [e.api_base for g in stack_routes(stack).groups.values() for e in g.engines],
        "deployment": GATEWAY,
        "models": stack_routes(stack).models(),
        "workers": stack.gateway_workers,
    }


# -- the guards ---------------------------------------------------------------------------------------------


def guard_nodes(stack: Stack) -> list[NodeDeployment]:
    """ONE memory guard on each node where any deployment of the stack runs an engine (topologies/guard.py): a guard
    stops every engine of its node at the hard line, so one per node watches them all. Pure; the deployments
    are built first."""
    inv = stack.inventory
    deps = [cast(Deployment, m.deployment) for m in stack.members]
    engines = {nd.node.name for dep in deps for nd in dep.nodes if nd.runs_engine}
    nodes = [NodeDeployment(node=n, state_dir=state_dir_of(inv, GUARD)) for n in inv.nodes if n.name in engines]
    first = stack.members[0].resolved
    # labels and names of the guard unit: recipe `guard`, topology `stack` (as the gateway's)
    resolved = dataclasses.replace(first, recipe=first.recipe.model_copy(update={"name": GUARD}), topology="stack")
    ctx = Context(inv, resolved, deps[0].image, deps[0].image, stack.secrets, deployment=GUARD)
    # on-demand members: each node's activator reads the gateway's demand (nodeside/guard/activate.py)
    demand = (
        f"http://{stack.head.url_host}:{stack.gateway_port}{DEMAND_PATH}"
        if any(m.on_demand for m in stack.members)
        else None
    )
    guard_deploy.stack_guards(ctx, nodes, simulated(deps[0]), demand)
    return [nd for nd in nodes if nd.containers]  # none when cluster.guard.enabled is false: removed everywhere


def guard_about(stack: Stack) -> dict[str, Any]:
    """The guards' manifest: nothing of the deployments they watch (adding one rewrites no guard's manifest)."""
    about = {"recipe": GUARD, "topology": "stack", "backend": None, "model": None, "endpoint": stack.endpoint}
    return about | {"deployment": GUARD}
