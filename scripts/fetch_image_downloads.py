#!/usr/bin/env python3
"""Download the pinned files an image definition takes from its build context, and check their sha256.

Containers on the development and CI machines reach no PyPI or GitHub (only the Debian mirror, over plain HTTP),
so a definition whose build needs a file from the Internet gets it in its build context, downloaded here first,
the way wheels are (sparkdeploy/images/build.py downloads those itself). A definition names such a file with two
build args, `<NAME>_URL` and `<NAME>_SHA256`; this script puts each into `images/<definition>/downloads/` (git-
ignored) under the URL's file name, skips a file already there with the right sha256, and refuses (exit 1) a
download whose sha256 differs. The Dockerfile checks the sha256 again (`sha256sum -c`).

    python3 scripts/fetch_image_downloads.py llamacpp-cpu      # before building it (lab, CI)
    python3 scripts/fetch_image_downloads.py --check llamacpp-cpu   # exit 1 unless every file is there and right

Standard library and PyYAML only.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 1 << 20


def pinned_downloads(name: str, images: Path = ROOT / "images") -> list[tuple[str, str]]:
    """(url, sha256) for every `<NAME>_URL` build arg that has a `<NAME>_SHA256` beside it."""
    manifest = images / name / "manifest.yaml"
    if not manifest.is_file():
        raise SystemExit(f"{manifest}: no such image definition")
    args = (yaml.safe_load(manifest.read_text()) or {}).get("build_args") or {}
    out = []
    for key, url in sorted(args.items()):
        if key.endswith("_URL") and f"{key[:-4]}_SHA256" in args:
            out.append((str(url), str(args[f"{key[:-4]}_SHA256"])))
    return out


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def fetch(url: str, sha256: str, folder: Path) -> tuple[bool, str]:
    """Put `url` into `folder` under its file name unless a file with this sha256 is there: (ok, what happened)."""
    target = folder / url.rsplit("/", 1)[-1]
    if target.is_file() and sha256_of(target) == sha256:
        return True, f"{_shown(target)}: present, sha256 matches"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".part") as tmp:
        part = Path(tmp.name)
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                for block in iter(lambda: response.read(CHUNK), b""):
                    tmp.write(block)
        except OSError as exc:
            part.unlink(missing_ok=True)
            return False, f"{url}: download failed ({exc})"
    got = sha256_of(part)
    if got != sha256:
        part.unlink()
        return False, f"{url}: sha256 {got} is not the pinned {sha256}: refused"
    part.replace(target)
    return True, f"{_shown(target)}: downloaded, sha256 matches"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+", metavar="DEFINITION", help="image definitions under images/")
    ap.add_argument("--check", action="store_true", help="download nothing: exit 1 unless every file is present")
    args = ap.parse_args(argv)
    failed = 0
    for name in args.names:
        pins = pinned_downloads(name)
        if not pins:
            print(f"{name}: no <NAME>_URL/<NAME>_SHA256 build args: nothing to fetch")
        folder = ROOT / "images" / name / "downloads"
        for url, sha256 in pins:
            if args.check:
                target = folder / url.rsplit("/", 1)[-1]
                ok = target.is_file() and sha256_of(target) == sha256
                why = f"{_shown(target)}: " + ("present, sha256 matches" if ok else "missing or wrong")
            else:
                ok, why = fetch(url, sha256, folder)
            failed += not ok
            print(("ok      " if ok else "FAIL    ") + why)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
