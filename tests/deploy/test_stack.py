"""`up --stack` without nodes: the stack file's problems (one line each, exit 2), the memory budget per node,
the names and labels that let deployments coexist, and the plans: a converged stack changes nothing, a changed
deployment touches only its own containers, a removed one goes after the gateway forgot it."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from sparkdeploy.deploy.plan import StepKind
from sparkdeploy.deploy.stack import converge as st
from sparkdeploy.deploy.stack import file as sf
from sparkdeploy.deploy.stack import units as su
from sparkdeploy.errors import ConfigError
from sparkdeploy.facts import ContainerFact, FileFact, NodeFacts
from sparkdeploy.labels import DEPLOYMENT_LABEL
from sparkdeploy.topologies import running_stack

GIB = 1024
TOTAL = 128 * GIB  # MiB, a DGX Spark

TWO = """
deployments:
  - {name: chat, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: auto}
  - {name: coder, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark2], memory: 0.5}
"""


def write(tmp_path, text: str):
    path = tmp_path / "stack.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def loaded(tmp_path, inventory_file, text: str = TWO) -> sf.Stack:
    return sf.load_stack(write(tmp_path, text), str(inventory_file))


def problems(tmp_path, inventory_file, text: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        loaded(tmp_path, inventory_file, text)
    return [str(p) for p in exc.value.problems]


# -- bad input: one line per problem -----------------------------------------------------------------------


def test_same_port_on_one_node_is_refused(tmp_path, inventory_file):
    lines = problems(
        tmp_path,
        inventory_file,
        """
        deployments:
          - {name: a, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], port: 8100}
          - {name: b, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark1], port: 8100}
        """,
    )
    assert len(lines) == 1 and "deployments[1].port" in lines[0], lines
    assert "port 8100 on spark1: a's vLLM (deployments[0].port) and b's vLLM (deployments[1].port)" in lines[0]
    assert "e.g. 8101" in lines[0]


def test_same_port_on_other_nodes_is_fine(tmp_path, inventory_file):
    s = loaded(
        tmp_path,
        inventory_file,
        """
        deployments:
          - {name: a, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], port: 8100}
          - {name: b, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark2], port: 8100}
        """,
    )
    assert [m.port for m in s.members] == [8100, 8100]


def test_same_served_name_unknown_recipe_unknown_node_and_duplicate_name(tmp_path, inventory_file):
    lines = problems(
        tmp_path,
        inventory_file,
        """
        deployments:
          - {name: a, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1]}
          - {name: b, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark2]}
          - {name: c, recipe: no-such-recipe}
          - {name: d, recipe: glm-4.7-flash-int4, nodes: [spark9]}
          - {name: a, recipe: qwen3-coder-30b-int4}
        """,
    )
    text = "\n".join(lines)
    assert len(lines) == 4, text
    assert "a and b both serve the model glm-4.7-flash" in text
    assert "deployments[2]" in text and "no-such-recipe" in text
    assert "deployments[3].nodes: no node named spark9" in text
    assert "deployments[4].name: 'a' is also deployments[0]'s name" in text


def test_schema_problems_name_the_field(tmp_path, inventory_file):
    lines = problems(
        tmp_path,
        inventory_file,
        """
        deployments:
          - {name: Gateway, recipe: glm-4.7-flash-int4, memory: 1.5, colour: red}
        """,
    )
    text = "\n".join(lines)
    assert "deployments[0].name" in text and "deployments[0].memory" in text and "deployments[0].colour" in text


def test_gateway_port_is_refused_on_the_head(tmp_path, inventory_file):
    lines = problems(
        tmp_path,
        inventory_file,
        """
        deployments:
          - {name: a, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], port: 4000}
        """,
    )
    assert len(lines) == 1 and "port 4000 on spark1: the gateway (gateway.port) and a's vLLM" in lines[0], lines


def test_cli_refuses_a_bad_stack_with_exit_2_before_connecting(cli, tmp_path, inventory_file):
    path = write(tmp_path, "deployments:\n  - {name: a, recipe: nope}\n")
    code, _out, err = cli("up", "--stack", path, "-i", str(inventory_file), "--dry-run")
    assert code == 2 and "nope" in err and "Traceback" not in err
    code, _out, err = cli("up", "--stack", path, "-r", "glm-4.7-flash-int4", "-i", str(inventory_file))
    assert code == 2 and "--recipe apply to one deployment" in err


# -- memory -------------------------------------------------------------------------------------------------


def test_fits_is_the_sum_of_utilizations_against_the_node_less_the_os_reserve():
    ok, room = sf.fits([0.7, 0.7], TOTAL)
    assert not ok and room == pytest.approx(1 - 8 / 128)  # the budget's 8 GiB OS reserve of 128 GiB
    assert sf.fits([0.45, 0.45], TOTAL)[0]
    assert sf.fits([0.7], TOTAL)[0]


def test_two_engines_at_0_7_on_one_node_are_refused_with_each_share_and_a_fix(tmp_path, inventory_file):
    s = loaded(
        tmp_path,
        inventory_file,
        """
        deployments:
          - {name: a, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.7}
          - {name: b, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark1], memory: 0.7, port: 8001}
        """,
    )
    with pytest.raises(ConfigError) as exc:
        sf.budget(s, {"spark1": TOTAL, "spark2": TOTAL})
    (line,) = [str(p) for p in exc.value.problems]
    assert "spark1" in line and "a 0.7 (89.6 GiB)" in line and "b 0.7" in line and "at most 0.94 fits" in line
    assert "memory: 0.46 on each of a, b" in line


def test_auto_splits_what_the_fixed_shares_leave(tmp_path, inventory_file):
    s = loaded(
        tmp_path,
        inventory_file,
        """
        deployments:
          - {name: a, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.3}
          - {name: b, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark1], memory: auto, port: 8001}
          - {name: c, recipe: openai-gpt-oss-120b, topology: solo, nodes: [spark2], memory: auto}
        """,
    )
    util = sf.budget(s, {"spark1": TOTAL, "spark2": TOTAL})
    room = sf.fits([], TOTAL)[1]
    assert util["a"] == 0.3 and util["b"] == pytest.approx(round(room - 0.3 - 0.005, 2), abs=0.011)
    assert util["c"] == pytest.approx(room, abs=0.011)
    assert sf.fits([util["a"], util["b"]], TOTAL)[0]


SPARK = 122570  # MiB, a DGX Spark's nvidia-smi total (budget.DGX_SPARK_TOTAL_BYTES)
# Each a stack whose memory does not fit (issue 36 item 5: two engines at 0.45 on one node each got "raise
# vllm.gpu_memory_utilization to 0.56", 1.12 together where the stack's own check allows 0.93).
UNFIT = {
    "cannot share a node, one moves": """
        deployments:
          - {name: chat, recipe: glm-4.7-flash, topology: solo, nodes: [spark1], memory: 0.45}
          - {name: coder, recipe: qwen3-coder-30b, topology: solo, nodes: [spark1], memory: 0.45, port: 8001}
        """,
    "a share too small to start": """
        deployments:
          - {name: chat, recipe: glm-4.7-flash, topology: solo, nodes: [spark1], memory: 0.2}
          - {name: coder, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark1], memory: 0.5, port: 8001}
        """,
    "beside a cluster engine": """
        deployments:
          - {name: chat, recipe: glm-4.7-flash, topology: solo, nodes: [spark1], memory: 0.45}
          - {name: coder, recipe: qwen3-coder-30b, topology: cluster, memory: 0.45, port: 8001}
        """,
    "over the sum": """
        deployments:
          - {name: a, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.7}
          - {name: b, recipe: qwen3-coder-30b-int4, topology: solo, nodes: [spark1], memory: 0.7, port: 8001}
        """,
    "recipe defaults on one node": """
        deployments:
          - {name: chat, recipe: glm-4.7-flash, topology: solo, nodes: [spark2]}
          - {name: coder, recipe: qwen3-coder-30b, topology: solo, nodes: [spark2], port: 8001}
          - {name: small, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.3, port: 8002}
        """,
}


@pytest.mark.parametrize("case", sorted(UNFIT))
def test_every_proposed_memory_fix_fits_when_applied(tmp_path, inventory_file, case):
    """The fix a memory problem prints is applied to the stack file as written and the same budget re-run: it fits
    (shares, or a solo engine moved to a node with room for it, found by the budget's own checks)."""
    s = loaded(tmp_path, inventory_file, UNFIT[case])
    totals = {n.name: SPARK for n in s.inventory.nodes}
    with pytest.raises(ConfigError) as exc:
        sf.budget(s, totals)
    _util, found = sf.memory_problems(s, totals)
    assert [p for p, _ in found] == exc.value.problems and found
    for p, fix in found:
        assert fix is not None, p
        shown = sorted(f"{k}: {v}" for c in fix.changes.values() for k, v in c.items() if k == "memory")
        assert all(f"{v['memory']:g}" in p.fix for v in fix.changes.values()), (p.fix, fix, shown)
        data = yaml.safe_load(textwrap.dedent(UNFIT[case]))
        for entry in data["deployments"]:
            entry.update(fix.changes.get(entry["name"], {}))
        fixed = sf.load_stack(write(tmp_path, yaml.safe_dump(data)), str(inventory_file))
        util = sf.budget(fixed, totals)  # fits now
        for name, change in fix.changes.items():
            assert util[name] == change["memory"], (name, util)


def test_engines_that_cannot_share_a_node_are_told_so_and_where_one_fits(tmp_path, inventory_file):
    s = loaded(tmp_path, inventory_file, UNFIT["cannot share a node, one moves"])
    with pytest.raises(ConfigError) as exc:
        sf.budget(s, {"spark1": SPARK, "spark2": SPARK})
    (line,) = [str(p) for p in exc.value.problems]
    assert "spark1 (119.7 GiB, 8 GiB kept for the OS): chat, coder cannot share it" in line, line
    assert "their engines need 0.52 + 0.56 = 1.08 of it to start" in line and "at most 0.93 fits" in line
    assert "fix: e.g. nodes: [spark2] and memory: 0.52 on chat; memory: 0.56 on coder" in line
    assert "raise vllm.gpu_memory_utilization" not in line


def test_no_fix_is_invented_when_none_fits(tmp_path, inventory_file):
    s = loaded(
        tmp_path,
        inventory_file,
        """
        deployments:
          - {name: chat, recipe: glm-4.7-flash, topology: solo, nodes: [spark1]}
          - {name: coder, recipe: qwen3-coder-30b, topology: solo, nodes: [spark1], port: 8001}
          - {name: big, recipe: openai-gpt-oss-120b, topology: solo, nodes: [spark2]}
        """,
    )
    with pytest.raises(ConfigError) as exc:
        sf.budget(s, {"spark1": SPARK, "spark2": SPARK})
    (line,) = [str(p) for p in exc.value.problems]
    assert "cannot share it" in line and "no shares or placement of these deployments fits the nodes" in line


# -- names, labels, plans -----------------------------------------------------------------------------------


def built(s: sf.Stack) -> sf.Stack:
    sf.build(s, sf.budget(s, {n.name: TOTAL for n in s.inventory.nodes}))
    return s


def test_each_deployment_has_its_own_names_labels_port_and_state_dir(tmp_path, inventory_file):
    s = built(loaded(tmp_path, inventory_file))
    chat, coder = (m.deployment for m in s.members)
    # each deployment's engine only: the memory guard is the stack's, one per engine node (guard_nodes)
    assert [c.name for nd in chat.nodes for c in nd.containers] == ["sparkdeploy-chat-vllm"]
    assert [c.name for nd in coder.nodes for c in nd.containers] == ["sparkdeploy-coder-vllm"]
    run = coder.nodes[0].file("coder-vllm.run.sh").content
    assert f"--label {DEPLOYMENT_LABEL}=coder" in run and "--port 8001" in coder.nodes[0].file("vllm.entry.sh").content
    assert "--gpu-memory-utilization 0.5" in coder.nodes[0].file("vllm.entry.sh").content
    assert coder.nodes[0].state_dir == ".sparkdeploy-coder"
    gw = su.gateway_node(s)
    config = yaml.safe_load(gw.file("litellm-config.yaml").content)
    assert config["model_list"] == []  # the routes are routes.json's, which the hook loads
    routes = json.loads(gw.file("routes.json").content)
    assert {e["model_name"] for e in routes["model_list"]} == {"glm-4.7-flash", "qwen3-coder-30b"}
    assert config["general_settings"]["custom_auth"] == "gateway_hook.user_api_key_auth"
    assert gw.node.name == "spark1" and gw.containers[0].name == "sparkdeploy-gateway-litellm"


def test_the_gateways_workers_follow_the_head_nodes_cpus_unless_the_stack_file_says(tmp_path, inventory_file):
    def workers(s: sf.Stack, cpus: int | None) -> str:
        s.head_cpus = cpus  # the head's `cpus` fact, as `up --stack` reads it
        entry = su.gateway_node(s).file("litellm.entry.sh").content
        return entry.split("--num_workers ")[1].split()[0]

    s = built(loaded(tmp_path, inventory_file))
    assert s.file.gateway.num_workers == "auto"
    assert [workers(s, c) for c in (20, 2, 1, None)] == ["4", "2", "1", "1"]  # a Spark: 20 CPUs -> the cap
    assert su.gateway_about(s)["workers"] == 1
    fixed = built(loaded(tmp_path, inventory_file, TWO + "gateway: {num_workers: 6}\n"))
    assert workers(fixed, 20) == "6" and workers(fixed, None) == "6"
    lines = problems(tmp_path, inventory_file, TWO + "gateway: {num_workers: 0}\n")
    assert len(lines) == 1 and "gateway.num_workers" in lines[0] and "or auto" in lines[0]


def test_a_2xsolo_deployment_is_one_model_group_of_its_engines_and_starts_no_proxy(tmp_path, inventory_file):
    s = built(
        loaded(
            tmp_path, inventory_file, "deployments:\n  - {name: big, recipe: glm-4.7-flash-int4, topology: 2xsolo}\n"
        )
    )
    dep = s.members[0].deployment
    assert {c.role for nd in dep.nodes for c in nd.containers} == {"backend"}
    entries = su.stack_routes(s).model_list()
    assert [e["model_name"] for e in entries] == ["glm-4.7-flash", "glm-4.7-flash"]
    assert [e["litellm_params"]["api_base"] for e in entries] == dep.backends
    # each engine names its group and its watcher (the gateway's hook stops routing to one that does not serve),
    # and cools down at its first failure so a retry goes to the other (issue 43)
    fabric = {n.name: n.fabric_address for n in s.inventory.nodes}
    assert [e["model_info"]["group"] for e in entries] == ["big:spark1", "big:spark2"]
    want = [f"http://{fabric[n]}:7390/watch" for n in ("spark1", "spark2")]
    assert [e["model_info"]["watch"] for e in entries] == want
    assert {e["model_info"]["allowed_fails"] for e in entries} == {0}


def apply_to(units: list[st.Unit], facts: dict[str, dict[str, NodeFacts]], containers: dict[str, list]) -> None:
    """What applying the plans leaves on the nodes (files per state dir, containers per node)."""
    for u in units:
        for np in u.plan.nodes:
            sd = next(k for k in facts if np.state_dir.endswith("/" + k))
            f = facts[sd][np.node.name]
            for s in np.steps:
                if s.kind == StepKind.STATE_DIR:
                    f.state_dir_mode = 0o700
                elif s.kind in (StepKind.WRITE, StepKind.MANIFEST) and s.file is not None:
                    f.files[s.target] = FileFact(s.target, s.file.mode, s.file.sha256)
                    if s.kind == StepKind.MANIFEST:
                        f.manifest = json.loads(s.file.content)
                elif s.kind == StepKind.REMOVE_FILE:
                    f.files.pop(s.target, None)
                elif s.kind == StepKind.RMDIR and s.change:
                    f.state_dir_mode = None
                    f.manifest = None
                elif s.kind == StepKind.REMOVE_CONTAINER:
                    containers[np.node.name][:] = [c for c in containers[np.node.name] if c.name != s.target]
                elif s.kind == StepKind.START_CONTAINER and s.change and s.container is not None:
                    c = s.container
                    containers[np.node.name][:] = [x for x in containers[np.node.name] if x.name != c.name]
                    containers[np.node.name].append(
                        ContainerFact(
                            id=c.config_hash * 4,
                            name=c.name,
                            image_id="sha256:x",
                            image_ref=c.image,
                            labels={
                                "io.sparkdeploy.managed": "true",
                                "io.sparkdeploy.config-hash": c.config_hash,
                                DEPLOYMENT_LABEL: u.name,
                                "io.sparkdeploy.role": c.role,
                            },
                            status="running",
                            running=True,
                        )
                    )


def facts_for(s: sf.Stack, names: list[str], containers: dict[str, list], old=None) -> dict:
    facts = old or {}
    for name in names:
        sd = running_stack.state_dir_of(s.inventory, name)
        facts.setdefault(
            sd, {n.name: NodeFacts(node=n.name, home="/home/spark", docker_ok=True) for n in s.inventory.nodes}
        )
    for per in facts.values():
        for n, f in per.items():
            f.containers = containers[n]
    return facts


def test_second_up_changes_nothing_and_a_change_touches_only_its_deployment(tmp_path, inventory_file):
    s = built(loaded(tmp_path, inventory_file))
    containers: dict[str, list] = {n.name: [] for n in s.inventory.nodes}
    facts = facts_for(s, ["chat", "coder", "gateway", "guard"], containers)
    first = st.plan_stack(s, facts, [])
    assert all(u.changes for u in first)
    apply_to(first, facts, containers)
    again = st.plan_stack(s, facts_for(s, [], containers, facts), [])
    assert [(u.name, u.changes) for u in again] == [("guard", 0), ("chat", 0), ("coder", 0), ("gateway", 0)]

    changed = built(loaded(tmp_path, inventory_file, TWO.replace("memory: 0.5", "memory: 0.4")))
    units = st.plan_stack(changed, facts_for(changed, [], containers, facts), [])
    assert [(u.name, bool(u.changes)) for u in units] == [
        ("guard", False),
        ("chat", False),
        ("coder", True),
        ("gateway", False),
    ]
    restarted = [s.target for u in units for s in u.plan.steps if s.kind == StepKind.START_CONTAINER and s.change]
    assert restarted == ["sparkdeploy-coder-vllm"]


def test_a_removed_deployment_goes_and_the_gateway_forgets_it_without_a_restart(tmp_path, inventory_file):
    s = built(loaded(tmp_path, inventory_file))
    containers: dict[str, list] = {n.name: [] for n in s.inventory.nodes}
    facts = facts_for(s, ["chat", "coder", "gateway", "guard"], containers)
    apply_to(st.plan_stack(s, facts, []), facts, containers)

    one = built(loaded(tmp_path, inventory_file, TWO.split("  - {name: coder")[0]))
    gone = sorted(
        running_stack.deployments_on(facts[".sparkdeploy"] if ".sparkdeploy" in facts else facts[".sparkdeploy-chat"])
        - {"chat", "gateway", "guard"}
    )
    assert gone == ["coder"]
    units = st.plan_stack(one, facts_for(one, [], containers, facts), gone)
    by = {u.name: u for u in units}
    assert [u.kind for u in units] == ["guard", "deployment", "gateway", "remove"]
    assert by["chat"].changes == 0
    gw_changes = [(s.kind, s.target) for s in by["gateway"].plan.steps if s.change]
    assert gw_changes == [(StepKind.WRITE, "routes.json"), (StepKind.MANIFEST, "manifest.json")], gw_changes
    assert not any(k == StepKind.START_CONTAINER for k, _ in gw_changes)  # reloaded by the hook, not restarted
    removed = [s.target for s in by["coder"].plan.steps if s.kind == StepKind.REMOVE_CONTAINER]
    assert removed == ["sparkdeploy-coder-vllm"]
    # spark2 runs no engine any more: its guard goes, spark1's stays as it was
    guard = [(s.node, s.kind, s.target) for s in by["guard"].plan.steps if s.change]
    assert (("spark2", StepKind.REMOVE_CONTAINER, "sparkdeploy-guard")) in guard
    assert all(node == "spark2" for node, _, _ in guard), guard


def test_top_and_logs_see_a_stacks_deployments():
    """top reads every state dir's manifest (the stack's beside the single one: the fact `manifests`); a
    deployment's containers carry its label (the fact `running`), which --deployment picks."""
    from sparkdeploy.config.inventory import Node
    from sparkdeploy.daytwo import logs, top
    from sparkdeploy.facts import parse

    node = Node(name="spark1", role="head", mgmt_ip="192.0.2.1", fabric_ip="198.51.100.1/24", fabric_ifaces=["e0"])
    facts = parse(
        "spark1",
        "@@sparkdeploy-facts@@ running\nsparkdeploy-chat-vllm\tsolo\tchat\n"
        "sparkdeploy-gateway-litellm\tproxy\tgateway\n"
        "@@sparkdeploy-facts@@ manifests\n"
        '@@manifest .sparkdeploy-chat\n{"containers": [{"name": "sparkdeploy-chat-vllm", "health_port": 8000}]}\n'
        "@@manifest .sparkdeploy-gateway\n"
        '{"containers": [{"name": "sparkdeploy-gateway-litellm", "health_port": 4000}]}\n',
    )
    assert top.node_targets(node, facts) == [
        top.Target("spark1", "sparkdeploy-chat-vllm", "engine", "http://192.0.2.1:8000/metrics"),
        top.Target("spark1", "sparkdeploy-gateway-litellm", "proxy", "http://192.0.2.1:4000/metrics"),
    ]
    assert [t.container for t in top.node_targets(node, facts, "chat")] == ["sparkdeploy-chat-vllm"]
    assert logs.label_filter("coder") == f"{DEPLOYMENT_LABEL}=coder"
    assert logs.label_filter() == "io.sparkdeploy.managed=true"


def test_one_guard_per_engine_node_watches_every_deployment_there(tmp_path, inventory_file):
    """Two deployments on spark1 and one on spark2: ONE guard per node (its own unit, like the gateway), none on
    a node without an engine; each guard stops every engine of its node (nodeside/guard/run.py), so two would race."""
    s = built(
        loaded(
            tmp_path,
            inventory_file,
            TWO.replace("memory: 0.5}", "memory: 0.3}")
            + "  - {name: small, recipe: openai-gpt-oss-20b, topology: solo, nodes: [spark1], port: 8005, "
            "memory: 0.3}\n",
        )
    )
    guards = su.guard_nodes(s)
    assert [(nd.node.name, [c.name for c in nd.containers]) for nd in guards] == [
        ("spark1", ["sparkdeploy-guard"]),
        ("spark2", ["sparkdeploy-guard"]),
    ]
    assert guards[0].state_dir == ".sparkdeploy-guard" and {c.role for c in guards[0].containers} == {"guard"}
    run = guards[0].file("guard.run.sh").content
    assert f"--label {DEPLOYMENT_LABEL}=guard" in run and "/var/run/docker.sock" in run
    assert all(c.role != "guard" for m in s.members for nd in m.deployment.nodes for c in nd.containers)

    one_node = built(loaded(tmp_path, inventory_file, TWO.replace("nodes: [spark2]", "nodes: [spark1], port: 8001")))
    assert [nd.node.name for nd in su.guard_nodes(one_node)] == ["spark1"]  # spark2 runs no engine: no guard


def test_doctor_renders_each_running_deployment_again_from_its_manifest(tmp_path, inventory_file):
    """doctor's recipe checks (image, memory, ports) look at each stack deployment that runs: `rebuild` renders it
    from its manifest alone (no stack file), to the same containers; a manifest without it is one line."""
    s = built(loaded(tmp_path, inventory_file))
    containers: dict[str, list] = {n.name: [] for n in s.inventory.nodes}
    facts = facts_for(s, ["chat", "coder", "gateway", "guard"], containers)
    units = {u.name: u for u in st.plan_stack(s, facts, [])}
    for m in s.members:
        step = next(x for x in units[m.name].plan.steps if x.kind == StepKind.MANIFEST)
        manifest = json.loads(step.file.content)
        again = running_stack.rebuild(s.inventory, s.secrets, m.name, manifest)
        hashes = [(nd.node.name, c.name, c.config_hash) for nd in again.nodes for c in nd.containers]
        assert hashes == [(nd.node.name, c.name, c.config_hash) for nd in m.deployment.nodes for c in nd.containers]
    with pytest.raises(ConfigError, match="does not say how it was rendered"):
        running_stack.rebuild(s.inventory, s.secrets, "chat", {"recipe": "glm-4.7-flash-int4"})


def test_a_changed_cluster_deployment_of_a_stack_is_gated_and_an_unchanged_one_is_not(tmp_path, inventory_file):
    """The fabric gate's decision per deployment of a stack (deploy/fabric_gate.py, run by `up --stack` before
    anything changes): a cluster deployment whose engines (re)start runs it; converged, it is skipped; a solo one
    is not applicable."""
    from sparkdeploy.deploy import fabric_gate

    text = TWO.replace("memory: 0.5}", "memory: 0.3}") + (
        "  - {name: dist, recipe: openai-gpt-oss-120b, topology: cluster, memory: 0.3, port: 8003}\n"
    )
    s = built(loaded(tmp_path, inventory_file, text))
    containers: dict[str, list] = {n.name: [] for n in s.inventory.nodes}
    facts = facts_for(s, ["chat", "coder", "dist", "gateway", "guard"], containers)

    def decisions(units):
        return {
            u.name: fabric_gate.decide(u.member.deployment.topology, True, fabric_gate.engine_changes(u.plan)).action
            for u in units
            if u.member is not None
        }

    first = st.plan_stack(s, facts, [])
    assert decisions(first) == {"chat": "not applicable", "coder": "not applicable", "dist": "run"}
    apply_to(first, facts, containers)
    assert decisions(st.plan_stack(s, facts_for(s, [], containers, facts), []))["dist"] == "skipped"
    # one guard per node although spark1 and spark2 each run two deployments' engines
    assert [nd.node.name for nd in su.guard_nodes(s)] == ["spark1", "spark2"]


def test_rollback_of_a_stack_deployment_refuses_naming_the_stack_file(cli, tmp_path, monkeypatch):
    from sparkdeploy.deploy import history

    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path / "state"))
    path = history.history_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {"id": 1, "recipe": "r", "topology": "solo", "nodes": ["spark1"], "time": "2026-11-26T19:00:00+00:00"}
    path.write_text(json.dumps(rec | {"stack": "/x/stack.yaml", "deployment": "chat"}) + "\n")
    code, out, err = cli("history")
    assert code == 0 and "chat" in out and "(stack)" in out, out
    code, _out, err = cli("rollback", "1")
    assert code == 2 and "/x/stack.yaml" in err and "up --stack" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err


