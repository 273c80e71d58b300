#!/usr/bin/env python3
"""Re-check the PyPI evidence of images/*/sources.yaml from this machine (it reaches PyPI, nothing else).

For every `kind: pypi` source, `pip download --no-deps` of exactly that version, for the image's platform
(aarch64, CPython 3.12 for the GPU images) and compares the wheel's sha256 with the one the evidence records;
for every `kind: url` source on files.pythonhosted.org, downloads it and compares its sha256. Prints one line
per source, exit 1 if any fails. Sources it cannot reach from here (GitHub, NGC, other hosts) are listed as
`skipped` with the reason; their evidence is the search-tool record in docs/images.md.

    python3 scripts/check_sources.py [IMAGE...]
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ARM64 = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--platform",
    "manylinux_2_28_aarch64",
    "--platform",
    "manylinux_2_26_aarch64",
    "--platform",
    "manylinux_2_24_aarch64",
    "--platform",
    "manylinux2014_aarch64",
    "--platform",
    "manylinux_2_17_aarch64",
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_pypi(ref: str, evidence: str, arm64: bool) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, *(ARM64 if arm64 else []), ref]
        r = subprocess.run(argv, capture_output=True, text=True)
        files = list(Path(tmp).iterdir())
        if r.returncode != 0 or not files:
            return False, (r.stderr.strip().splitlines() or ["pip download failed"])[-1]
        got = sha256(files[0])
        recorded = re.findall(r"\b[0-9a-f]{64}\b", evidence)
        if recorded and got not in recorded:
            return False, f"{files[0].name} sha256 {got} is not the recorded {recorded[0]}"
        return True, f"{files[0].name} sha256 {got[:12]}..." + (" (as recorded)" if recorded else "")


def check_url(ref: str) -> tuple[bool | None, str]:
    url, _, frag = ref.partition("#sha256=")
    if "files.pythonhosted.org" not in url:
        return None, "not reachable from here (only PyPI is)"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f"
        urllib.request.urlretrieve(url, path)
        got = sha256(path)
        return got == frag, f"sha256 {got}" + ("" if got == frag else f", recorded {frag}")


def main(argv: list[str]) -> int:
    names = argv or sorted(p.parent.name for p in (ROOT / "images").glob("*/sources.yaml"))
    failed = 0
    for name in names:
        manifest = yaml.safe_load((ROOT / "images" / name / "manifest.yaml").read_text())
        arm64 = manifest.get("platform") == "linux/arm64"
        data = yaml.safe_load((ROOT / "images" / name / "sources.yaml").read_text()) or {}
        for s in data.get("sources") or []:
            kind, ref = s.get("kind"), str(s.get("ref"))
            if kind == "pypi":
                ok, why = check_pypi(ref, str(s.get("evidence", "")), arm64)
            elif kind == "url":
                ok, why = check_url(ref)
            else:
                ok, why = None, "evidence from the search tools / the lab (docs/images.md)"
            word = "skipped" if ok is None else ("ok" if ok else "FAIL")
            failed += ok is False
            print(f"{word:8}{name}: {kind} {ref.split('#')[0]}: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
