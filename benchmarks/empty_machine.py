#!/usr/bin/env python3
"""Remove what sparkdeploy made on this machine, and nothing else: a new machine's state as far as sparkdeploy is
concerned (benchmarks/fresh_clone_ci.py and `demo_time.py --from-empty` start from it).

Nothing is removed without --yes: without it, the list of what would go, and exit 2.

Removed:
- on the Docker engine, by sparkdeploy's labels: the containers, networks and volumes of every lab
  (io.sparkdeploy.lab=1, whatever the checkout that made it) and deployment containers (io.sparkdeploy.managed);
- sparkdeploy's images: each tag of its own repositories (sparkdeploy/NAME, sparkdeploy-incoming/...,
  sparkdeploy-test/...), and dangling images labelled io.sparkdeploy.image (an old ID after a rebuild, the last
  step of a failed build: steps inherit the label of their sparkdeploy base). The classic builder's cached steps
  go with the tagged image above them. An image someone else also tagged keeps that tag, and stays;
- the checkout's .venv, .venv-litellm and images/*/wheels (the wheels downloaded for image builds);
- the state folder ($SPARKDEPLOY_STATE, else ~/.local/state/sparkdeploy: lab keys, inventories, results), and the
  lab suite's second shard's beside it (its name with "-b").
Kept: every other container, image, network and volume; the build cache (sparkdeploy builds with the classic
builder, which keeps its steps as the images above and nothing in BuildKit's cache, so `docker builder prune`
would remove only other projects' caches); every package of the system interpreter; pip's download cache
(fresh_clone_ci.py empties it itself); the apt packages; and the Docker engine, never started or stopped here (it
must answer, or nothing is removed).

    python3 benchmarks/empty_machine.py [--repo PATH] [--only-label KEY=VALUE] --yes

--only-label also requires that label on every engine object (a test's own objects, or one lab's:
io.sparkdeploy.lab.name=NAME). Standard library only: it runs after the venv is gone.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from sparkdeploy.paths import state_dir  # noqa: E402  (standard library only)

# sparkdeploy's marks on what it creates. Defined with the code that sets them (sparkdeploy/lab/spec.py,
# deployment.py, images/definitions.py, images/push.py), which needs the venv; tests/test_empty_machine.py
# checks these copies against them.
LAB_LABEL = "io.sparkdeploy.lab"  # "1" on every container, network and volume of a lab
MANAGED_LABEL = "io.sparkdeploy.managed"  # "true" on the containers `up` starts
IMAGE_LABEL = "io.sparkdeploy.image"  # the definition's name, on every image sparkdeploy builds
OWN_REPOSITORY = re.compile(r"^sparkdeploy(-[a-z0-9-]+)?/")  # sparkdeploy/NAME, sparkdeploy-incoming/..., -test/
CHECKOUT_FOLDERS = (".venv", ".venv-litellm")  # scripts/setup.sh makes them
USAGE = "usage: python3 benchmarks/empty_machine.py [--repo PATH] [--only-label KEY=VALUE] --yes"
KINDS = ("container", "network", "volume", "image")


@dataclass
class EngineObject:
    kind: str  # container | network | volume | image
    id: str
    name: str  # an image: its first tag, or its short ID
    labels: dict[str, str] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)  # images only


@dataclass
class Selection:
    """What goes: objects by ID (images: only untagged ones), image tags to remove, and why some stay."""

    remove: dict[str, list[EngineObject]] = field(default_factory=lambda: {k: [] for k in KINDS})
    untag: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not self.untag and not any(self.remove.values())

    def lines(self) -> list[str]:
        out = [f"{kind} {o.name}" for kind in KINDS[:3] for o in self.remove[kind]]
        out += [f"image tag {tag}" for tag in self.untag]
        out += [
            f"image {o.id[:19]} (dangling, {IMAGE_LABEL}={o.labels.get(IMAGE_LABEL)})" for o in self.remove["image"]
        ]
        return out


def _ours(obj: EngineObject) -> bool:
    if obj.kind == "image":
        return False
    return obj.labels.get(LAB_LABEL) == "1" or (obj.kind == "container" and obj.labels.get(MANAGED_LABEL) == "true")


def select(objects: list[EngineObject], only: tuple[str, str] | None = None) -> Selection:
    """Pure: which of the engine's objects sparkdeploy made (see the module's docstring)."""
    chosen = Selection()
    for obj in objects:
        if only and obj.labels.get(only[0]) != only[1]:
            continue
        if obj.kind != "image":
            if _ours(obj):
                chosen.remove[obj.kind].append(obj)
            continue
        own = [t for t in obj.tags if OWN_REPOSITORY.match(t)]
        chosen.untag += own
        if not obj.tags and IMAGE_LABEL in obj.labels:
            chosen.remove["image"].append(obj)
        elif not own and IMAGE_LABEL in obj.labels:
            chosen.kept.append(f"image {', '.join(obj.tags)}: built from a sparkdeploy image, tagged by someone else")
        elif own and len(own) < len(obj.tags):
            chosen.kept.append(
                f"image {', '.join(t for t in obj.tags if t not in own)}: "
                f"also tagged {', '.join(own)} (that tag goes, the image stays)"
            )
    chosen.untag.sort()
    return chosen


# -- the engine ----------------------------------------------------------------------------------------------


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise SystemExit(f"empty_machine: docker {' '.join(args[:3])} failed: {result.stderr.strip()}")
    return result


def _inspect(kind: str, ids: list[str]) -> list[dict]:
    if not ids:
        return []
    # An object removed between the listing and here (someone else's) is simply not in the answer.
    result = docker(kind, "inspect", *ids, check=False)
    return json.loads(result.stdout or "[]")


def list_engine() -> list[EngineObject]:
    """Every container, network, volume and image of the engine, with its labels. Images: the tagged and the
    dangling ones; not the builder's cached steps below them (`docker rmi` of the image above takes those)."""
    objects = []
    for c in _inspect("container", docker("ps", "-aq", "--no-trunc").stdout.split()):
        objects.append(EngineObject("container", c["Id"], c["Name"].lstrip("/"), c["Config"].get("Labels") or {}))
    for n in _inspect("network", docker("network", "ls", "-q", "--no-trunc").stdout.split()):
        objects.append(EngineObject("network", n["Id"], n["Name"], n.get("Labels") or {}))
    for v in _inspect("volume", docker("volume", "ls", "-q").stdout.split()):
        objects.append(EngineObject("volume", v["Name"], v["Name"], v.get("Labels") or {}))
    ids = sorted(set(docker("images", "-q", "--no-trunc").stdout.split()))
    for i in _inspect("image", ids):
        tags = [t for t in i.get("RepoTags") or [] if not t.endswith(":<none>")]
        objects.append(
            EngineObject(
                "image", i["Id"], tags[0] if tags else i["Id"][:19], (i.get("Config") or {}).get("Labels") or {}, tags
            )
        )
    return objects