MIXED = """
deployments:
  - {name: chat, recipe: glm-4.7-flash-int4, topology: solo, nodes: [spark1], memory: 0.45}
  - {name: gguf, recipe: llamacpp-qwen3-coder-30b, topology: solo, nodes: [spark1], memory: 0.3}
  - {name: big, recipe: sglang-gpt-oss-120b, topology: solo, nodes: [spark2], memory: 0.65}
"""


def test_a_stack_mixes_engines_behind_one_gateway(tmp_path, inventory_file):
    """vLLM, llama.cpp and SGLang deployments in one stack (issue 38 item 6): each runs its own engine's line,
    SGLang's share is its --mem-fraction-static, and the gateway routes every served name."""
    s = built(loaded(tmp_path, inventory_file, MIXED))
    chat, gguf, big = (m.deployment for m in s.members)
    assert "exec vllm serve" in chat.nodes[0].file("vllm.entry.sh").content
    assert "exec llama-server" in gguf.nodes[0].file("llamacpp.entry.sh").content
    line = big.nodes[0].file("sglang.entry.sh").content
    assert "exec python3 -m sglang.launch_server" in line and "--mem-fraction-static 0.65" in line
    assert [c.name for nd in gguf.nodes for c in nd.containers] == ["sparkdeploy-gguf-vllm"]
    routes = json.loads(su.gateway_node(s).file("routes.json").content)
    assert {e["model_name"] for e in routes["model_list"]} == {
        "glm-4.7-flash",
        "qwen3-coder-30b-gguf",
        "openai/gpt-oss-120b",
    }
