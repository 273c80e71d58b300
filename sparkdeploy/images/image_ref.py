"""A registry image reference, parsed in one place: `[host[:port]/]repo[:tag][@sha256:<64 hex>]`.

Light (no connection, nothing heavy imported): the recipe validator parses with it on every load, and the
deploy pipeline reads here what the local state keeps about a registry image (its digest, image ID, vLLM
version and the CLI read from it: `RegistryImage`). Pulling, the digest check and the node-to-node spread are
sparkdeploy/images/registry_pull.py.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

from sparkdeploy import paths
from sparkdeploy.config.userfile import load_json_file
from sparkdeploy.errors import ConfigError, Invalid, Problem
from sparkdeploy.images.definitions import ImageDefinition

STATE_FOLDER = "registry-images"  # under the local state: <digest hex>.json per image, refs.json

# Docker's reference grammar (distribution/reference), the parts a pull needs.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|\[[0-9A-Fa-f:]+\]|[A-Za-z0-9-]+)(?::[0-9]{1,5})?"
REFERENCE = re.compile(
    rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
)
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def is_reference(text: str) -> bool:
    """A registry reference has a '/', ':' or '@'; an image definition name has none of them."""
    return any(c in text for c in "/:@")


@dataclass(frozen=True)
class RegistryRef:
    text: str
    domain: str | None
    path: str
    tag: str | None
    digest: str | None

    @property
    def repository(self) -> str:
        return f"{self.domain}/{self.path}" if self.domain else self.path

    @property
    def registry(self) -> str:
        """Where it is pulled from (Docker Hub when the reference names no host)."""
        return self.domain or "docker.io"

    @property
    def pull_ref(self) -> str:
        """What `docker pull` gets: by digest when one is pinned (the engine then checks the content)."""
        return f"{self.repository}@{self.digest}" if self.digest else f"{self.repository}:{self.tag or 'latest'}"

    @property
    def local_tag(self) -> str:
        """The tag the nodes run it by (containers, plan, push): repo:tag, or repo:sha256-<12> for a digest only."""
        if self.tag:
            return f"{self.repository}:{self.tag}"
        if self.digest:
            return f"{self.repository}:sha256-{self.digest[7:19]}"
        return f"{self.repository}:latest"

    def pinned(self, digest: str) -> str:
        """The reference with this digest pinned (what a warning tells the owner to write)."""
        return f"{self.repository}:{self.tag or 'latest'}@{digest}"


def parse_reference(text: str, source: str = "recipe", fld: str = "image") -> RegistryRef:
    """`[host[:port]/]repo[:tag][@sha256:...]` -> its parts; anything else is one Problem (exit 2)."""
    m = REFERENCE.fullmatch(text) if len(text) <= 512 else None
    if not m:
        raise ConfigError(
            Problem(
                source,
                fld,
                f"{text[:80]!r} is not a registry reference",
                "write HOST[:PORT]/REPO[:TAG][@sha256:<64 hex>] (lower-case repository), e.g. "
                "nvcr.io/nvidia/vllm:26.01-py3@sha256:..., or the name of an image definition under images/",
            )
        )
    return RegistryRef(text, m["domain"], m["path"], m["tag"], m["digest"])


def reference_error(text: str) -> Invalid | None:
    """For the recipe validator: None when `text` is a valid reference, else what is wrong and its fix."""
    try:
        parse_reference(text)
    except ConfigError as exc:
        p = exc.problems[0]
        return Invalid(p.message, p.fix)
    return None


# -- what the local state keeps about a registry image -------------------------------------------------------


def _folder() -> Path:
    return paths.state_folder(STATE_FOLDER)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    if not path.exists():
        return None
    try:
        return load_json_file(path, "registry image record")
    except ConfigError:  # a local state file, through the one door: unreadable is unknown
        return None


def known_digest(ref: RegistryRef) -> str | None:
    """The pinned digest, else the one this reference resolved to at its last pull (refs.json)."""
    if ref.digest:
        return ref.digest
    folder = paths.state_dir() / STATE_FOLDER
    refs = _read_json(folder / "refs.json") or {}
    value = refs.get(ref.text) if isinstance(refs, dict) else None
    return value if isinstance(value, str) and DIGEST.fullmatch(value) else None


def record(digest: str) -> dict[str, Any] | None:
    """What was read from the image with this digest: image_id, vllm_version, simulated, cli (flag list)."""
    data = _read_json(paths.state_dir() / STATE_FOLDER / f"{digest[7:]}.json")
    return data if isinstance(data, dict) else None


def save(ref: RegistryRef, digest: str, data: dict[str, Any]) -> None:
    folder = _folder()
    _write_json(folder / f"{digest[7:]}.json", data)
    if not ref.digest:
        refs = _read_json(folder / "refs.json")
        refs = refs if isinstance(refs, dict) else {}
        refs[ref.text] = digest
        _write_json(folder / "refs.json", refs)


# -- the image as the deploy pipeline sees it ---------------------------------------------------------------


class RegistryImage(ImageDefinition):
    """A registry image in the place of an image definition: its tag on the nodes is the reference's local tag,
    its CLI the one read from the image (None until it was pulled once: flags are then checked after the pull)."""

    reference: str = ""
    digest: str | None = None
    local: str = ""
    cli: dict[str, Any] | None = Field(default=None, exclude=True)

    @property
    def tag(self) -> str:
        return self.local

    @property
    def repo(self) -> str:
        return self.local.rsplit(":", 1)[0]

    def base_definition(self) -> ImageDefinition | None:
        return None

    def content_hash(self) -> str:
        return (self.digest or "")[7:]


def registry_image(text: str, source: str = "recipe") -> RegistryImage:
    ref = parse_reference(text, source)
    digest = known_digest(ref)
    rec = record(digest) if digest else None
    return RegistryImage(
        name=text,
        description=f"registry image {text}",
        vllm_version=(rec or {}).get("vllm_version") or None,
        simulated=bool((rec or {}).get("simulated")),
        reference=text,
        digest=digest,
        local=ref.local_tag,
        cli=(rec or {}).get("cli"),
    )