def engine_answers() -> str | None:
    """None when the engine can be listed; else why not (no client at all: nothing of ours can be there)."""
    if shutil.which("docker") is None:
        return "absent"
    if docker("info", "--format", "{{.ServerVersion}}", check=False).returncode != 0:
        return "stopped"
    return None


def remove(chosen: Selection, only: tuple[str, str] | None) -> list[str]:
    """Remove what was chosen (containers before their networks and images); return what could not go."""
    failed = []
    for kind in ("container", "network", "volume"):
        for obj in chosen.remove[kind]:
            flags = ["-f"] if kind in ("container", "volume") else []
            r = docker(kind, "rm", *flags, obj.id, check=False)
            if r.returncode != 0:
                failed.append(f"{kind} {obj.name}: {r.stderr.strip()}")
    for tag in chosen.untag:  # never -f: an image a foreign container uses stays, and is named
        r = docker("rmi", tag, check=False)
        if r.returncode != 0:
            failed.append(f"image tag {tag}: {r.stderr.strip()}")
    # Dangling ones, again until none can go: removing one can leave its parent dangling in turn.
    while True:
        left = select([o for o in list_engine() if o.kind == "image"], only).remove["image"]
        errors = {}
        for obj in left:
            r = docker("rmi", obj.id, check=False)
            if r.returncode != 0:
                errors[obj.id] = r.stderr.strip()
        if len(errors) == len(left):  # none left, or none of those left could go this round
            return failed + [f"image {i[:19]}: {e}" for i, e in errors.items()]


def remove_files(repo: Path, dry_run: bool) -> list[str]:
    folders = [repo / name for name in CHECKOUT_FOLDERS] + sorted((repo / "images").glob("*/wheels"))
    # and the lab suite's second shard's (tests/support/lab_shards.py: the state folder's name with "-b")
    folders += [state_dir(), state_dir().with_name(state_dir().name + "-b")]
    present = [f for f in folders if f.exists()]
    if not dry_run:
        for folder in present:
            shutil.rmtree(folder)
    return [f"folder {f}" for f in present]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--repo", type=Path, default=REPO, help="the checkout whose venvs and wheels go (default: this one)"
    )
    parser.add_argument("--only-label", metavar="KEY=VALUE", help="only engine objects that also carry this label")
    parser.add_argument("--yes", action="store_true", help="remove (without it: list what would go, exit 2)")
    args = parser.parse_args(argv)
    only = None
    if args.only_label:
        key, sep, value = args.only_label.partition("=")
        if not sep or not key:
            print(f"empty_machine: --only-label {args.only_label!r}: give KEY=VALUE", file=sys.stderr)
            return 2
        only = (key, value)
    repo = args.repo.resolve()
    if not (repo / "sparkdeploy" / "__init__.py").is_file():
        print(
            f"empty_machine: --repo {repo} is not a sparkdeploy checkout (no sparkdeploy/__init__.py)", file=sys.stderr
        )
        return 2
    why = engine_answers()
    if why == "stopped":
        print(
            "empty_machine: the Docker engine does not answer, so sparkdeploy's containers and images cannot be "
            "told apart: start it (bash .ci/start-docker.sh) and run this again; nothing was removed",
            file=sys.stderr,
        )
        return 1
    chosen = select(list_engine(), only) if why is None else Selection()
    verb = "removing" if args.yes else "would remove"
    listed = chosen.lines() + remove_files(repo, dry_run=True)
    for line in listed:
        print(f"{verb}: {line}")
    for line in chosen.kept:
        print(f"keeping: {line}")
    if not listed:
        print("empty_machine: nothing of sparkdeploy's here")
    if not args.yes:
        print(f"empty_machine: nothing removed; add --yes to remove the above ({USAGE})", file=sys.stderr)
        return 2
    failed = remove(chosen, only) if not chosen.empty() else []
    remove_files(repo, dry_run=False)
    for line in failed:
        print(f"empty_machine: could not remove {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
