"""`doctor --nccl`: the all-reduce probe, run inside the recipe's image on every node over the fabric IPs.

The probe script (probe/allreduce_probe.py, torch + stdlib only) is copied over SFTP to
`~/<state_dir>/doctor/` on each node with the node.env the deployment renders (the NCCL_* / GLOO_* settings
the engine would get), mounted into a `docker run --rm` of the serving image, and started with torchrun:
rank 0 on the head, rendezvous at the head's fabric IP. NCCL_DEBUG=INFO shows which transport NCCL chose.

Verdict against a 200 Gb/s link (25 GB/s raw, about 23 GB/s all-reduce busbw once configured right):
warn under 80 %, fail under 25 %, with the usual causes. In the lab (a SIMULATED image, no GPU) the same
plumbing runs with gloo on CPU: the rendezvous, the env, the parsing are real; the bandwidth verdict is not
applicable and says so.

With NCCL the probe also measures a 4 KiB all-reduce called eagerly (NCCL directly, as vLLM's communicator calls
it) and inside a CUDA graph (as nccl-tests -G does); graph_advice.py turns the pair into advice for the recipe:
keep graphs, cut them at the all-reduce, or enforce eager, with the figures in the message.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

from sparkdeploy.checks import FAIL, PASS, WARN, Result, fail
from sparkdeploy.config.inventory import Node
from sparkdeploy.errors import StepFailed
from sparkdeploy.recipes.recipe import ResolvedRecipe

from . import DOCTOR_FOLDER, graph_advice
from .check_context import SessionContext
from .nccl_table import parse_nccl_table  # also re-exported: the probe's table reader

PROBE = Path(__file__).resolve().parent / "probe" / "allreduce_probe.py"
EXPECTED_BUSBW_GBS = 23.0  # two Sparks, one CX7 port, both RoCE twins in NCCL_IB_HCA, MTU 9000
WARN_FRACTION = 0.80
FAIL_FRACTION = 0.25
CONTAINER = "sparkdeploy-doctor-nccl"
MOUNT = "/sparkdeploy-doctor"
PORT_OFFSET = 1  # rendezvous on cluster.master_port + 1: never the serving engine's port
PROBE_TIMEOUT_S = 240
GLOO_MAX_BYTES = 64 * 2**20  # CPU all-reduce in the lab: enough to exercise the sweep, quick on 2 cores


def nccl_transport(log: str) -> dict[str, Any]:
    """What NCCL_DEBUG=INFO says: version, `Using network IB|Socket`, the IB devices it opened."""
    out: dict[str, Any] = {}
    m = re.search(r"NCCL version ([\w.+-]+)", log)
    if m:
        out["version"] = m.group(1)
    nets = re.findall(r"Using network (\w+)", log)
    if nets:
        out["network"] = sorted(set(nets))
    m = re.search(r"NET/IB : Using (.+)", log)
    if m:
        out["ib_devices"] = m.group(1).strip()
    return out


def busbw_verdict(peak: float | None, expected: float = EXPECTED_BUSBW_GBS) -> str:
    if peak is None:
        return FAIL
    if peak < FAIL_FRACTION * expected:
        return FAIL
    if peak < WARN_FRACTION * expected:
        return WARN
    return PASS


def allreduce_advice(lat: dict[str, Any], recipe: ResolvedRecipe | None = None) -> tuple[str, dict[str, Any]]:
    """The probe's 4 KiB figures as advice for the recipe (keep graphs / cut at all-reduce / enforce eager), and
    the same as data for --json. recipe: the ResolvedRecipe doctor runs with, or None."""
    advice = graph_advice.advise(lat)
    if advice is None:
        return "", {}
    data: dict[str, Any] = {"choice": advice.choice, "reason": advice.reason}
    if recipe is None:
        return f"this cluster wants {advice.choice} ({graph_advice.SETTING[advice.choice]}): {advice.reason}", data
    mode = graph_advice.recipe_mode(recipe.recipe.vllm)
    data.update(recipe=recipe.name, recipe_mode=mode, fits=mode == advice.choice)
    return graph_advice.for_recipe(advice, mode, recipe.name), data


def _causes(
    transports: dict[str, dict[str, Any]], result: dict[str, Any], hcas: dict[str, list[str]] | None = None
) -> list[str]:
    causes = []
    for name, t in transports.items():
        opened = re.findall(r"\[\d+\]([\w.-]+):\d+", t.get("ib_devices", ""))
        wanted = (hcas or {}).get(name) or []
        if opened and wanted and len(set(opened)) < len(wanted):
            causes.append(
                f"{name}: NCCL opened {', '.join(sorted(set(opened)))} only, not every HCA of "
                f"{', '.join(wanted)} (NCCL_IB_HCA)"
            )
    nets = {n for t in transports.values() for n in t.get("network", [])}
    if "Socket" in nets:
        causes.append("NCCL used NET/Socket instead of NET/IB: RDMA not used (check NCCL_IB_HCA, roce.*)")
    versions = {t.get("version") for t in transports.values() if t.get("version")}
    if len(versions) > 1 or len(set(result.get("nccl_versions", []))) > 1:
        causes.append(f"NCCL builds differ between nodes ({', '.join(sorted(versions))}): one image ID everywhere")  # type: ignore[arg-type]  # the set holds truthy versions
    causes += [
        "one RoCE twin missing from NCCL_IB_HCA (roce.hcas)",
        "MTU 1500 on the fabric port (network.mtu)",
        "NET/Socket instead of NET/IB (NCCL_DEBUG=INFO)",
        "NCCL builds that differ (image.torch_nccl)",
    ]
    seen, out = set(), []
    for c in causes:
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def _state_dir(run: SessionContext, node: Node) -> str:
    home = run.session(node).conn.home()
    return f"{home}/{run.inventory.cluster.state_dir}/{DOCTOR_FOLDER}"  # type: ignore[union-attr]  # checks run only with an inventory (runner)


def _argv(
    run: SessionContext,
    node: Node,
    rank: int,
    world: int,
    head: Node,
    directory: str,
    image: str,
    simulated: bool,
    max_bytes: int,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> list[str]:
    argv = [
        "docker",
        "run",
        "--rm",
        "--name",
        CONTAINER,
        "--network",
        "host",
        "--ipc",
        "host",
        "--ulimit",
        "memlock=-1",
        "--ulimit",
        "stack=67108864",
        "--env-file",
        f"{directory}/node.env",
        "-e",
        "NCCL_DEBUG=INFO",
        "-e",
        "NCCL_DEBUG_SUBSYS=INIT,NET",
        "--volume",
        f"{directory}:{MOUNT}",
    ]
    if not simulated:
        argv += ["--gpus", "all"]
    argv += [
        "--entrypoint",
        "python3",
        image,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(world),
        "--node-rank",
        str(rank),
        "--nproc-per-node",
        "1",
        "--master-addr",
        head.fabric_address,
        "--master-port",
        str(run.inventory.cluster.master_port + PORT_OFFSET),  # type: ignore[union-attr]  # checks run only with an inventory (runner)
        f"{MOUNT}/allreduce_probe.py",
        "--backend",
        "gloo" if simulated else "nccl",
        "--max-bytes",
        str(max_bytes),
        "--timeout",
        f"{timeout_s:g}",
        "--json",
        f"{MOUNT}/result.json",
    ]
    return argv


def allreduce(run: SessionContext) -> Result:
    """doctor --nccl: refused beside a running topology on a GPU (unified memory), else `measure`."""
    nodes = sorted(run.nodes, key=lambda n: n.role != "head")
    down = [n.name for n in nodes if not run.reachable(n)]
    if down:
        return fail(f"not run: {', '.join(down)} unreachable", "every node reachable", "see access.ssh")
    expected = (
        f"busbw >= {WARN_FRACTION * EXPECTED_BUSBW_GBS:.1f} GB/s ({WARN_FRACTION:.0%} of "
        f"{EXPECTED_BUSBW_GBS:g} GB/s, 200 Gb/s CX7)"
    )
    if not run.simulated_image:
        busy = {n.name: [c.name for c in run.node_facts(n).containers if c.status == "running"] for n in nodes}
        busy = {k: v for k, v in busy.items() if v}
        if busy:
            return fail(
                f"not run: a topology is up ({'; '.join(f'{k}: {v}' for k, v in busy.items())})",
                expected,
                "sparkdeploy down first: the probe and a serving engine would share unified memory",
            )
    return measure(run)


def measure(run: SessionContext, timeout_s: float = PROBE_TIMEOUT_S) -> Result:
    """The probe itself on every node of `run` (rank 0 the head), judged by `verdict`. `up`'s fabric gate
    (sparkdeploy/deploy/fabric_gate.py) calls this with its own size and a shorter timeout."""
    d = run.deployment
    nodes = sorted(run.nodes, key=lambda n: n.role != "head")
    head = nodes[0]
    down = [n.name for n in nodes if not run.reachable(n)]
    if down:
        return fail(f"not run: {', '.join(down)} unreachable", "every node reachable", "see access.ssh")
    simulated = run.simulated_image
    expected = (
        f"busbw >= {WARN_FRACTION * EXPECTED_BUSBW_GBS:.1f} GB/s ({WARN_FRACTION:.0%} of "
        f"{EXPECTED_BUSBW_GBS:g} GB/s, 200 Gb/s CX7)"
    )
    raw, outputs, errors = _run_ranks(run, nodes, timeout_s)
    head_out = outputs.get(head.name, (None, "", ""))
    result = _probe_result(raw, head_out[1])
    transports = {n: nccl_transport(o[1] + "\n" + o[2]) for n, o in outputs.items()}
    result["transport"] = transports
    result["simulated"] = simulated
    run.extra["nccl"] = {"result": result, "table": head_out[1], "simulated": simulated}

    if errors or not result.get("ok"):
        return fail(
            f"probe failed: {_why_failed(errors, result, outputs)}"[:600],
            expected,
            "check the rendezvous path: fabric IPs reachable (network.ping_df), GLOO/NCCL_SOCKET_IFNAME "
            f"(roce.nccl_env), port {run.inventory.cluster.master_port + PORT_OFFSET} free on {head.name}",  # type: ignore[union-attr]  # checks run only with an inventory (runner)
            data=result,
        )

    return verdict(result, transports, simulated, nodes, d.recipe)  # type: ignore[union-attr]  # needs_recipe: a deployment


def _run_ranks(
    run: SessionContext, nodes: list[Node], timeout_s: float
) -> tuple[bytes | None, dict[str, tuple[int, str, str]], dict[str, str]]:
    """The probe's script and node.env copied to each node, one rank per node (rank 0 `nodes[0]`, the head) run
    in parallel, our container removed after. Returns the head's result.json (None if it wrote none), each
    node's (exit code, stdout, stderr) and each node's failure to run it."""
    head = nodes[0]
    simulated = run.simulated_image
    image = run.deployment.image_tag  # type: ignore[union-attr]  # needs_recipe: a deployment
    max_bytes = run.options.nccl_max_bytes or (GLOO_MAX_BYTES if simulated else 256 * 2**20)
    script = PROBE.read_bytes()
    dirs: dict[str, str] = {}
    outputs: dict[str, tuple[int, str, str]] = {}
    errors: dict[str, str] = {}

    def prepare(node: Node) -> None:
        nd = run.node_deployment(node)
        directory = _state_dir(run, node)
        s = run.session(node)
        s.run(["mkdir", "-p", "-m", "0700", directory], timeout=15)
        s.run(["docker", "rm", "--force", CONTAINER], timeout=30)
        s.run(["rm", "-f", f"{directory}/result.json"], timeout=15)
        s.conn.put(script, f"{directory}/allreduce_probe.py", mode=0o644)
        env = nd.file("node.env").content if nd and any(f.name == "node.env" for f in nd.files) else ""
        s.conn.put(env, f"{directory}/node.env", mode=0o644)
        dirs[node.name] = directory

    def launch(node: Node, rank: int) -> None:
        try:
            argv = _argv(run, node, rank, len(nodes), head, dirs[node.name], image, simulated, max_bytes, timeout_s)
            res = run.session(node).run(argv, timeout=timeout_s + min(60.0, timeout_s / 2))  # past the probe's own
            outputs[node.name] = (res.exit_code, res.stdout, res.stderr)
        # Broad on purpose: a rank's thread must record any failure for its node (an exception left in a
        # thread would be lost and the node's row would read as no output).
        except Exception as exc:  # noqa: BLE001
            errors[node.name] = str(exc)

    try:
        for node in nodes:  # few nodes; SFTP writes are quick
            prepare(node)
        threads = [threading.Thread(target=launch, args=(n, r), daemon=True) for r, n in enumerate(nodes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s + 90)
        raw = run.session(head).conn.read(f"{dirs[head.name]}/result.json")
    finally:
        for node in nodes:
            try:
                run.session(node).run(["docker", "rm", "--force", CONTAINER], timeout=30)
            except StepFailed:  # best effort cleanup of our own container (the node may be gone)
                pass
    return raw, outputs, errors


def _probe_result(raw: bytes | None, head_stdout: str) -> dict[str, Any]:
    """The head's result.json, or its table parsed from stdout where the JSON has no rows."""
    result: dict[str, Any] = {}
    if raw:
        try:
            result = json.loads(raw)
        except ValueError:
            result = {}
    if not result.get("rows"):
        parsed = parse_nccl_table(head_stdout)
        if parsed["rows"]:
            result = dict(parsed, ok=True, parsed_from="stdout")
    return result


