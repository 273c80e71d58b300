#!/usr/bin/env python3
"""`images push --from NODE` vs eugr's method, `docker save IMG | ssh TARGET_FABRIC_IP docker load` run ON the
source node (one target after the other), and push to three other nodes vs to one.

A synthetic image of about --size-gb GB in --layers layers of random data (compression cannot cheat) plus a
1 MB random top layer (benchmarks/image_push.py builds it here FROM the lab's debian-base), pushed to the
source node first; v2 differs from v1 only in the top layer. Both methods run node to node over the fabric
IPs with the same peer ssh (peers.peer_ssh_argv: same key, cipher and host-key checking), medians of
--repeat runs:

  first push   targets lack the image           goal: ours <= 0.6x eugr's
  re-push      targets have v1, push v2         goal: ours <= 0.1x eugr's
  fan-out      ours to three other nodes (a 4-node lab) vs to one          goal: <= 1.5x
               and ours to three vs eugr's to the three, one after the other   goal: <= 0.6x

    python benchmarks/push_from_vs_save_load.py [--inventory lab] [--size-gb 0.4] [--layers 4] [--repeat 3]
        [--cpus-per-node 0.5]   # each node its own CPU share (cgroup quota), as separate machines have

Needs a lab up (two nodes for the first two figures, four for the fan-out: `sparkdeploy lab up --name p4
--nodes 4 ...` and --inventory pointing at its inventory.yaml). Removes its images from the nodes at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

from image_push import REPO, build_images, on_node

GOALS = {"first": 0.6, "repush": 0.1, "fanout": 1.5}


def node_containers(client, inventory) -> dict:
    """The lab's node containers by node name (matched on their management IP)."""
    by_ip = {n.mgmt_ip: n.name for n in inventory.nodes}
    found = {}
    for c in client.containers.list(filters={"label": "io.sparkdeploy.lab=1"}):
        for net in (c.attrs.get("NetworkSettings", {}).get("Networks") or {}).values():
            if net.get("IPAddress") in by_ip:
                found[by_ip[net["IPAddress"]]] = c
    missing = [n.name for n in inventory.nodes if n.name not in found]
    if missing:
        raise SystemExit(f"--cpus-per-node: no lab container for {', '.join(missing)} (a lab inventory is needed)")
    return found


def cap_cpus(containers: dict, cpus: float | None) -> None:
    """Give every node container a fixed CPU share (a cgroup CFS quota per period), or none again (cpus None:
    quota -1). Each lab node then has its own CPU, as each Spark does, instead of all of them taking turns on
    this machine's cores. (Not `--cpus`: Docker cannot unset that one.)"""
    for c in containers.values():
        c.update(cpu_period=100_000, cpu_quota=int(cpus * 100_000) if cpus else -1)


def forget(inventory, nodes, refs) -> None:
    for node in nodes:
        on_node(inventory, node, f"docker image rm {' '.join(refs)} >/dev/null 2>&1; true")


def eugr(inventory, source, targets, ref: str) -> float:
    """docker save | ssh TARGET docker load, on the source node, one target after the other."""
    import shlex

    from sparkdeploy.runtime.peers import peer_ssh_argv
    from sparkdeploy.runtime.remote import NodeConnection

    started = time.monotonic()
    with NodeConnection(source, inventory) as conn:
        for target in targets:
            line = f"docker save {shlex.quote(ref)} | {shlex.join(peer_ssh_argv(source, target, ['docker', 'load']))}"
            r = conn.run(["bash", "-o", "pipefail", "-c", line], check=False, timeout=3600)
            if not r.ok:
                raise SystemExit(f"eugr's push to {target.name} failed: {r.stderr[-500:]}")
    return time.monotonic() - started


