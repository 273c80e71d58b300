#!/usr/bin/env python3
"""Send one streamed chat completion to the endpoint `sparkdeploy status` reports, and print the tokens.

Used by scripts/demo.sh; reads the proxy master key from the inventory's secrets file when the topology has
a proxy (the key is sent as a Bearer header, never printed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import urllib.request


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--inventory", default="lab")
    parser.add_argument("prompt")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()

    status = json.loads(
        subprocess.run(
            ["sparkdeploy", "status", "--inventory", args.inventory, "--json"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    endpoint, model = status["endpoint"], status["model"]
    headers = {"Content-Type": "application/json"}
    if status.get("topology") == "2xsolo":
        from sparkdeploy.config.inventory import load_inventory
        from sparkdeploy.config.secrets import load_secrets

        inv = load_inventory(args.inventory)
        key = load_secrets(inv.local_path(inv.cluster.secrets_file)).get("LITELLM_MASTER_KEY")
        if key:
            headers["Authorization"] = f"Bearer {key}"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": args.prompt}],
        "stream": True,
        "max_tokens": args.max_tokens,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(f"{endpoint}/chat/completions", data=json.dumps(body).encode(), headers=headers)
    print(f"> {args.prompt}\n< ", end="", flush=True)
    shown = ""  # what is being printed: reasoning (a recipe with a reasoning parser thinks first) or the answer
    with urllib.request.urlopen(request, timeout=120) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                for part, text in (
                    ("reasoning", delta.get("reasoning") or delta.get("reasoning_content")),
                    ("answer", delta.get("content")),
                ):
                    if text:
                        if part != shown and (shown or part == "reasoning"):
                            print(f"{'' if not shown else chr(10)}[{part}] ", end="")
                        shown = part
                        print(text, end="", flush=True)
            if chunk.get("usage"):
                usage = chunk["usage"]
                print(
                    f"\n({usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion tokens "
                    f"from {endpoint})"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
