"""Patches of the vLLM images must apply to the REAL files of the pinned vLLM release.

Today there are none: the eager all-reduce of seed 004 is configuration (`--compilation-config` with vLLM's
default splitting ops plus `vllm::all_reduce`), and the fastsafetensors multi-node device fix that
community images patch in is upstream in 0.32.0 (vllm/model_executor/model_loader/weight_utils.py:1301
uses `current_platform.current_device()`). So the first test only checks that manifests and patches/
folders agree; the apply test has nothing to apply and needs no wheel.

When a patch is added (list it under `patches:` and put it in images/<image>/patches/), the apply test
extracts each file the patch touches from the vLLM wheel and runs `patch --dry-run -p1` against it. The
wheel is not in git: it is looked up in .cache/vllm-wheels/ (or $SPARKDEPLOY_VLLM_WHEEL_DIR). If it is
missing the test FAILS (never skips) and prints the one command that fetches it.
"""

from __future__ import annotations

import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
VLLM_IMAGES = ("vllm-node", "vllm-node-mxfp4")
WHEEL_NAME = "vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"  # the Python files are the same on arm64


def wheel_dir() -> Path:
    return Path(os.environ.get("SPARKDEPLOY_VLLM_WHEEL_DIR", ROOT / ".cache" / "vllm-wheels"))


def fetch_command(version: str, directory: Path) -> str:
    return (
        f"python3 -m pip download --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 "
        f"--python-version 3.11 vllm=={version} -d {directory}"
    )


def vllm_wheel(version: str, directory: Path | None = None) -> Path:
    directory = directory or wheel_dir()
    path = directory / WHEEL_NAME.format(version=version)
    if not path.is_file():
        raise AssertionError(
            f"the vLLM {version} wheel is needed to test patches against the real release and is not in "
            f"{directory}. Fetch it (326 MB, kept out of git) with:\n  {fetch_command(version, directory)}"
        )
    return path


def patched_files(patch_text: str) -> list[str]:
    """Paths (relative to the vLLM source root, i.e. after -p1) that a unified diff modifies."""
    return sorted({m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", patch_text, re.M)})


def declared_patches() -> list[tuple[str, str, Path]]:
    out = []
    for name in VLLM_IMAGES:
        data = yaml.safe_load((IMAGES / name / "manifest.yaml").read_text())
        for rel in data.get("patches") or []:
            out.append((name, data["vllm_version"], IMAGES / name / rel))
    return out


@pytest.mark.parametrize("name", VLLM_IMAGES)
def test_manifest_and_patches_folder_agree(name):
    data = yaml.safe_load((IMAGES / name / "manifest.yaml").read_text())
    listed = {(IMAGES / name / rel).resolve() for rel in data.get("patches") or []}
    for path in listed:
        assert path.is_file(), f"{name} lists {path} which does not exist"
        assert path.parent.name == "patches", f"{path}: patches live under images/{name}/patches/"
    folder = IMAGES / name / "patches"
    present = {p.resolve() for p in folder.glob("*")} if folder.is_dir() else set()
    assert present <= listed, f"unlisted files in {folder}: {sorted(map(str, present - listed))}"


def test_vllm_node_needs_no_patch():
    data = yaml.safe_load((IMAGES / "vllm-node" / "manifest.yaml").read_text())
    assert data["patches"] == []
    assert data["compilation_defaults"]["splitting_ops"], "the eager all-reduce keeps these defaults"


def test_declared_patches_apply_to_the_real_vllm_files(tmp_path):
    for image, version, patch in declared_patches():
        text = patch.read_text()
        files = patched_files(text)
        assert files, f"{patch}: no '+++ b/...' lines: not a -p1 unified diff"
        root = tmp_path / image / patch.stem
        with zipfile.ZipFile(vllm_wheel(version)) as wheel:
            names = set(wheel.namelist())
            for rel in files:
                assert rel in names, f"{patch} touches {rel}, which vLLM {version}'s wheel does not have"
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_bytes(wheel.read(rel))
        result = subprocess.run(
            ["patch", "--dry-run", "--batch", "-p1", "-d", str(root), "-i", str(patch)], capture_output=True, text=True
        )
        assert result.returncode == 0, f"{patch} does not apply to vLLM {version}:\n{result.stdout}{result.stderr}"


def test_missing_wheel_fails_with_the_fetch_command(tmp_path):
    with pytest.raises(AssertionError) as info:
        vllm_wheel("0.32.0", tmp_path)
    message = str(info.value)
    assert "pip download --no-deps" in message and "vllm==0.32.0" in message and str(tmp_path) in message


def test_patched_files_reads_p1_paths():
    diff = "--- a/vllm/config/compilation.py\n+++ b/vllm/config/compilation.py\n@@ -1 +1 @@\n-x\n+y\n"
    assert patched_files(diff) == ["vllm/config/compilation.py"]