def _why_failed(errors: dict[str, str], result: dict[str, Any], outputs: dict[str, tuple[int, str, str]]) -> str:
    """Why the probe failed: each node's error, the probe's own, each failed rank's last line of output."""
    why = "; ".join(f"{k}: {v}" for k, v in errors.items())
    tails = []
    for n, (code, out, err) in outputs.items():
        if code:
            lines = [ln for ln in (err or out).strip().splitlines() if ln.strip()]
            tails.append(f"{n}: exit {code}: {lines[-1] if lines else ''}")
    return "; ".join(x for x in [why, result.get("error", ""), *tails] if x) or "no result"


def verdict(
    result: dict[str, Any],
    transports: dict[str, dict[str, Any]],
    simulated: bool,
    nodes: list[Node],
    recipe: ResolvedRecipe | None = None,
) -> Result:
    """The nccl.allreduce row from a finished probe's result."""
    expected = (
        f"busbw >= {WARN_FRACTION * EXPECTED_BUSBW_GBS:.1f} GB/s ({WARN_FRACTION:.0%} of "
        f"{EXPECTED_BUSBW_GBS:g} GB/s, 200 Gb/s CX7)"
    )
    peak = result.get("peak_busbw")
    lat = result.get("lat4k") or {}
    peak_row = max(result.get("rows", []), key=lambda r: r["busbw"], default=None)
    at = f" at {peak_row['size'] / 2**20:g} MiB" if peak_row else ""
    eager = lat.get("eager_us")
    graph = lat.get("graph_us")
    path = {"eager nccl-direct": " (NCCL direct)", "eager torch.distributed": " (torch.distributed)"}.get(
        lat.get("eager_method") or "", ""
    )
    lat_text = (f"; 4 KiB eager {eager:.1f} us{path}" if eager is not None else "") + (
        f", graph {graph:.1f} us (x{lat['ratio']:.2f})" if graph is not None and lat.get("ratio") else ""
    )
    if peak is None:
        return fail("the probe produced no measurement", expected, "rerun with --nccl and read the probe's output")
    wrong = sum(r.get("wrong") or 0 for r in result.get("rows", []))
    if wrong:
        return fail(
            f"{wrong} wrong values in the all-reduce results",
            "0 wrong",
            "NCCL builds that differ or a broken link: compare image.torch_nccl on every node",
            data=result,
        )
    if simulated:
        return Result(
            PASS,
            f"SIMULATED gloo/CPU over fabric IPs: peak busbw {peak:.2f} GB/s{at}{lat_text}",
            f"not applicable: the {EXPECTED_BUSBW_GBS:g} GB/s verdict needs GPUs and NCCL",
            simulated=True,
            data=result,
            detail="the rendezvous, node.env, torchrun and parsing ran for real; bandwidth is not the link's",
        )
    status = busbw_verdict(peak)
    advice, advice_data = allreduce_advice(lat, recipe)
    if advice_data:
        result["graph_advice"] = advice_data
    measured = f"peak busbw {peak:.2f} GB/s{at} ({peak / EXPECTED_BUSBW_GBS:.0%}){lat_text}"
    nets = sorted({n for t in transports.values() for n in t.get("network", [])})
    if nets:
        measured += f"; NET/{'+'.join(nets)}"
    if status == PASS:
        return Result(PASS, measured, expected, advice, data=result)
    hcas = {n.name: list(n.hcas) for n in nodes}
    return Result(
        status,
        measured,
        expected,
        "usual causes: " + "; ".join(_causes(transports, result, hcas)) + (f". {advice}" if advice else ""),
        data=result,
    )
