#!/usr/bin/env python3
"""End to end on this machine's Docker engine: the real llama-server of images/llamacpp-cpu serves a tiny GGUF.

Writes the tiny model (scripts/make_tiny_gguf.py: one file, and the same model split in three), starts
`llama-server` from the image with the flags sparkdeploy will render (`-m`, `-c`, `--parallel`, `--jinja`,
`--metrics`, `-ngl`, `--flash-attn`, `--alias`, `--host`, `--port`), and checks what a deployment relies on:
GET /health (503 while loading, then 200), GET /v1/models, POST /v1/chat/completions (plain, streamed, with a
tool and tool_choice auto and required), GET /metrics (the `llamacpp:*` names), then the split model from its
first file. Prints one line per check and a JSON report (`--json FILE`); exit 1 if a check fails.

    python3 scripts/fetch_image_downloads.py llamacpp-cpu
    python3 -m sparkdeploy.images.build llamacpp-cpu          # prints the tag
    python3 scripts/smoke_llamacpp_cpu.py --image sparkdeploy/llamacpp-cpu:TAG [--json report.json]

Containers are named sparkdeploy-smoke-llamacpp-<pid>-<n> and removed at the end (also on failure).
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
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


class Smoke:
    def __init__(self, image: str) -> None:
        self.image = image
        self.results: list[dict[str, Any]] = []
        self.containers: list[str] = []

    def check(self, name: str, ok: bool, detail: Any) -> bool:
        self.results.append({"check": name, "ok": ok, "detail": detail})
        text = detail if isinstance(detail, str) else json.dumps(detail)[:300]
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {text}", flush=True)
        return ok

    def start(self, model_dir: Path, model_file: str, alias: str) -> tuple[str, int]:
        name = f"sparkdeploy-smoke-llamacpp-{os.getpid()}-{len(self.containers)}"
        argv = [
            "docker", "run", "-d", "--name", name, "-p", "127.0.0.1::8080",
            "-v", f"{model_dir}:/models:ro", self.image,
            "llama-server", "-m", f"/models/{model_file}", "--alias", alias,
            "-c", "1024", "--parallel", "2", "-ngl", "999", "--flash-attn", "auto",
            "--jinja", "--metrics", "--host", "0.0.0.0", "--port", "8080", "-t", "1",
        ]  # fmt: skip
        subprocess.run(argv, check=True, capture_output=True, text=True)
        self.containers.append(name)
        port = subprocess.run(["docker", "port", name, "8080/tcp"], check=True, capture_output=True, text=True)
        return name, int(port.stdout.strip().splitlines()[0].rsplit(":", 1)[1])

    def cleanup(self) -> None:
        for name in self.containers:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)

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


def wait_healthy(smoke: Smoke, name: str, port: int, limit: float = 120) -> tuple[bool, list[int], float]:
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


def run(smoke: Smoke, workdir: Path) -> None:
    single = tiny.write(workdir / "single" / "tiny-llama.gguf")
    split = tiny.write(workdir / "split" / "tiny-llama.gguf", split_max_tensors=8)
    smoke.check("model files", True, {f.name: f.stat().st_size for f in single + split})

    name, port = smoke.start(workdir / "single", single[0].name, "tiny-llama")
    ok, seen, took = wait_healthy(smoke, name, port)
    if not smoke.check("GET /health", ok, f"codes seen {seen}, 200 after {took:.1f} s"):
        print(smoke.logs(name)[-3000:])
        return
    code, text = http(port, "/health")
    smoke.check("GET /health body", code == 200, text.strip())
    code, text = http(port, "/v1/models")
    models = json.loads(text) if code == 200 else {}
    ids = [m.get("id") for m in models.get("data", [])]
    smoke.check("GET /v1/models", code == 200 and ids == ["tiny-llama"], models)

    chat = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12}
    code, text = http(port, "/v1/chat/completions", chat)
    reply = json.loads(text) if code == 200 else {"error": text}
    content = (reply.get("choices") or [{}])[0].get("message", {}).get("content")
    smoke.check("POST /v1/chat/completions", code == 200 and isinstance(content, str) and content != "", reply)

    code, text = http(port, "/v1/chat/completions", dict(chat, stream=True))
    events = [line for line in text.splitlines() if line.startswith("data: ")]
    smoke.check(
        "POST /v1/chat/completions stream", code == 200 and events[-1:] == ["data: [DONE]"], events[:2] + events[-2:]
    )

    for choice in ("auto", "required"):
        body = dict(chat, tools=[TOOL], tool_choice=choice, max_tokens=48)
        code, text = http(port, "/v1/chat/completions", body)
        reply = json.loads(text) if code == 200 else {"error": text}
        message = (reply.get("choices") or [{}])[0].get("message", {})
        calls = message.get("tool_calls") or []
        detail = {"http": code, "finish_reason": (reply.get("choices") or [{}])[0].get("finish_reason"),
                  "message": message, "error": reply.get("error")}  # fmt: skip
        if choice == "required":
            good = code == 200 and bool(calls) and calls[0].get("function", {}).get("name") == "get_weather"
        else:
            good = code == 200  # auto: the model may answer in words or call the tool
        smoke.check(f"chat with a tool, tool_choice={choice}", good, detail)

    code, text = http(port, "/metrics")
    names = sorted({line.split()[0].split("{")[0] for line in text.splitlines() if line.startswith("llamacpp:")})
    smoke.check("GET /metrics", code == 200 and bool(names), names)
    smoke.results.append({"metrics_text": text})

    code, text = http(port, "/props")
    props = json.loads(text) if code == 200 else {}
    smoke.check(
        "GET /props",
        code == 200,
        {k: props.get(k) for k in ("total_slots", "model_path", "build_info") if k in props}
        | {"n_ctx": props.get("default_generation_settings", {}).get("n_ctx")},
    )
    code, text = http(port, "/slots")
    smoke.check("GET /slots", code in (200, 501), f"HTTP {code}")

    name2, port2 = smoke.start(workdir / "split", split[0].name, "tiny-llama-split")
    ok, seen, took = wait_healthy(smoke, name2, port2)
    if smoke.check("split GGUF: GET /health", ok, f"-m {split[0].name}: codes {seen}, 200 after {took:.1f} s"):
        code, text = http(port2, "/v1/chat/completions", dict(chat, model="tiny-llama-split"))
        smoke.check("split GGUF: chat", code == 200, json.loads(text) if code == 200 else text)
        log = smoke.logs(name2)
        loaded = [line.strip() for line in log.splitlines() if "split" in line.lower()][:6]
        smoke.check("split GGUF: log", bool(loaded), loaded)
    else:
        print(smoke.logs(name2)[-3000:])


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
