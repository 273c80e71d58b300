#!/usr/bin/env python3
"""Model ready on every lab node: `models pull` (download once + copy over the fabric) vs every node
downloading from the hub itself (what engines do today at first start), on the lab's shaped hub.

Both sides use the same real huggingface_hub client in the same engine image on the nodes, from the lab hub
(egress shaped with tc to a tenth of what one SSH stream moves over the lab's fabric), into emptied caches:

  baseline   every node runs huggingface_hub's snapshot_download at once (they share the hub's link)
  ours       `models pull`: spark1 downloads, spark1 -> spark2 over the fabric, every file verified on both

Timed --repeat times (medians), alternating which goes first. Prints the time ratio (goal <= 0.6x) and the
bytes the hub served per model size (goal 1.0x for ours; the baseline serves one copy per node).

    python benchmarks/models_pull_vs_hub.py [--model lab/small-model] [--repeat 3]

Needs the lab up (`sparkdeploy lab up`). docs/benchmarks.md records the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="lab/small-model")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from sparkdeploy.lab import LabSpec, hub
    from sparkdeploy.models.ops import ModelRef, folder
    from sparkdeploy.models.pull import Puller
    from sparkdeploy.runtime.remote import NodeConnection, on_nodes
    from sparkdeploy.topologies.context import load_deployment

    spec = LabSpec()
    from sparkdeploy.lab import hub_repo

    hub_repo.ensure_repos((args.model,))  # lab up makes only the small repositories; the hub serves it at once
    dep = load_deployment(str(spec.inventory_path), None)
    inv = dep.inventory
    nodes = inv.nodes
    ref = ModelRef(args.model, "main")
    conns = {n.name: NodeConnection(n, inv) for n in nodes}
    puller = Puller(inv, conns, dep.secrets, dep.image_tag)

    def served() -> int:
        return hub.stats(spec)["repos"].get(args.model, {}).get("bytes", 0)

    def clean() -> None:
        on_nodes(
            nodes,
            lambda n: conns[n.name].run(
                [
                    "sh",
                    "-c",
                    'rm -rf "$1/hub/$2" "$1/sparkdeploy-models/$2"',
                    "sh",
                    inv.cluster.hf_cache.replace("~", conns[n.name].home(), 1),
                    folder(ref.repo),
                ]
            ),
        )

    def baseline() -> float:
        errors = []

        def one(node):
            try:
                puller._hub_client(node, ref, "download", ref.revision)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(f"{node.name}: {exc}")

        t0 = time.monotonic()
        threads = [threading.Thread(target=one, args=(n,)) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise SystemExit("baseline failed: " + "; ".join(errors))
        return time.monotonic() - t0

    def ours() -> float:
        t0 = time.monotonic()
        result = puller.pull(ref, inv.head, nodes)
        if not result.ok:
            raise SystemExit("models pull failed: " + "; ".join(r.error for r in result.nodes.values() if r.error))
        return time.monotonic() - t0

    size = None
    times: dict[str, list[float]] = {"baseline": [], "ours": []}
    hub_bytes: dict[str, list[int]] = {"baseline": [], "ours": []}
    for i in range(args.repeat):
        order = [("baseline", baseline), ("ours", ours)]
        if i % 2:
            order.reverse()
        for name, fn in order:
            clean()
            before = served()
            seconds = fn()
            hub_bytes[name].append(served() - before)
            times[name].append(seconds)
            print(f"run {i + 1} {name:8s} {seconds:6.1f} s, hub served {hub_bytes[name][-1] / 1e6:.1f} MB", flush=True)
        if size is None:  # the last run was ours or the baseline: either way the hub's listing has the size
            size = sum(f["size"] for f in puller._hub_client(nodes[0], ref, "plan", ref.revision)["files"])
    clean()
    for c in conns.values():
        c.close()

    b, o = statistics.median(times["baseline"]), statistics.median(times["ours"])
    print(f"\nmodel {args.model}: {size / 1e6:.1f} MB, {len(nodes)} nodes, hub shaped to {hub.HUB_RATE_MBIT} Mbit/s")
    print(f"baseline (every node from the hub): median {b:.1f} s  {times['baseline']}")
    print(f"models pull (once + fabric copy):   median {o:.1f} s  {times['ours']}")
    print(f"time ratio ours/baseline: {o / b:.2f}x (goal <= 0.6x)")
    print(
        f"hub bytes per model size: ours {statistics.median(hub_bytes['ours']) / size:.2f}x (goal 1.0x), "
        f"baseline {statistics.median(hub_bytes['baseline']) / size:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
