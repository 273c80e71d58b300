"""images/<name>/sources.yaml: every external reference of a definition, with the evidence that it exists.

A definition names its sources in several places: the manifest's `base`, `build_args`, `requirements` and
`rootfs`, and the Dockerfile's `ARG` defaults, literal URLs, `FROM` lines and `apt-get install`. `problems()`
finds each of them and reports any that sources.yaml does not record, or records with a ref that no longer
contains the value the definition uses (a bumped commit without new evidence), or records without evidence.
A build arg that is a choice rather than a source (TORCH_CUDA_ARCH_LIST, MAX_JOBS) is listed under
`settings`. The file is evidence, not a build input: it is not in the build context and never changes a tag.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from sparkdeploy.config.userfile import load_yaml_file, read_text
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.images.definitions import ImageDefinition

REQUIRED = ("kind", "ref", "checked", "how", "evidence")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
ARG_LINE = re.compile(r"ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(.*))?")
FROM_LINE = re.compile(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", re.I)
URL = re.compile(r"https?://[^\s\"'\\);]+")


def load(definition: ImageDefinition) -> dict[str, Any]:
    path = definition.directory / "sources.yaml" if definition.directory else None
    if path is None or not path.is_file():
        return {}
    data = load_yaml_file(path, "sources file") or {}
    if not isinstance(data, dict):
        raise ConfigError(Problem(str(path), "", "not a mapping", "write `sources:` with a list"))
    return data


def load_sources(definition: ImageDefinition) -> list[dict[str, Any]]:
    return list(load(definition).get("sources") or [])


def _dockerfile_lines(definition: ImageDefinition) -> list[str]:
    path = definition.directory / "Dockerfile" if definition.directory else None
    if path is None or not path.is_file():
        return []
    text = re.sub(r"\\\n", " ", read_text(path, "Dockerfile"))  # continuation lines joined, so one RUN is one line
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def problems(definition: ImageDefinition) -> list[str]:
    """One line per unrecorded or stale source: `images/<name>/sources.yaml: ...`."""
    where = f"images/{definition.name}/sources.yaml"
    data = load(definition)
    if not data:
        return [f"{where}: missing: record every external reference of {definition.name} (docs/images.md)"]
    sources: Sources = list(data.get("sources") or [])
    settings = set(data.get("settings") or [])
    covered = {a for s in sources for a in (s.get("args") or [])} | settings
    base_external = bool(definition.base) and definition.base_definition() is None
    out = _entry_problems(where, sources)
    out += _foundation_problems(where, definition, sources, base_external)
    out += _build_arg_problems(where, definition, sources, covered, base_external)
    out += _dockerfile_problems(where, definition, sources, covered, base_external)
    return sorted(set(out), key=out.index)


Sources = list[dict[str, Any]]  # sources.yaml's entries, as YAML read them


def _entry_problems(where: str, sources: Sources) -> list[str]:
    """Each entry says what was checked, when (a date) and how."""
    out: list[str] = []
    for i, s in enumerate(sources):
        for key in REQUIRED:
            if not str(s.get(key) or "").strip():
                out.append(f"{where}: sources[{i}] has no {key}: say what was checked, when and how")
        if s.get("checked") and not DATE.fullmatch(str(s["checked"])):
            out.append(f"{where}: sources[{i}].checked {s['checked']!r} is not a date (YYYY-MM-DD)")
    return out


def _foundation_problems(where: str, definition: ImageDefinition, sources: Sources, base_external: bool) -> list[str]:
    """What the image stands on is recorded: an external base image, the Debian mirror of a rootfs, the pip
    lock (with its current sha256)."""
    out: list[str] = []
    refs = [str(s.get("ref", "")) for s in sources]
    if base_external and not any(s.get("kind") == "base-image" and s.get("ref") == definition.base for s in sources):
        out.append(f"{where}: base {definition.base} is not recorded (kind: base-image, ref: {definition.base})")
    if definition.kind == "rootfs":
        mirror, suite = definition.rootfs.get("mirror", ""), definition.rootfs.get("suite", "")
        if not any(mirror in r and suite in r for r in refs):
            out.append(f"{where}: the Debian mirror {mirror} {suite} is not recorded")
    if definition.requirements:
        assert definition.directory is not None, "a loaded definition has its folder"
        path = definition.directory / definition.requirements
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
        lock = [s for s in sources if s.get("kind") == "pypi-lock" and s.get("file") == definition.requirements]
        if not lock:
            out.append(f"{where}: {definition.requirements} is not recorded (kind: pypi-lock)")
        elif lock[0].get("sha256") != digest:
            out.append(
                f"{where}: {definition.requirements} changed (sha256 {digest[:12]}...): check the new pins "
                "and record its sha256"
            )
    return out


def _build_arg_problems(
    where: str, definition: ImageDefinition, sources: Sources, covered: set[str], base_external: bool
) -> list[str]:
    """Every build arg is recorded, and a source naming an arg contains its current value."""
    out: list[str] = []
    values = dict(definition.build_args)
    if definition.base:
        base = definition.base_definition()
        values["BASE"] = base.tag if base is not None else definition.base
    for s in sources:
        for arg in s.get("args") or []:
            if arg == "BASE" and not base_external:
                continue
            if arg in values and values[arg] not in str(s.get("ref", "")):
                out.append(
                    f"{where}: {s.get('ref')} does not contain build arg {arg}={values[arg]}: "
                    "check the new value and record it"
                )
    for key in definition.build_args:
        if key not in covered:
            out.append(
                f"{where}: build arg {key}={definition.build_args[key]} is not recorded (a source's args, "
                "or settings if it is a choice)"
            )
    return out


def _dockerfile_problems(
    where: str, definition: ImageDefinition, sources: Sources, covered: set[str], base_external: bool
) -> list[str]:
    """The Dockerfile's ARG defaults agree with the manifest; its FROM images, URLs and apt installs are
    recorded."""
    out: list[str] = []
    refs = [str(s.get("ref", "")) for s in sources]

    def recorded(value: str) -> bool:
        return any(value in ref for ref in refs)

    stages: set[str] = set()
    for line in _dockerfile_lines(definition):
        m = ARG_LINE.fullmatch(line)
        if m:
            out += _arg_line_problems(
                where, definition, m.group(1), (m.group(2) or "").strip().strip('"'), covered, base_external
            )
            continue
        m = FROM_LINE.match(line)
        if m:
            image = m.group(1)
            if m.group(2):
                stages.add(m.group(2))
            if "$" not in image and image not in stages and not recorded(image):
                out.append(f"{where}: Dockerfile FROM {image} is not recorded (kind: base-image)")
            continue
        for url in URL.findall(line):
            if "$" not in url and not recorded(url):
                out.append(f"{where}: Dockerfile fetches {url}, which is not recorded (kind: url, with its sha256)")
        if re.search(r"\bapt-get\s+install\b", line) and not any(s.get("apt") for s in sources):
            out.append(f"{where}: the Dockerfile installs apt packages; record their source (kind: debian, apt: true)")
    return out


def _arg_line_problems(
    where: str, definition: ImageDefinition, name: str, default: str, covered: set[str], base_external: bool
) -> list[str]:
    """One Dockerfile `ARG name=default` against the manifest."""
    if not default:
        return []
    if name == "BASE":
        if base_external and default != definition.base:
            return [f"{where}: Dockerfile ARG BASE={default} differs from the manifest's base {definition.base}"]
        return []
    out: list[str] = []
    if name in definition.build_args and definition.build_args[name] != default:
        out.append(
            f"{where}: Dockerfile ARG {name}={default} differs from the manifest's "
            f"build_args {name}={definition.build_args[name]}"
        )
    if name not in covered:
        out.append(f"{where}: Dockerfile ARG {name}={default} is not recorded")
    return out
