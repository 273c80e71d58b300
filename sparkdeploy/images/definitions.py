"""Image definitions: `images/<name>/manifest.yaml` plus a build context.

The tag of an image is a content hash of its definition (every file of the build context, the included
folders, the requirements, the build args and the tag of its base), so the same inputs always give the same
tag and any change gives a new one. Downloaded wheels are not hashed: the pinned requirements file is.
"""

from __future__ import annotations

import hashlib
from difflib import get_close_matches
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sparkdeploy import paths
from sparkdeploy.config.schema import problems_from_validation
from sparkdeploy.config.userfile import load_yaml_file
from sparkdeploy.errors import ConfigError, Problem

TAG_REPO = "sparkdeploy"
PACKAGE_PREFIX = "sparkdeploy/"  # an `include` starting with it is a folder of the package (images/guard)
PACKAGE_DIR = Path(__file__).resolve().parents[1]
LABEL = "io.sparkdeploy.image"
# Never part of the hash nor of the build context we send: downloaded or generated material.
# sources.yaml is evidence about the build's inputs (docs/images.md), not an input: it never changes a tag.
IGNORED_NAMES = {"wheels", "__pycache__", ".pytest_cache", "rootfs.tar", "sources.yaml"}


class BuildNeeds(BaseModel):
    """What building the image on a node takes: shown by `images build --dry-run`, checked before a build."""

    model_config = ConfigDict(extra="forbid")

    arch: str | None = None  # `uname -m` the build must run on (aarch64: compiling CUDA under emulation is hopeless)
    disk_gb: float = 0  # free space the engine's data root needs, in GB
    duration: str = ""  # expected wall time, as measured or estimated (the text says which)
    internet: list[str] = Field(default_factory=list)  # URLs the build fetches from; each must answer first


class ImageDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    kind: Literal["dockerfile", "rootfs"] = "dockerfile"
    platform: str = "linux/amd64"
    base: str | None = None
    vllm_version: str | None = None
    extra_flags: list[str] = Field(default_factory=list)
    stands_in_for: list[str] = Field(default_factory=list)
    requirements: str | None = None
    include: list[str] = Field(default_factory=list)
    launchers: dict[str, str] = Field(default_factory=dict)
    patches: list[str] = Field(default_factory=list)
    build_args: dict[str, str] = Field(default_factory=dict)
    compilation_defaults: dict[str, Any] = Field(default_factory=dict)
    build_needs: BuildNeeds | None = None
    simulated: bool = False
    # rootfs definitions (debootstrap): suite, variant, extra packages
    rootfs: dict[str, Any] = Field(default_factory=dict)

    # set by the loader
    directory: Path | None = Field(default=None, exclude=True)

    @property
    def repo(self) -> str:
        return f"{TAG_REPO}/{self.name}"

    def base_definition(self) -> ImageDefinition | None:
        """The base when it is one of ours, else None (an external reference such as nvcr.io/...)."""
        if self.base and "/" not in self.base and ":" not in self.base:
            return load_definition(self.base)
        return None

    def _include_root(self, inc: str) -> Path:
        """An included folder: relative to the definition, or `sparkdeploy/...`: inside the installed package (the
        same files in a checkout and in a wheel, where images/ is sparkdeploy/data/images)."""
        assert self.directory is not None
        if inc.startswith(PACKAGE_PREFIX):
            return (PACKAGE_DIR / inc.removeprefix(PACKAGE_PREFIX)).resolve()
        return (self.directory / inc).resolve()

    def context_files(self) -> list[tuple[str, Path]]:
        """(name in the build context, path on disk) for every file that goes into the build."""
        assert self.directory is not None
        files: list[tuple[str, Path]] = []
        roots = [(".", self.directory)] + [(Path(inc).name, self._include_root(inc)) for inc in self.include]
        for prefix, root in roots:
            if not root.is_dir():
                raise ConfigError(
                    Problem(str(self.directory / "manifest.yaml"), "include", f"{root} is not a folder", "fix the path")
                )
            for path in sorted(root.rglob("*")):
                rel = path.relative_to(root)
                if path.is_dir() or any(part in IGNORED_NAMES or part.endswith(".pyc") for part in rel.parts):
                    continue
                files.append(((Path(prefix) / rel).as_posix(), path))
        return files

    def content_hash(self) -> str:
        digest = hashlib.sha256()
        for name, path in self.context_files():
            digest.update(name.encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        for key in sorted(self.build_args):
            digest.update(f"arg:{key}={self.build_args[key]}\0".encode())
        digest.update(f"platform:{self.platform}\0".encode())
        base = self.base_definition()
        digest.update(f"base:{base.tag if base else self.base}\0".encode())
        return digest.hexdigest()

    @property
    def tag(self) -> str:
        return f"{self.repo}:{self.content_hash()[:12]}"


def definition_names() -> list[str]:
    root = paths.images_dir()
    if not root.is_dir():
        return []
    return sorted(p.parent.name for p in root.glob("*/manifest.yaml"))


@cache
def _load(directory: Path) -> ImageDefinition:
    manifest = directory / "manifest.yaml"
    data = load_yaml_file(manifest, "image definition") or {}
    try:
        definition = ImageDefinition.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, str(manifest), ImageDefinition)) from None
    if definition.name != directory.name:
        raise ConfigError(
            Problem(
                str(manifest),
                "name",
                f"{definition.name!r} differs from the folder name {directory.name!r}",
                f"set name: {directory.name}",
            )
        )
    definition.directory = directory
    return definition


def load_definition(name: str) -> ImageDefinition:
    directory = paths.images_dir() / name
    if not (directory / "manifest.yaml").is_file():
        known = definition_names()
        close = get_close_matches(name, known, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(known) or 'none'}"
        raise ConfigError(Problem("images/", name, "no such image definition", hint))
    return _load(directory.resolve())


def clear_cache() -> None:
    _load.cache_clear()
