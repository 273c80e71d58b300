#!/usr/bin/env python3
"""Run a corpus of hostile or mistaken inputs through the CLI and count tracebacks, leaks and executions.

Every case runs the real `sparkdeploy` command in-process (offline paths: dry run, render, recipes, and the
refusals `run-recipe` makes before it connects anywhere). For each case:
- traceback: an exception escaped the CLI's error contract, or "Traceback" was printed;
- leak: a canary secret appeared in stdout/stderr or in a file written without --with-secrets;
- execution: a canary command (`touch PWNED`) ran, here or when the rendered run and entry scripts are executed
  with docker and vllm replaced by recorders on PATH;
- exit code: a user error must be 2 (1 for a refused run, 0 where the input is accepted on purpose).

    python3 benchmarks/hostile_inputs.py [--json] [--verbose]
Prints the figures docs/security.md quotes; exits 1 if any case misbehaves.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sparkdeploy.cli.common import run_cli  # noqa: E402
from sparkdeploy.cli.main import cli  # noqa: E402

CANARY_HF = "hf_CANARYtoken0000"
CANARY_KEY = "sk-CANARYmasterKEY1111"
PWN = "$(touch PWNED)"
RECIPE = (REPO / "recipes" / "openai-gpt-oss-120b.yaml").read_text()
NODES = [
    {
        "name": "spark1",
        "role": "head",
        "mgmt_ip": "192.0.2.1",
        "fabric_ip": "198.51.100.1/24",
        "fabric_ifaces": ["enp1s0f1np1"],
        "ssh": {"user": "spark"},
    },
    {
        "name": "spark2",
        "role": "worker",
        "mgmt_ip": "192.0.2.2",
        "fabric_ip": "198.51.100.2/24",
        "fabric_ifaces": ["enp1s0f1np1"],
        "ssh": {"user": "spark"},
    },
]


def inventory(**cluster) -> str:
    return yaml.safe_dump(
        {"cluster": {"name": "t", "secrets_file": "secrets.env", **cluster}, "nodes": NODES}, sort_keys=False
    )


def node_override(**fields) -> str:
    nodes = [dict(NODES[0], **fields), NODES[1]]
    return yaml.safe_dump({"cluster": {"name": "t", "secrets_file": "secrets.env"}, "nodes": nodes})


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=False)
)


@dataclass
class Case:
    name: str
    argv: list[str]
    expect: tuple[int, ...] = (2,)
    inventory: str | bytes | None = None  # text of inventory.yaml (default: a good one)
    recipe: str | bytes | None = None  # text of recipes/openai-gpt-oss-120b.yaml in --recipes-dir
    secrets: str | bytes | None = None  # text of secrets.env (default: the canaries); "DIR"/"FIFO"/"NONE"
    run_scripts: bool = False  # execute the rendered scripts with recorders (for the execution count)


def cases() -> list[Case]:
    dry = ["run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", "{inv}"]
    dry_r = dry + ["--recipes-dir", "{recipes}"]
    out: list[Case] = []
    # -- inventories ------------------------------------------------------------------------------------------
    for name, text in [
        ("secrets file as inventory", f"HF_TOKEN={CANARY_HF}\nLITELLM_MASTER_KEY={CANARY_KEY}\n"),
        ("secrets file as inventory, yaml-ish", f"LITELLM_MASTER_KEY: {CANARY_KEY}: x\n"),
        ("secrets in a yaml error", f"cluster: {{name: t}}\nnodes: [\n  token: {CANARY_HF}\n"),
        ("alias bomb", inventory() + "x:\n  " + BOMB.replace("\n", "\n  ")),
        ("5000-deep list", "x: " + "[" * 5000 + "]" * 5000 + "\n"),
        ("5000-deep mapping", "x: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n"),
        ("duplicate key", inventory() + "nodes: []\n"),
        ("python tag", "!!python/object/apply:os.system ['touch PWNED']\n"),
        ("empty", ""),
        ("a list", "- 1\n- 2\n"),
        ("a scalar", "hello\n"),
        ("mDNS names", node_override(mgmt_ip="spark1.local")),
        ("hostname", node_override(mgmt_ip="spark1")),
        ("ssh.user injection", node_override(ssh={"user": "x; touch PWNED"})),
        ("ssh.user option", node_override(ssh={"user": "-oProxyCommand=touch PWNED"})),
        ("ssh.port text", node_override(ssh={"port": "22; touch PWNED"})),
        ("cluster.name traversal", inventory(name="../../../tmp/x")),
        ("cluster.name newline", inventory(name="a\nb")),
        ("state_dir absolute", inventory(state_dir="/etc")),
        ("state_dir traversal", inventory(state_dir="../x")),
        ("hf_cache relative", inventory(hf_cache="x")),
        ("hf_cache newline", inventory(hf_cache="~/hf\nexec touch PWNED")),
        ("mgmt_ip 0.0.0.0", node_override(mgmt_ip="0.0.0.0")),
        ("mgmt_ip broadcast", node_override(mgmt_ip="255.255.255.255")),
        ("mgmt_ip loopback on two nodes", node_override(mgmt_ip="127.0.0.1")),
        ("fabric_ip the subnet's broadcast", node_override(fabric_ip="198.51.100.255/24")),
        ("ssh.port true", node_override(ssh={"port": True})),
        ("long string", inventory(hf_cache="/" + "a" * 5000)),
        (
            "two heads + shared IP",
            yaml.safe_dump({"nodes": [dict(NODES[0]), dict(NODES[1], role="head", mgmt_ip="192.0.2.1")]}),
        ),
        ("bad iface", node_override(fabric_ifaces=["$(touch PWNED)"])),
        ("fabric without prefix", node_override(fabric_ip="198.51.100.1")),
        ("unknown key", inventory() + "extra: 1\n"),
        ("non-UTF-8", inventory().encode() + b"# caf\xe9\n"),
        ("binary garbage", bytes(range(256)) * 4),
        ("NUL bytes", b"cluster:\0\n"),
        ("huge file", "# " + "x" * (2 << 20) + "\n"),
    ]:
        out.append(Case(f"inventory: {name}", dry, inventory=text))
    out.append(
        Case(
            "inventory: IPv6 addresses (accepted, bracketed)",
            dry + ["--json"],
            expect=(0,),
            inventory=yaml.safe_dump(
                {
                    "cluster": {"secrets_file": "secrets.env"},
                    "nodes": [dict(NODES[0], mgmt_ip="2001:db8::1"), dict(NODES[1], mgmt_ip="2001:db8::2")],
                }
            ),
        )
    )
    out.append(
        Case(
            "inventory: 2xsolo on one node",
            dry + ["-t", "2xsolo"],
            inventory=yaml.safe_dump({"cluster": {"secrets_file": "secrets.env"}, "nodes": NODES[:1]}),
        )
    )
    out.append(
        Case(
            "inventory: missing file",
            ["run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", "/nonexistent/inventory.yaml"],
        )
    )
    out.append(Case("inventory: a folder", ["run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", "/tmp"]))
    # -- secrets files -----------------------------------------------------------------------------------------
    for name, text in [
        ("a folder", "DIR"),
        ("a FIFO", "FIFO"),
        ("non-UTF-8", b"HF_TOKEN=\xff\n"),
        ("a bad line holding a secret", f"{CANARY_HF}\n"),
        ("binary", bytes(range(256))),
    ]:
        out.append(Case(f"secrets: {name}", dry, secrets=text))
    out.append(Case("secrets: missing (dry run warns)", dry, expect=(0,), secrets="NONE"))
    out.append(
        Case("secrets: missing (run refuses)", ["run-recipe", "openai-gpt-oss-120b", "-i", "{inv}"], secrets="NONE")
    )
    # -- recipes -----------------------------------------------------------------------------------------------
    for name, text in [
        ("alias bomb", RECIPE + "x_bomb:\n  " + BOMB.replace("\n", "\n  ")),
        ("deep", RECIPE + "x: " + "[" * 5000 + "]" * 5000 + "\n"),
        ("duplicate model", RECIPE + "model: evil/other\n"),
        ("non-UTF-8", RECIPE.encode() + b"# \xe9\n"),
        ("image traversal", RECIPE.replace("image: vllm-node-mxfp4", "image: ../../../etc")),
        ("image absolute", RECIPE.replace("image: vllm-node-mxfp4", "image: /etc")),
        ("model traversal", RECIPE.replace("model: openai/gpt-oss-120b", "model: ../../etc")),
        (
            "served name newline",
            RECIPE.replace("served_model_name: openai/gpt-oss-120b", 'served_model_name: "a\\n== spark9 forged =="'),
        ),
        (
            "served name escape",
            RECIPE.replace("served_model_name: openai/gpt-oss-120b", 'served_model_name: "a\\e[2Jb"'),
        ),
        ("secret in env", RECIPE + f"env: {{HF_TOKEN: {CANARY_HF}}}\n"),
        ("python tag", "!!python/object/apply:os.system ['touch PWNED']\n"),
        ("a list", "- 1\n"),
        ("long description", RECIPE.replace("description: ", "description: " + "d" * 5000 + " ", 1)),
    ]:
        out.append(Case(f"recipe: {name}", dry_r, recipe=text))
    for args in (
        ["recipes", "list", "--recipes-dir", "{recipes}"],
        ["recipes", "show", "openai-gpt-oss-120b", "--recipes-dir", "{recipes}"],
    ):
        out.append(
            Case(
                f"recipe markup [/x] in `{' '.join(args[:2])}`",
                args,
                expect=(0,),
                recipe=RECIPE.replace("description: ", "description: '[/x][bold]' # ", 1),
            )
        )
    # -- --set ---------------------------------------------------------------------------------------------------
    for name, value in [
        ("3000-part key", ".".join(["a"] * 3000) + "=1"),
        ("alias", "vllm.extra_args=[&a x, *a]"),
        ("api key flag", 'vllm.extra_args=["--api-key","x"]'),
        ("hf token flag", f'vllm.extra_args=["--hf-token={CANARY_HF}"]'),
        ("secret env", f"env.HF_TOKEN={CANARY_HF}"),
        ("newline arg", 'vllm.extra_args=["a\\nb"]'),
        ("not key=value", "justtext"),
        ("key with space", "a b=1"),
        ("served name", "served_model_name=a b"),
        ("image", "image=../x"),
        ("gpu memory 5", "vllm.gpu_memory_utilization=5"),
        ("topologies empty", "topologies=[]"),
        ("max_model_len 31 digits", "vllm.max_model_len=1000000000000000000000000000000"),
        ("max_num_seqs a bool", "vllm.max_num_seqs=true"),
        ("timeout inf", "litellm.timeout=.inf"),
    ]:
        out.append(Case(f"--set {name}", dry + ["--set", value]))
    # Values that are accepted on purpose: they must stay inert when the rendered scripts run.
    for name, value in [
        ("$(...) in an arg", f'vllm.extra_args=["--mxfp4-layers", "{PWN}"]'),
        ("backticks in env", "env.X=`touch PWNED`"),
        ("; in env", "env.Y=a; touch PWNED"),
        ("quote in hf_cache", None),
    ]:
        if value is None:
            out.append(
                Case(
                    "render: hf_cache with $(...)",
                    ["render", "openai-gpt-oss-120b", "-t", "solo", "-i", "{inv}", "--out", "{tmp}/r"],
                    expect=(0,),
                    inventory=inventory(hf_cache=f"~/hf {PWN}"),
                    run_scripts=True,
                )
            )
        else:
            out.append(
                Case(
                    f"render: {name}",
                    ["render", "openai-gpt-oss-120b", "-t", "solo", "-i", "{inv}", "--out", "{tmp}/r", "--set", value],
                    expect=(0,),
                    run_scripts=True,
                )
            )
    # -- options ---------------------------------------------------------------------------------------------------
    render = ["render", "openai-gpt-oss-120b", "-i", "{inv}"]
    out += [
        Case("render --out /proc/forbidden", render + ["--out", "/proc/forbidden"]),
        Case("render --out a file", render + ["--out", "{inv}"]),
        Case("render --with-secrets into a world-writable folder", render + ["--out", "{tmp}/open", "--with-secrets"]),
        Case("render --with-secrets through a symlinked --out", render + ["--out", "{tmp}/link", "--with-secrets"]),
        Case("render masked (no secret in files)", render + ["--out", "{tmp}/masked"], expect=(0,)),
        Case("--recipes-dir missing", dry + ["--recipes-dir", "/nonexistent"]),
        Case("--timeout nan", ["run-recipe", "openai-gpt-oss-120b", "-i", "{inv}", "--timeout", "nan"]),
        Case("--timeout inf", ["run-recipe", "openai-gpt-oss-120b", "-i", "{inv}", "--timeout", "inf"]),
        Case("--timeout -1", ["run-recipe", "openai-gpt-oss-120b", "-i", "{inv}", "--timeout", "-1"]),
        Case("--backend with solo (warns)", dry + ["-t", "solo", "--backend", "ray"], expect=(0,)),
        Case("unknown topology", dry + ["-t", "3xsolo"]),
        Case("unknown recipe", ["run-recipe", "../../etc/passwd", "--dry-run", "-i", "{inv}"]),
        Case("--node on cluster", dry + ["-t", "cluster", "--node", "spark2"]),
        Case("2xsolo dry run --json (masked)", dry + ["-t", "2xsolo", "--json"], expect=(0,)),
    ]
    return out


def _write(path: Path, content) -> None:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)


def _recorders(bin_dir: Path) -> None:
    bin_dir.mkdir()
    for name in ("docker", "vllm", "ray", "torchrun", "litellm", "nvidia-smi"):
        p = bin_dir / name
        p.write_text("#!/bin/sh\nexit 0\n")
        p.chmod(0o755)


def run_case(case: Case, base: Path) -> dict:
    tmp = Path(tempfile.mkdtemp(dir=base))
    inv, recipes = tmp / "inventory.yaml", tmp / "recipes"
    _write(inv, case.inventory if case.inventory is not None else inventory())
    recipes.mkdir()
    _write(recipes / "openai-gpt-oss-120b.yaml", case.recipe if case.recipe is not None else RECIPE)
    secrets = tmp / "secrets.env"
    if case.secrets == "DIR":
        secrets.mkdir()
    elif case.secrets == "FIFO":
        os.mkfifo(secrets)
    elif case.secrets != "NONE":
        _write(
            secrets,
            case.secrets if case.secrets is not None else f"HF_TOKEN={CANARY_HF}\nLITELLM_MASTER_KEY={CANARY_KEY}\n",
        )
        if not secrets.is_fifo():
            secrets.chmod(0o600)
    (tmp / "open").mkdir()
    (tmp / "open").chmod(0o777)
    (tmp / "real").mkdir(mode=0o700)
    (tmp / "link").symlink_to(tmp / "real")
    argv = [a.format(inv=inv, recipes=recipes, tmp=tmp) for a in case.argv]
    out, err = io.StringIO(), io.StringIO()
    escaped = None
    cwd = os.getcwd()
    os.chdir(tmp)
    t0 = time.monotonic()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run_cli(cli, argv)
    except BaseException as exc:  # noqa: BLE001 - that is what this counts
        escaped, code = f"{exc.__class__.__name__}: {exc}"[:200], -1
    finally:
        os.chdir(cwd)
    seconds = time.monotonic() - t0
    text = out.getvalue() + err.getvalue()
    leaks = [c for c in (CANARY_HF, CANARY_KEY) if c in text]
    for f in tmp.rglob("*"):
        written_here = f.parent != tmp and recipes not in f.parents  # not one of the inputs above
        if f.is_file() and not f.is_symlink() and written_here and "--with-secrets" not in argv:
            body = f.read_bytes()
            leaks += [f"{c} in {f.relative_to(tmp)}" for c in (CANARY_HF, CANARY_KEY) if c.encode() in body]
    if case.run_scripts and code == 0:
        _recorders(tmp / "bin")
        home = tmp / "home"
        home.mkdir()
        env = {**os.environ, "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}", "HOME": str(home)}
        for script in sorted((tmp / "r").rglob("*.sh")):
            subprocess.run(["bash", str(script)], cwd=tmp, env=env, capture_output=True, timeout=60)
    executions = [str(p.relative_to(base)) for p in base.rglob("PWNED*")]
    for p in base.rglob("PWNED*"):
        p.unlink()
    traceback = escaped is not None or "Traceback" in text
    ok = code in case.expect and not traceback and not leaks and not executions
    first = next((line for line in err.getvalue().splitlines() if line.strip()), "")
    return {
        "case": case.name,
        "exit": code,
        "expected": list(case.expect),
        "ok": ok,
        "traceback": traceback,
        "escaped": escaped,
        "leaks": leaks,
        "executions": executions,
        "seconds": round(seconds, 2),
        "first_line": first[:160],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as base_dir:
        base = Path(base_dir)
        state = base / "state"
        os.environ["SPARKDEPLOY_STATE"] = str(state)
        for name in ("HF_TOKEN", "LITELLM_MASTER_KEY", "SPARKDEPLOY_INVENTORY", "SPARKDEPLOY_RECIPES"):
            os.environ.pop(name, None)
        results = [run_case(c, base) for c in cases()]
    summary = {
        "inputs": len(results),
        "tracebacks": sum(r["traceback"] for r in results),
        "leaks": sum(bool(r["leaks"]) for r in results),
        "executions": sum(bool(r["executions"]) for r in results),
        "wrong_exit": sum(r["exit"] not in r["expected"] for r in results),
        "slowest_s": max(r["seconds"] for r in results),
    }
    if args.json:
        print(json.dumps({"summary": summary, "results": results}, indent=2))
    else:
        for r in results:
            if args.verbose or not r["ok"]:
                mark = "ok  " if r["ok"] else "FAIL"
                print(
                    f"{mark} exit {r['exit']:>3} {r['case']}: {r['escaped'] or r['first_line']}"
                    + (f" leaks={r['leaks']}" if r["leaks"] else "")
                    + (f" executions={r['executions']}" if r["executions"] else "")
                )
        print(
            f"hostile inputs tried: {summary['inputs']}; tracebacks: {summary['tracebacks']}; leaks: "
            f"{summary['leaks']}; executions: {summary['executions']}; wrong exit codes: {summary['wrong_exit']}; "
            f"slowest case: {summary['slowest_s']:.2f} s"
        )
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
