#!/usr/bin/env python3
"""Layer-aware `images push` vs the naive `docker save IMAGE | ssh NODE docker load`, on the lab's two nodes.

A synthetic image of about --size-gb GB (default 2) in --layers layers of random data (compression cannot
cheat) plus a 1 MB random top layer is built on this machine FROM the lab's debian-base; v2 differs from v1
only in that top layer (the build cache reuses the others). Three scenarios, each timed --repeat times
(medians), the naive baseline in the same run, alternating which goes first:

  first push     nodes lack the image (its random layers): naive = save|ssh load to node 1, then node 2
                 (sequential, as today's tools do); ours = `push_image` to both.   goal: <= 0.6x naive
  re-push        nodes have v1, push v2 (only the top layer changed).              goal: <= 0.1x naive,
                                                                                   bytes sent <= 1.2x that layer
  present        nodes have v2, push v2 again (ours only).                         goal: < 2 s

For the first push it also prints where the time goes: this machine's `docker save` alone (the engine writes
the whole archive to a temp folder before the first byte), the phases of our push, and the CPU use of the
whole machine (the lab's nodes and their engines run on this machine's cores too).

    python benchmarks/image_push.py [--size-gb 2] [--layers 8] [--repeat 3] [--keep]

Needs the lab up (`sparkdeploy lab up`). Removes its images from this machine and the nodes at the end unless
--keep. Prints the figures; docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import resource
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = "sparkdeploy-bench/push"
LABEL_NAME = "bench-push"
TOP_BYTES = 1_000_000
GOALS = {"first": 0.6, "repush": 0.1, "present_s": 2.0, "repush_bytes": 1.2}


# -- the synthetic image -------------------------------------------------------------------------------------


def build_images(client, base: str, size_gb: float, layers: int) -> dict[str, str]:
    from sparkdeploy.images.definitions import LABEL

    per_layer = int(size_gb * 1e9 / layers)
    rnd = random.Random(2)
    ids = {}
    for version in ("v1", "v2"):
        dockerfile = (
            "ARG BASE\nFROM ${BASE}\n"
            + "".join(f"RUN head -c {per_layer} /dev/urandom > /blob{i}.bin\n" for i in range(layers))
            + "COPY top.bin /top.bin\n"
        )
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in (("Dockerfile", dockerfile.encode()), ("top.bin", rnd.randbytes(TOP_BYTES))):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        buf.seek(0)
        tag = f"{REPO}:{version}"
        for chunk in client.api.build(
            fileobj=buf,
            custom_context=True,
            tag=tag,
            buildargs={"BASE": base},
            rm=True,
            forcerm=True,
            labels={LABEL: LABEL_NAME},
            decode=True,
        ):
            if "error" in chunk:
                raise SystemExit(f"building {tag}: {chunk['error']}")
        ids[version] = client.images.get(tag).id
    l1 = client.images.get(f"{REPO}:v1").attrs["RootFS"]["Layers"]
    l2 = client.images.get(f"{REPO}:v2").attrs["RootFS"]["Layers"]
    if l1[:-1] != l2[:-1]:
        raise SystemExit("v2 does not share v1's lower layers (build cache not used?)")
    return ids


# -- nodes ---------------------------------------------------------------------------------------------------


def ssh_argv(inventory, node) -> list[str]:
    ssh = node.ssh
    argv = [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={inventory.local_path(inventory.cluster.known_hosts)}",
    ]
    if ssh.key:
        argv += ["-i", str(inventory.local_path(ssh.key)), "-o", "IdentitiesOnly=yes"]
    if ssh.port:
        argv += ["-p", str(ssh.port)]
    return argv + [f"{ssh.user}@{node.mgmt_ip}" if ssh.user else node.mgmt_ip]


def on_node(inventory, node, command: str) -> str:
    proc = subprocess.run(ssh_argv(inventory, node) + [command], capture_output=True, text=True, timeout=600)
    return proc.stdout


def forget(inventory, refs: list[str], ids=()) -> None:
    """Untag our bench images on every node (their own layers go with them), with the partial images a cut
    push of the images `ids` left; nothing else is touched."""
    partials = "".join(
        f"docker image ls -q --filter label=io.sparkdeploy.partial-of={i} | sort -u | "
        f"xargs -r docker image rm >/dev/null 2>&1; "
        for i in ids
    )
    for node in inventory.nodes:
        on_node(inventory, node, f"docker image rm {' '.join(refs)} >/dev/null 2>&1; {partials}true")


def node_ids(inventory, ref: str) -> list[str]:
    return [
        on_node(inventory, n, f"docker image inspect --format '{{{{.Id}}}}' {ref} 2>/dev/null").strip()
        for n in inventory.nodes
    ]


def naive(inventory, ref: str) -> float:
    """Today's tools: `docker save | ssh docker load`, one node after the other."""
    started = time.monotonic()
    for node in inventory.nodes:
        pipeline = f"docker save {ref} | {subprocess.list2cmdline(ssh_argv(inventory, node))} docker load"
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", pipeline], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"naive push to {node.name} failed: {proc.stderr}")
    return time.monotonic() - started


