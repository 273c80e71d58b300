"""CI's lab suite as two pytest processes at once, each on a lab of its own (scripts/test.sh; docs/benchmarks.md,
"CI's time").

The lab suite mostly waits (nodes, engines, SSH), so two halves of it run side by side on a 2-core machine in
little more than half its time. The modules are split by their seconds (tests/support/lab_module_seconds.json, the
per-module figures tests/support/module_times.py prints and writes with SPARKDEPLOY_MODULE_TIMES=PATH): the
slowest first, each to the shard with fewer seconds so far. The heavier shard runs its modules by name; the lighter
runs every other lab module (`--ignore` of the heavier's), so a module not in the figures, a new one, goes to the
lighter shard and none is run twice or left out.

Shard 1 runs in the caller's environment (CI: the default lab `lab` on 172.30.77/78, its four-node lab on 79/80).
Shard 2 gets a lab of its own, derived from the first's: instance `<instance>-b` (or `b`), subnets four /24s
further (CI: 81/82, its four-node lab on 83/84), state folder `<state>-b`. The throw-away labs some modules bring
up pick free subnets from disjoint ranges (SPARKDEPLOY_LAB_SIDE_OCTETS), so the two never pick the same one.

    python3 -m tests.support.lab_shards run INDEX COUNT [PYTEST ARGS...]   # runs shard INDEX (1-based) of COUNT
    python3 -m tests.support.lab_shards show [COUNT]                      # prints the split and its seconds
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkdeploy import paths
from sparkdeploy.lab.spec import (
    DEFAULT_FABRIC_SUBNET,
    DEFAULT_MGMT_SUBNET,
    INSTANCE_ENV,
    SIDE_OCTETS_ENV,
    SIDE_OCTETS_FIRST,
    SIDE_OCTETS_LAST,
    SUBNETS_ENV,
)

REPO = Path(__file__).resolve().parents[2]
FIGURES = Path(__file__).with_name("lab_module_seconds.json")
STATE_ENV = "SPARKDEPLOY_STATE"
SUFFIXES = ("", "b")  # shard 1 keeps the caller's lab; shard 2's instance and state folder end in -b
SUBNET_SHIFT = 4  # /24s between shard 1's default lab and shard 2's: shard 1's four-node lab takes the two between


@dataclass(frozen=True)
class Shard:
    modules: list[str]  # by name; the lighter shard's list is what it knows of, it runs them and every other one
    seconds: float  # the figures' seconds of its listed modules
    rest: bool  # True: runs every lab module not in the other shards (a new module lands here)


def load_figures(path: Path = FIGURES) -> dict[str, float]:
    """module -> seconds, of the modules that still exist (a removed module's figure is dropped)."""
    data = json.loads(path.read_text())
    return {m: float(s) for m, s in data["modules"].items() if (REPO / m).is_file()}


def split(seconds: Mapping[str, float], count: int = 2) -> list[Shard]:
    """Modules to `count` shards by their seconds: slowest first (ties by name), each to the shard with the fewest
    seconds so far (the first of equals). Deterministic. The lightest shard is the one that runs the rest."""
    if count < 1:
        raise ValueError(f"{count} shards: at least 1")
    bins: list[list[str]] = [[] for _ in range(count)]
    totals = [0.0] * count
    for module, secs in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0])):
        i = min(range(count), key=lambda k: (totals[k], k))
        bins[i].append(module)
        totals[i] += secs
    lightest = min(range(count), key=lambda k: (totals[k], k))
    return [Shard(sorted(bins[i]), round(totals[i], 1), i == lightest) for i in range(count)]


def pytest_args(shards: list[Shard], index: int) -> list[str]:
    """The paths/--ignore arguments for shard `index` (0-based): its modules, or, for the shard that runs the
    rest, the whole suite less every other shard's modules."""
    shard = shards[index]
    if not shard.rest:
        return list(shard.modules)
    others = sorted(m for k, s in enumerate(shards) if k != index for m in s.modules)
    return ["tests", *(f"--ignore={m}" for m in others)]


def _shifted(subnet: str, by: int) -> str:
    net = ipaddress.IPv4Network(subnet)
    return str(ipaddress.IPv4Network((int(net.network_address) + by * net.num_addresses, net.prefixlen)))


def side_octets(index: int, count: int) -> str:
    """Shard `index`'s part of the throw-away labs' subnet range (FIRST-LAST of 172.30.X.0/24)."""
    span = SIDE_OCTETS_LAST - SIDE_OCTETS_FIRST + 1
    first = SIDE_OCTETS_FIRST + index * span // count
    last = SIDE_OCTETS_FIRST + (index + 1) * span // count - 1
    return f"{first}-{last}"


def shard_env(index: int, count: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of shard `index` (0-based) of `count`, derived from the caller's (`environ`)."""
    env = dict(environ)
    if count > 1:
        env[SIDE_OCTETS_ENV] = side_octets(index, count)
    if index == 0:
        return env
    suffix = SUFFIXES[index] if index < len(SUFFIXES) else f"s{index + 1}"
    instance = environ.get(INSTANCE_ENV, "")
    env[INSTANCE_ENV] = f"{instance}-{suffix}" if instance else suffix
    parts = [p.strip() for p in environ.get(SUBNETS_ENV, "").split(",")]
    mgmt, fabric = parts if len(parts) == 2 and all(parts) else (DEFAULT_MGMT_SUBNET, DEFAULT_FABRIC_SUBNET)
    by = index * SUBNET_SHIFT
    env[SUBNETS_ENV] = f"{_shifted(mgmt, by)},{_shifted(fabric, by)}"
    state = environ.get(STATE_ENV) or str(paths.state_dir())
    env[STATE_ENV] = f"{state.rstrip('/')}-{suffix}"
    return env


def run(index: int, count: int, extra: list[str]) -> int:
    """exec pytest for shard `index` (1-based) of `count`, in its environment; returns only on a bad index."""
    if not 1 <= index <= count:
        print(f"lab_shards: shard {index} of {count}: choose 1 to {count}", file=sys.stderr)
        return 2
    shards = split(load_figures(), count)
    where = pytest_args(shards, index - 1) if count > 1 else []
    env = shard_env(index - 1, count, os.environ)
    argv = [sys.executable, "-m", "pytest", "-q", "-m", "lab", *extra, *where]
    if count > 1:
        lab = env.get(INSTANCE_ENV) or "(default)"
        print(
            f"lab shard {index}/{count}: {len(shards[index - 1].modules)} modules"
            f"{' and any not in the figures' if shards[index - 1].rest else ''}, {shards[index - 1].seconds:.0f} s"
            f" by the figures; instance {lab}, subnets {env.get(SUBNETS_ENV) or 'default'}",
            flush=True,
        )
    os.chdir(REPO)
    os.execve(sys.executable, argv, env)


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"] and len(argv) >= 3 and argv[1].isdigit() and argv[2].isdigit():
        return run(int(argv[1]), int(argv[2]), argv[3:])
    if argv[:1] == ["show"] and (len(argv) == 1 or (len(argv) == 2 and argv[1].isdigit())):
        shards = split(load_figures(), int(argv[1]) if len(argv) == 2 else 2)
        for i, shard in enumerate(shards, 1):
            rest = " (+ modules not in the figures)" if shard.rest else ""
            print(f"shard {i}: {shard.seconds:.0f} s, {len(shard.modules)} modules{rest}")
            for module in shard.modules:
                print(f"  {module}")
        return 0
    print("usage: python3 -m tests.support.lab_shards run INDEX COUNT [PYTEST ARGS...] | show [COUNT]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
