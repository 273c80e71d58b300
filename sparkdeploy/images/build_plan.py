"""What `images build NAME --on NODE` will do, and whether the node can do it, before an hour is spent.

The plan (printed by `--dry-run`) comes from the definition alone: its base, the sources it pins with the
evidence sources.yaml records for each, the expected duration and disk, the hosts it fetches from, and
where the result goes next. The checks run on the node before the build starts, each on its own line:
its architecture against the one the definition must be built on, the free space of its Docker data root,
and an answer from every host the build fetches from. All three are cheap; any failure stops the build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkdeploy.images.definitions import ImageDefinition, load_definition
from sparkdeploy.images.sources import load_sources
from sparkdeploy.nodeside import ship

if TYPE_CHECKING:
    from sparkdeploy.runtime.remote import NodeConnection

ARCH_OF_PLATFORM = {"linux/arm64": "aarch64", "linux/amd64": "x86_64"}


@dataclass(frozen=True)
class Source:
    kind: str
    ref: str
    evidence: str


@dataclass
class BuildPlan:
    name: str
    tag: str
    node: str
    platform: str
    arch: str
    base: str
    base_note: str
    sources: list[Source] = field(default_factory=list)
    duration: str = ""
    disk_gb: float = 0
    internet: list[str] = field(default_factory=list)
    then: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            f"DRY RUN: nothing is built. Plan for image {self.name} on {self.node}:",
            f"  tag       {self.tag}",
            f"  platform  {self.platform} (the node must be {self.arch})",
            f"  base      {self.base} ({self.base_note})",
        ]
        for s in self.sources:
            out.append(f"  source    {s.kind}: {s.ref}")
            if s.evidence:
                out.append(f"            checked: {s.evidence}")
        out += [
            f"  duration  {self.duration or 'not recorded'}",
            f"  disk      {self.disk_gb:g} GB free in the node's Docker data root"
            if self.disk_gb
            else "  disk      not recorded",
            "  internet  " + (", ".join(self.internet) if self.internet else "none (the context carries all)"),
            "  checks    before it starts: the node's architecture, free disk, an answer from each host",
            "  progress  streamed per build step; a failed build resumes from the last finished step",
            "  then      " + self.then[0],
        ]
        out += [f"            {t}" for t in self.then[1:]]
        return out


def build_plan(name: str, node: str) -> BuildPlan:
    d = load_definition(name)
    needs = d.build_needs
    base_def = d.base_definition()
    if base_def is not None:
        base, note = base_def.tag, f"definition {base_def.name}: pushed to {node} first if missing"
    elif d.base:
        base, note = d.base, f"pulled by {node}'s engine from its registry"
    else:
        base, note = "none", "a root filesystem"
    sources = [
        Source(s.get("kind", "?"), str(s.get("ref", "?")), f"{s.get('checked', '?')}, {s.get('how', '')}".rstrip(", "))
        for s in load_sources(d)
    ]
    others = "the other nodes"
    return BuildPlan(
        name=name,
        tag=d.tag,
        node=node,
        platform=d.platform,
        arch=(needs.arch if needs and needs.arch else ARCH_OF_PLATFORM.get(d.platform, "?")),
        base=base,
        base_note=note,
        sources=sources,
        duration=needs.duration if needs else "",
        disk_gb=needs.disk_gb if needs else 0,
        internet=list(needs.internet) if needs else [],
        then=[
            f"tag {d.tag} in {node}'s engine (label io.sparkdeploy.image={name})",
            f"sparkdeploy images push {name} --from {node}   # to {others}, only the layers each lacks",
            "sparkdeploy doctor; sparkdeploy run-recipe <recipe naming this image>",
        ],
    )


# -- checks on the node ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildCheck:
    what: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.what}: {self.detail}"


def node_checks(definition: ImageDefinition, conn: NodeConnection) -> list[BuildCheck]:
    """Architecture, free disk of the Docker data root, and an answer from each host the build fetches from."""
    needs = definition.build_needs
    want_arch = needs.arch if needs and needs.arch else ARCH_OF_PLATFORM.get(definition.platform)
    checks: list[BuildCheck] = []
    arch = conn.run(["uname", "-m"], check=False).stdout.strip()
    if want_arch:
        checks.append(
            BuildCheck(
                "architecture",
                arch == want_arch,
                f"{arch or 'unknown'}"
                + (
                    ""
                    if arch == want_arch
                    else f", but {definition.name} must be built on {want_arch} "
                    f"({definition.platform}): build it on a node that is"
                ),
            )
        )
    disk_gb = needs.disk_gb if needs else 0
    if disk_gb:
        root = conn.run(["docker", "info", "--format", "{{.DockerRootDir}}"], check=False).stdout.strip()
        df = conn.run(["df", "-Pk", root or "/"], check=False).stdout.strip().splitlines()
        try:
            free_gb = int(df[-1].split()[3]) * 1024 / 1e9
        except (IndexError, ValueError):
            free_gb = -1.0
        checks.append(
            BuildCheck(
                "free disk",
                free_gb >= disk_gb,
                f"{free_gb:.0f} GB free in {root or '/'}, {disk_gb:g} GB needed"
                + ("" if free_gb >= disk_gb else ": free space (docker system df; docker builder prune)"),
            )
        )
    for url in needs.internet if needs else []:
        probe = conn.run(ship.argv("reach", url), check=False, timeout=30)  # nodeside/reach.py: any HTTP answer
        why = (probe.stdout or probe.stderr).strip().splitlines()
        checks.append(
            BuildCheck(
                f"internet {url}",
                probe.ok,
                "answers" if probe.ok else f"no answer ({why[-1] if why else f'exit {probe.exit_code}'})",
            )
        )
    return checks