class Phases:
    """Timestamps of a push (PushProgress hooks) and the machine's CPU use meanwhile."""

    def __init__(self):
        from sparkdeploy.images.push import PushProgress

        outer = self

        class Hooks(PushProgress):
            def begin(self, node, total):
                outer.mark("stream starts")

            def advance(self, node, raw=0, wire=0):
                if raw:
                    outer.mark("first archive byte")
                    outer.marks["last archive byte"] = time.monotonic()

            def end(self, node, ok, text):
                outer.marks[f"{node} done"] = time.monotonic()

        self.hooks = Hooks()
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, time.monotonic())


def cpu_busy() -> tuple[float, float]:
    """(busy, total) cpu-seconds of the whole machine so far."""
    values = list(map(int, open("/proc/stat").readline().split()[1:]))
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(values) - values[3] - values[4]) / hz, sum(values) / hz


def ours(inventory, ref: str, compression: str, phases: Phases | None = None, reader: str = "auto"):
    from sparkdeploy.images.push import PushProgress, push_image

    started = time.monotonic()
    outcomes = push_image(
        ref, inventory, progress=phases.hooks if phases else PushProgress(), compression=compression, reader=reader
    )
    seconds = time.monotonic() - started
    failed = [str(o.error) for o in outcomes if not o.ok]
    if failed:
        raise SystemExit(f"push failed: {failed}")
    return seconds, [o.value for o in outcomes], started


def save_alone(client, ref: str) -> tuple[float, float, int]:
    started = time.monotonic()
    first, size = None, 0
    for chunk in client.api.get_image(client.images.get(ref).id, chunk_size=1 << 20):
        first = first or time.monotonic() - started
        size += len(chunk)
    return first or 0.0, time.monotonic() - started, size


