#!/usr/bin/env python3
"""End to end on this machine's Docker engine: the real llama-server of images/llamacpp-cpu serves a tiny GGUF.

Writes the tiny model (scripts/make_tiny_gguf.py: one file, and the same model split in three), starts
`llama-server` from the image with the flags sparkdeploy will render (`-m`, `-c`, `--parallel`, `--jinja`,
`--metrics`, `-ngl`, `--flash-attn`, `--alias`, `--host`, `--port`), and checks what a deployment relies on:
GET /health (503 while loading, then 200), GET /v1/models, POST /v1/chat/completions (plain, streamed, with a
tool: tool_choice auto, required, and required steered into a call with logit_bias), GET /metrics (the
`llamacpp:*` names), /props, /slots; tools without --jinja and /metrics without --metrics (refused); the split
model from its first file (and refused from its second); llama.cpp's RPC mode (ggml-rpc-server in a second
container, `llama-server --rpc`). Prints one line per check and a JSON report (`--json FILE`); exit 1 if a
check fails.

    python3 scripts/fetch_image_downloads.py llamacpp-cpu
    python3 -m sparkdeploy.images.build llamacpp-cpu          # prints the tag
    python3 scripts/smoke_llamacpp_cpu.py --image sparkdeploy/llamacpp-cpu:TAG [--json report.json]

Containers and the network are named sparkdeploy-smoke-llamacpp-<pid>-<n>, removed at the end (also on failure).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("make_tiny_gguf", HERE / "make_tiny_gguf.py")
assert _spec and _spec.loader
tiny = importlib.util.module_from_spec(_spec)
sys.modules["make_tiny_gguf"] = tiny  # dataclasses look their module up while the class is made
_spec.loader.exec_module(tiny)

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
        },
    },
}


class Smoke:
    def __init__(self, image: str) -> None:
        self.image = image
        self.results: list[dict[str, Any]] = []
        self.containers: list[str] = []
        self.networks: list[str] = []

    def check(self, name: str, ok: bool, detail: Any) -> bool:
        self.results.append({"check": name, "ok": ok, "detail": detail})
        text = detail if isinstance(detail, str) else json.dumps(detail)[:300]
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {text}", flush=True)
        return ok

    def name(self) -> str:
        return f"sparkdeploy-smoke-llamacpp-{os.getpid()}-{len(self.containers) + len(self.networks)}"

    def start(
        self, model_dir: Path, args: list[str], network: str | None = None, publish: bool = True
    ) -> tuple[str, int]:
        """`llama-server ARGS --host 0.0.0.0 --port 8080` in a container; its port on 127.0.0.1 (0 if not published)."""
        name = self.name()
        argv = ["docker", "run", "-d", "--name", name, "-v", f"{model_dir}:/models:ro"]
        argv += ["-p", "127.0.0.1::8080"] if publish else []
        argv += ["--network", network] if network else []
        argv += [self.image, "llama-server", *args, "--host", "0.0.0.0", "--port", "8080", "-t", "1"]
        subprocess.run(argv, check=True, capture_output=True, text=True)
        self.containers.append(name)
        if not publish:
            return name, 0
        port = subprocess.run(["docker", "port", name, "8080/tcp"], check=True, capture_output=True, text=True)
        return name, int(port.stdout.strip().splitlines()[0].rsplit(":", 1)[1])

    def run_once(self, model_dir: Path, argv: list[str]) -> tuple[int, str]:
        """A command in a throwaway container: (exit code, stdout and stderr)."""
        full = ["docker", "run", "--rm", "-v", f"{model_dir}:/models:ro", self.image, *argv]
        r = subprocess.run(full, capture_output=True, text=True, timeout=120)
        return r.returncode, r.stdout + r.stderr

    def network(self) -> str:
        name = self.name()
        subprocess.run(["docker", "network", "create", name], check=True, capture_output=True, text=True)
        self.networks.append(name)
        return name

    def cleanup(self) -> None:
        for name in self.containers:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        for name in self.networks:
            subprocess.run(["docker", "network", "rm", name], capture_output=True)

    def logs(self, name: str) -> str:
        r = subprocess.run(["docker", "logs", name], capture_output=True, text=True)
        return r.stdout + r.stderr


def http(port: int, path: str, body: dict | None = None, timeout: float = 120) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_healthy(port: int, limit: float = 120) -> tuple[bool, list[int], float]:
    seen: list[int] = []
    start = time.monotonic()
    while time.monotonic() - start < limit:
        try:
            code, _ = http(port, "/health", timeout=5)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            code = 0  # not listening yet
        if not seen or seen[-1] != code:
            seen.append(code)
        if code == 200:
            return True, seen, time.monotonic() - start
        time.sleep(0.2)
    return False, seen, time.monotonic() - start


def first_message(text: str) -> tuple[dict, dict]:
    reply = json.loads(text)
    choice = (reply.get("choices") or [{}])[0]
    return reply, {"finish_reason": choice.get("finish_reason"), "message": choice.get("message", {})}


def serve_and_chat(smoke: Smoke, workdir: Path, single: Path) -> None:
    served = ["-m", f"/models/{single.name}", "--alias", "tiny-llama", "-c", "1024", "--parallel", "2"]
    served += ["-ngl", "999", "--flash-attn", "auto", "--jinja", "--metrics"]
    name, port = smoke.start(single.parent, served)
    ok, seen, took = wait_healthy(port)
    if not smoke.check("GET /health", ok, f"codes seen {seen} (0: not listening yet), 200 after {took:.1f} s"):
        print(smoke.logs(name)[-3000:])
        return
    code, text = http(port, "/health")
    smoke.check("GET /health body", code == 200 and json.loads(text) == {"status": "ok"}, text.strip())
    code, text = http(port, "/v1/models")
    models = json.loads(text) if code == 200 else {}
    ids = [m.get("id") for m in models.get("data", [])]
    smoke.check("GET /v1/models", code == 200 and ids == ["tiny-llama"], models)

    chat = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12}
    code, text = http(port, "/v1/chat/completions", chat)
    reply, first = first_message(text) if code == 200 else ({}, {})
    content = first.get("message", {}).get("content")
    smoke.check("POST /v1/chat/completions", code == 200 and isinstance(content, str) and content != "", reply)

    code, text = http(port, "/v1/chat/completions", dict(chat, stream=True))
    events = [line for line in text.splitlines() if line.startswith("data: ")]
    smoke.check(
        "POST /v1/chat/completions stream", code == 200 and events[-1:] == ["data: [DONE]"], events[:1] + events[-2:]
    )

    # Tools (--jinja): llama.cpp builds a grammar and a parser from the model's chat template. The random weights
    # never choose the call markup by themselves (tool_choice=required lets text come first): logit_bias steers
    # them into one call (<tool_call> first, the end of turn as soon as the grammar allows it); the enum leaves
    # the grammar no free text inside the call; what comes back is llama.cpp's own parse of it.
    tokens, _, _ = tiny.vocabulary()
    bias = {tokens.index("<tool_call>"): 100, tokens.index("</tool_call>"): 50, tokens.index("<|im_end|>"): 200}
    tool = dict(chat, tools=[TOOL], max_tokens=80)
    for label, body in (
        ("auto", dict(tool, tool_choice="auto")),
        ("required", dict(tool, tool_choice="required")),
        ("required, steered with logit_bias", dict(
            tool, tool_choice="required", parallel_tool_calls=False, logit_bias={str(k): v for k, v in bias.items()}
        )),
    ):  # fmt: skip
        code, text = http(port, "/v1/chat/completions", body)
        if code != 200:
            smoke.check(f"chat with a tool, tool_choice={label}", False, {"http": code, "body": text})
            continue
        _, first = first_message(text)
        calls = first["message"].get("tool_calls") or []
        if label.startswith("required, steered"):
            call = calls[0]["function"] if calls else {}
            good = first["finish_reason"] == "tool_calls" and call.get("name") == "get_weather"
            good = good and json.loads(call.get("arguments") or "{}").get("city") in ("Paris", "Rome")
        else:
            good = bool(first["message"].get("content"))  # words: no refusal, no call
        smoke.check(f"chat with a tool, tool_choice={label}", good, first)

    code, text = http(port, "/metrics")
    names = sorted({line.split()[0].split("{")[0] for line in text.splitlines() if line.startswith("llamacpp:")})
    smoke.check("GET /metrics", code == 200 and "llamacpp:prompt_tokens_total" in names, names)
    smoke.results.append({"metrics_text": text})
    code, text = http(port, "/props")
    props = json.loads(text) if code == 200 else {}
    smoke.check(
        "GET /props",
        code == 200,
        {k: props.get(k) for k in ("total_slots", "model_path", "build_info")}
        | {"n_ctx per slot": props.get("default_generation_settings", {}).get("n_ctx")},
    )
    code, text = http(port, "/slots")
    smoke.check("GET /slots", code == 200, f"HTTP {code}, {len(json.loads(text)) if code == 200 else 0} slots")
    code, _ = http(port, "/")
    smoke.check("GET / (no web UI in this build)", code == 404, f"HTTP {code}")

    _, port2 = smoke.start(single.parent, ["-m", f"/models/{single.name}", "--no-jinja"])
    ok, _, _ = wait_healthy(port2)
    code, text = http(port2, "/v1/chat/completions", dict(chat, tools=[TOOL]))
    smoke.check("tools without --jinja", ok and code == 500 and "requires --jinja" in text, f"HTTP {code} {text}")
    code, text = http(port2, "/metrics")
    smoke.check("/metrics without --metrics", code == 501, f"HTTP {code} {text}")


def split_model(smoke: Smoke, split: list[Path]) -> None:
    folder = split[0].parent
    name, port = smoke.start(folder, ["-m", f"/models/{split[0].name}", "--alias", "tiny-llama-split"])
    ok, seen, took = wait_healthy(port)
    if not smoke.check("split GGUF, -m the first file: GET /health", ok, f"codes {seen}, 200 after {took:.1f} s"):
        print(smoke.logs(name)[-3000:])
        return
    code, text = http(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6})
    smoke.check("split GGUF: chat", code == 200, first_message(text)[1] if code == 200 else text)
    code, out = smoke.run_once(folder, ["llama-server", "-m", f"/models/{split[1].name}", "-c", "256", "-t", "1"])
    said = [line.strip() for line in out.splitlines() if "first split" in line][:1]
    smoke.check("split GGUF, -m the second file: refused", code != 0 and bool(said), said)


def rpc(smoke: Smoke, single: Path) -> None:
    """llama.cpp's multi-node mode on CPU: ggml-rpc-server in one container, llama-server --rpc in another."""
    net = smoke.network()
    worker = smoke.name()
    subprocess.run(
        ["docker", "run", "-d", "--name", worker, "--network", net, smoke.image,
         "ggml-rpc-server", "-H", "0.0.0.0", "-p", "50052", "-t", "1"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    smoke.containers.append(worker)
    args = ["-m", f"/models/{single.name}", "--rpc", f"{worker}:50052", "-ngl", "999", "-c", "512", "--verbose"]
    head, port = smoke.start(single.parent, args, network=net)
    ok, seen, took = wait_healthy(port)
    if not smoke.check("RPC: llama-server --rpc WORKER:50052 healthy", ok, f"codes {seen}, 200 after {took:.1f} s"):
        print(smoke.logs(head)[-3000:])
        return
    code, _ = http(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6})
    log = smoke.logs(head)
    placed = [line.split(" I ", 1)[-1].strip() for line in log.splitlines() if "offloaded" in line or "RPC0[" in line]
    smoke.check(
        "RPC: layers on the worker, chat answers", code == 200 and any("offloaded 3/3" in p for p in placed), placed
    )
    wlog = smoke.logs(worker)
    smoke.check(
        "RPC: the worker served", "Accepted client connection" in wlog, [x for x in wlog.splitlines() if x.strip()][-8:]
    )


def run(smoke: Smoke, workdir: Path) -> None:
    single = tiny.write(workdir / "single" / "tiny-llama.gguf")
    split = tiny.write(workdir / "split" / "tiny-llama.gguf", split_max_tensors=8)
    smoke.check("model files", True, {f.name: f.stat().st_size for f in single + split})
    serve_and_chat(smoke, workdir, single[0])
    split_model(smoke, split)
    rpc(smoke, single[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True, help="the llamacpp-cpu image tag")
    ap.add_argument("--json", type=Path, help="write the report here")
    args = ap.parse_args(argv)
    smoke = Smoke(args.image)
    try:
        with tempfile.TemporaryDirectory(prefix="sparkdeploy-smoke-llamacpp-") as tmp:
            os.chmod(tmp, 0o755)
            run(smoke, Path(tmp))
    finally:
        smoke.cleanup()
    if args.json:
        args.json.write_text(json.dumps(smoke.results, indent=1) + "\n")
    failed = [r["check"] for r in smoke.results if r.get("ok") is False]
    print(f"{len(failed)} failed: {', '.join(failed)}" if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
