#!/usr/bin/env python3
"""How long `lab up` takes, against its goals: < 60 s with the lab images built, < 10 min from nothing.

Runs on a lab of its own (name `labbench`, two free 172.30.X.0/24 subnets, a temporary state folder), so the
shared lab is not taken down.

- warm: `lab up` with the lab images already built (median of --runs), three ways: from `lab down` (empty
  inner engines: every engine image is loaded into every node), with the node containers removed but their
  volumes kept (what CI finds after an engine restart: images already inside), and on a running lab;
- cold: `lab up --rebuild`: debian-base (debootstrap) and lab-node rebuilt with no usable build cache, then
  the nodes created; building the engine images themselves (vllm-sim, ...) is not part of it (their own
  definitions; whatever of them exists on the host is loaded into the nodes in both cases);

Note: the cold run re-tags the lab images with new image IDs, so the next `lab up` of any other lab
recreates its node containers once (seconds; their volumes are kept).

    python benchmarks/lab_up.py [--runs 3] [--cold-runs 1] [--no-cold]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkdeploy.lab import LabSpec, down, up
from sparkdeploy.lab.spec import DEFAULT_IMAGES

WARM_GOAL_S = 60.0
COLD_GOAL_S = 600.0


def remove_containers(spec: LabSpec) -> None:
    """Leftovers as CI finds them: node containers gone or stopped, volumes (inner images) still there."""
    import docker

    for container in docker.from_env().containers.list(all=True, filters=spec.filters):
        container.remove(force=True)


def timed_up(spec: LabSpec, before=None, rebuild: bool = False) -> float:
    if before:
        before(spec)
    t0 = time.monotonic()
    result = up(spec, rebuild=rebuild)
    seconds = time.monotonic() - t0
    assert all(n.ssh and n.dockerd for n in result.nodes), "lab not healthy after up"
    print(f"  {seconds:6.1f} s  " + ", ".join(f"{k} {v:.1f}" for k, v in result.phases.items()), flush=True)
    return seconds


def report(what: str, samples: list[float], goal: float) -> str:
    median = statistics.median(samples)
    runs = ", ".join(f"{s:.1f}" for s in samples)
    return (
        f"{what:<34} median {median:7.1f} s  goal < {goal:.0f} s  ratio {median / goal:.2f}  "
        f"{'PASS' if median < goal else 'FAIL'}  (runs: {runs})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="warm runs (default 3)")
    parser.add_argument("--cold-runs", type=int, default=1, help="cold runs (default 1)")
    parser.add_argument("--no-cold", action="store_true", help="skip the from-nothing run")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--images", default=",".join(DEFAULT_IMAGES), help="engine images to preload")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sparkdeploy-labbench-") as state:
        import docker

        from sparkdeploy.lab.network import free_subnets

        down(LabSpec(name="labbench", state_dir=Path(state)))  # an interrupted earlier run
        mgmt, fabric = free_subnets(docker.from_env())
        spec = LabSpec(
            name="labbench",
            nodes=args.nodes,
            mgmt_subnet=mgmt,
            fabric_subnet=fabric,
            state_dir=Path(state),
            images=tuple(i for i in args.images.split(",") if i),
        )
        lines = []
        try:
            up(spec)  # builds the lab images if missing: not timed (that is the cold figure)
            fresh = [timed_up(spec, before=down) for _ in range(args.runs)]
            kept = [timed_up(spec, before=remove_containers) for _ in range(args.runs)]
            again = [timed_up(spec) for _ in range(args.runs)]
            lines += [
                report("lab up, empty nodes (after down)", fresh, WARM_GOAL_S),
                report("lab up, nodes' volumes kept", kept, WARM_GOAL_S),
                report("lab up again (lab running)", again, WARM_GOAL_S),
            ]
            if not args.no_cold:
                cold = [timed_up(spec, before=down, rebuild=True) for _ in range(args.cold_runs)]
                lines.append(report("lab up --rebuild (from nothing)", cold, COLD_GOAL_S))
        finally:
            down(spec)
    print(f"\nlab_up benchmark: {args.nodes} nodes, images: {args.images or 'none'}")
    for line in lines:
        print(line)
    return 0 if all("PASS" in line for line in lines) else 1


if __name__ == "__main__":
    raise SystemExit(main())