# -- main ----------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inventory", default="lab")
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compress", default="auto", choices=["auto", "zstd", "gzip", "none"])
    parser.add_argument(
        "--layer-source",
        default="auto",
        choices=["auto", "store", "save"],
        help="where our push reads the layers (push_image's reader)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the bench images (host and nodes)")
    args = parser.parse_args()

    import docker

    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.images.build import ensure_image

    inventory = load_inventory(args.inventory)
    client = docker.from_env(timeout=1200)
    base = ensure_image("debian-base", client, progress=lambda line: print(line, file=sys.stderr))
    v1, v2 = f"{REPO}:v1", f"{REPO}:v2"
    print(f"building {REPO} v1/v2: {args.size_gb:g} GB of random data in {args.layers} layers + 1 MB top", flush=True)
    t0 = time.monotonic()
    ids = build_images(client, base, args.size_gb, args.layers)
    image_bytes = client.images.get(v1).attrs["Size"]
    print(f"  built in {time.monotonic() - t0:.0f} s ({image_bytes / 1e9:.2f} GB with the base)", flush=True)
    print(f"  load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    results: dict[str, list] = {
        "naive_first": [],
        "ours_first": [],
        "naive_re": [],
        "ours_re": [],
        "present": [],
        "bytes_re": [],
        "layers_re": [],
        "bytes_first": [],
    }
    profile = []
    try:
        # -- first push ---------------------------------------------------------------------------------
        for rep in range(args.repeat):
            order = ("naive", "ours") if rep % 2 == 0 else ("ours", "naive")
            for who in order:
                forget(inventory, [v1, v2], ids.values())
                if who == "naive":
                    results["naive_first"].append(naive(inventory, v1))
                else:
                    phases = Phases()
                    busy0, total0 = cpu_busy()
                    rusage0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
                    seconds, res, started = ours(inventory, v1, args.compress, phases, args.layer_source)
                    busy1, total1 = cpu_busy()
                    rusage1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
                    mine = sum(
                        r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
                        for r0, r1 in zip(rusage0, rusage1, strict=False)
                    )
                    results["ours_first"].append(seconds)
                    results["bytes_first"].append(sum(r.bytes_sent for r in res))
                    profile.append(
                        (
                            seconds,
                            {k: v - started for k, v in phases.marks.items()},
                            busy1 - busy0,
                            total1 - total0,
                            mine,
                            res,
                        )
                    )
                assert node_ids(inventory, v1) == [ids["v1"]] * len(inventory.nodes)
                print(f"  first push {rep + 1}/{args.repeat} {who}: {results[who + '_first'][-1]:.1f} s", flush=True)
        # -- re-push after a small change -------------------------------------------------------------------
        for rep in range(args.repeat):
            order = ("naive", "ours") if rep % 2 == 0 else ("ours", "naive")
            for who in order:
                forget(inventory, [v2], ids.values())
                if who == "naive":
                    results["naive_re"].append(naive(inventory, v2))
                else:
                    seconds, res, _ = ours(inventory, v2, args.compress, reader=args.layer_source)
                    results["ours_re"].append(seconds)
                    results["bytes_re"].append(max(r.bytes_sent for r in res))
                    results["layers_re"].append(max(r.layers_sent for r in res))
                assert node_ids(inventory, v2) == [ids["v2"]] * len(inventory.nodes)
                print(f"  re-push {rep + 1}/{args.repeat} {who}: {results[who + '_re'][-1]:.1f} s", flush=True)
        # -- already present ------------------------------------------------------------------------------
        for _ in range(max(5, args.repeat)):
            seconds, res, _ = ours(inventory, v2, args.compress)
            assert {r.action for r in res} == {"present"}
            results["present"].append(seconds)
        started = time.monotonic()
        cli = subprocess.run(
            [
                sys.executable,
                "-c",
                "from sparkdeploy.cli.main import main; main()",
                "images",
                "push",
                v2,
                "-i",
                args.inventory,
                "--json",
            ],
            capture_output=True,
            text=True,
        )
        cli_seconds = time.monotonic() - started
        if cli.returncode != 0:
            raise SystemExit(f"CLI push failed: {cli.stderr}")
        save_first, save_total, save_size = save_alone(client, v1)
    finally:
        if not args.keep:
            forget(inventory, [v1, v2], ids.values())
            for ref in (v1, v2):
                try:
                    client.images.remove(ref)
                except docker.errors.ImageNotFound:
                    pass
            client.images.prune(filters={"dangling": True, "label": f"io.sparkdeploy.image={LABEL_NAME}"})

    med = {k: statistics.median(v) for k, v in results.items() if v}
    first_ratio = med["ours_first"] / med["naive_first"]
    re_ratio = med["ours_re"] / med["naive_re"]
    re_bytes_ratio = med["bytes_re"] / TOP_BYTES
    print()
    print(
        f"image: {image_bytes / 1e9:.2f} GB, {args.layers} random layers + 1 MB top, 2 nodes, "
        f"compression {profile[0][5][0].compression}; medians of {args.repeat}"
    )
    print(
        f"first push   naive {med['naive_first']:6.1f} s   ours {med['ours_first']:6.1f} s   "
        f"ratio {first_ratio:.2f}  (goal <= {GOALS['first']})  {'PASS' if first_ratio <= GOALS['first'] else 'MISS'}"
    )
    print(
        f"re-push      naive {med['naive_re']:6.1f} s   ours {med['ours_re']:6.1f} s   "
        f"ratio {re_ratio:.2f}  (goal <= {GOALS['repush']})  {'PASS' if re_ratio <= GOALS['repush'] else 'MISS'}; "
        f"sent {med['bytes_re'] / 1e6:.2f} MB per node = {re_bytes_ratio:.2f}x the changed layer, "
        f"{int(med['layers_re'])} layer (goal <= {GOALS['repush_bytes']}x)  "
        f"{'PASS' if re_bytes_ratio <= GOALS['repush_bytes'] else 'MISS'}"
    )
    print(
        f"present      ours {med['present']:.2f} s in-process, {cli_seconds:.2f} s as a CLI process  "
        f"(goal < {GOALS['present_s']} s)  {'PASS' if med['present'] < GOALS['present_s'] else 'MISS'}"
    )
    print()
    print("where the time of our first push goes (median run):")
    seconds, marks, busy, total, mine, res = sorted(profile, key=lambda p: p[0])[len(profile) // 2]
    print(
        f"  this machine's docker save alone: first byte after {save_first:.1f} s (the engine writes the whole "
        f"archive to a temp folder first), all {save_size / 1e9:.2f} GB read after {save_total:.1f} s"
    )
    for name, at in sorted(marks.items(), key=lambda kv: kv[1]):
        print(f"  {at:6.1f} s  {name}")
    print(f"  {seconds:6.1f} s  push returns")
    print(
        f"  CPU: the machine's {os.cpu_count()} cores were {100 * busy / max(total, 1e-9):.0f}% busy during the "
        f"push ({busy:.0f} cpu-s of {total:.0f}); this process and its compressor used {mine:.1f} cpu-s; the rest "
        f"is the engines (save here, load on the nodes), sshd, and other work on the machine"
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main())
