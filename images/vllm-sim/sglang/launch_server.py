"""SIMULATED `python3 -m sglang.launch_server` (vllm-sim): SGLang 0.5.23's real flags, its API shape, no GPU math.

The command line is parsed by an argparse parser built from SGLang 0.5.23's own dump (images/engine-args/, copied
into the image at /opt/sparkdeploy/engine-args): an unknown flag or an ambiguous prefix exits 2 as SGLang does.
Rank 0 serves the OpenAI API with vllm-sim's engine (SGLang's metric names on /metrics: num_running_reqs,
num_queue_reqs, token_usage, prompt/generation_tokens_total, time_to_first_token_seconds); with --nnodes N it first
waits for the N-1 other ranks to connect to --dist-init-addr over the fabric (a real TCP rendezvous), and ranks
> 0 connect there and stay up (SGLang's workers serve no API). Everything it answers is SIMULATED.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time

DUMP = os.environ.get("SGLANG_SIM_ARGS", "/opt/sparkdeploy/engine-args/sglang-0.5.23-args.json")
JOIN_TIMEOUT_S = 600
# SGLang's parser names -> the vLLM ones vllm-sim's formats speak (the same markup)
TOOL_PARSERS = {"gpt-oss": "openai", "qwen3_coder": "qwen3_coder", "glm45": "glm45", "glm47": "glm47"}
REASONING_PARSERS = {"gpt-oss": "openai_gptoss", "qwen3": "qwen3", "glm45": "glm45", "nemotron_3": "nemotron_v3"}


def parser() -> argparse.ArgumentParser:
    dump = json.load(open(DUMP))
    ap = argparse.ArgumentParser(prog="sglang serve", allow_abbrev=bool(dump.get("allow_abbrev", True)))
    seen: set[str] = {"-h", "--help"}
    for flag, info in dump["flags"].items():
        if flag in seen:
            continue
        names = [flag, *info["aliases"]]
        seen.update(names)
        if not info["takes_value"]:
            ap.add_argument(*names, dest=info["dest"], action="store_true")
        else:
            ap.add_argument(*names, dest=info["dest"], nargs=info["nargs"], choices=info["choices"])
    return ap


def _rendezvous(ns: argparse.Namespace) -> None:
    host, _, port = str(ns.dist_init_addr).rpartition(":")
    nnodes, rank = int(ns.nnodes), int(ns.node_rank)
    if rank > 0:
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while True:
            try:
                conn = socket.create_connection((host, int(port)), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit(f"SIMULATED sglang rank {rank}: rank 0 at {host}:{port} never answered")
                time.sleep(1)
        print(f"SIMULATED sglang rank {rank}/{nnodes}: joined rank 0 at {host}:{port}; serving no API", flush=True)
        conn.settimeout(None)  # the connect timeout must not end the wait: the rank lives as long as rank 0
        conn.recv(1)  # held until rank 0 goes away
        sys.exit(f"SIMULATED sglang rank {rank}: rank 0 went away")
    listener = socket.create_server(("0.0.0.0", int(port)))
    peers = []
    print(f"SIMULATED sglang rank 0: waiting for {nnodes - 1} rank(s) on port {port}", flush=True)
    while len(peers) < nnodes - 1:
        conn, addr = listener.accept()
        peers.append(conn)
        print(f"SIMULATED sglang rank 0: rank from {addr[0]} joined ({len(peers)}/{nnodes - 1})", flush=True)
    threading.Thread(target=lambda: [p.recv(1) for p in peers], daemon=True).start()


def sim_argv(ns: argparse.Namespace) -> list[str]:
    argv = ["serve", ns.model_path, "--host", ns.host or "0.0.0.0", "--port", str(ns.port or 30000)]
    if ns.served_model_name:
        argv += ["--served-model-name", ns.served_model_name]
    if ns.mem_fraction_static:
        argv += ["--gpu-memory-utilization", str(ns.mem_fraction_static)]
    if ns.context_length:
        argv += ["--max-model-len", str(ns.context_length)]
    if ns.max_running_requests:
        argv += ["--max-num-seqs", str(ns.max_running_requests)]
    if ns.tool_call_parser in TOOL_PARSERS:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", TOOL_PARSERS[ns.tool_call_parser]]
    if ns.reasoning_parser in REASONING_PARSERS:
        argv += ["--reasoning-parser", REASONING_PARSERS[ns.reasoning_parser]]
    if ns.trust_remote_code:
        argv.append("--trust-remote-code")
    return argv


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(sys.argv[1:] if argv is None else argv)
    print("SIMULATED SGLang 0.5.23 (vllm-sim): the flags are SGLang's own; no GPU math", flush=True)
    if ns.nnodes and int(ns.nnodes) > 1:
        _rendezvous(ns)
    os.environ["SPARKLAUNCH_METRICS_NAMES"] = "sglang"
    from vllm_sim.cli import main as sim_main

    return sim_main(sim_argv(ns))


if __name__ == "__main__":
    sys.exit(main())