def ours(inventory, source, targets, ref: str) -> tuple[float, int]:
    from sparkdeploy.images.push_from import push_from_node

    started = time.monotonic()
    _plan, outcomes, _received = push_from_node(ref, inventory, source, targets)
    took = time.monotonic() - started
    bad = [o for o in outcomes if not o.ok]
    if bad:
        raise SystemExit(f"push --from failed: {bad[0].error}")
    return took, max(o.value.bytes_sent for o in outcomes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inventory", default="lab")
    parser.add_argument("--size-gb", type=float, default=0.4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-compare", action="store_true", help="only the fan-out figure")
    parser.add_argument(
        "--cpus-per-node",
        type=float,
        default=None,
        help="cap each lab node container at this many CPUs for the run (e.g. 0.5 for four nodes "
        "on a 2-core machine): nodes with their own CPU, like Sparks; removed afterwards",
    )
    args = parser.parse_args()

    import docker

    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.images.build import ensure_image
    from sparkdeploy.images.push import push_image
    from sparkdeploy.runtime.peers import ensure_peer_trust

    inv = load_inventory(args.inventory)
    source, others = inv.nodes[0], inv.nodes[1:]
    client = docker.from_env()
    base = ensure_image("debian-base", client, progress=lambda _l: None)
    build_images(client, base, args.size_gb, args.layers)
    v1, v2 = f"{REPO}:v1", f"{REPO}:v2"
    for ref in (v1, v2):
        bad = [o for o in push_image(ref, inv, [source]) if not o.ok]
        if bad:
            raise SystemExit(f"could not put {ref} on {source.name}: {bad[0].error}")
    containers = node_containers(client, inv) if args.cpus_per_node else {}
    ensure_peer_trust(inv, source, others)
    for a, b in itertools.pairwise(others):
        ensure_peer_trust(inv, a, [b])
    rows = []
    try:
        cap_cpus(containers, args.cpus_per_node)
        if not args.skip_compare:
            one = others[:1]
            times = {"first": ([], []), "repush": ([], [])}
            sent = {"first": 0, "repush": 0}
            for _ in range(args.repeat):
                forget(inv, one, [v1, v2])
                times["first"][0].append(eugr(inv, source, one, v1))
                forget(inv, one, [v1, v2])
                took, sent["first"] = ours(inv, source, one, v1)
                times["first"][1].append(took)
                # re-push: the target has v1 (it does now), push v2
                forget(inv, one, [v2])
                times["repush"][0].append(eugr(inv, source, one, v2))
                forget(inv, one, [v2])
                took, sent["repush"] = ours(inv, source, one, v2)
                times["repush"][1].append(took)
            for key, label in (("first", "first push"), ("repush", "re-push after a small layer change")):
                e, o = statistics.median(times[key][0]), statistics.median(times[key][1])
                rows.append((label, e, o, o / e, GOALS[key], sent[key]))
        if len(others) >= 3:
            one, three = others[:1], others[:3]
            t1, t3, e3 = [], [], []
            for _ in range(args.repeat):
                forget(inv, three, [v1, v2])
                t1.append(ours(inv, source, one, v1)[0])
                forget(inv, three, [v1, v2])
                t3.append(ours(inv, source, three, v1)[0])
                forget(inv, three, [v1, v2])
                e3.append(eugr(inv, source, three, v1))
            m1, m3, me3 = statistics.median(t1), statistics.median(t3), statistics.median(e3)
            rows.append(("push --from to 3 nodes vs to 1", m1, m3, m3 / m1, GOALS["fanout"], 0))
            rows.append(("first push to 3 nodes, vs eugr's to 3", me3, m3, m3 / me3, GOALS["first"], 0))
    finally:
        cap_cpus(containers, None)
        forget(inv, inv.nodes, [v1, v2])
    print(
        f"image: {args.size_gb} GB in {args.layers} random layers + 1 MB top layer; source {source.name}; "
        f"medians of {args.repeat}"
        + (f"; each node capped at {args.cpus_per_node:g} CPU" if args.cpus_per_node else "")
    )
    print(f"{'scenario':<38} {'baseline s':>10} {'ours s':>8} {'ratio':>6} {'goal':>6}  bytes sent")
    for label, e, o, ratio, goal, nbytes in rows:
        print(
            f"{label:<38} {e:>10.2f} {o:>8.2f} {ratio:>6.2f} {'<=' + str(goal):>6}  {nbytes / 1e6:.1f} MB"
            if nbytes
            else f"{label:<38} {e:>10.2f} {o:>8.2f} {ratio:>6.2f} {'<=' + str(goal):>6}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
