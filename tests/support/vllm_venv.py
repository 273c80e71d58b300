"""The Python of a throwaway CPU venv with vLLM 0.32.0 (docs/vllm-version.md says how it is made), for the tests that
run vLLM's own code: its argument parser (scripts/dump_vllm_args.py --parse) and its serving layer's parsers
(scripts/check_vllm_parsers.py). It is not part of the project's venv (vLLM and its CPU torch are ~1.5 GB and
take minutes to install), so those tests run where it exists and say how to make it where it does not."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ENV = "SPARKDEPLOY_VLLM_PYTHON"
DEFAULT = Path("/tmp/vllm032/venv/bin/python")  # the path docs/vllm-version.md builds it at
HOW = (
    f"no vLLM 0.32.0 venv: make one as docs/vllm-version.md says (at {DEFAULT.parent.parent}) or point {ENV} at "
    "its python"
)


def vllm_python() -> Path | None:
    path = Path(os.environ.get(ENV) or DEFAULT)
    return path if path.is_file() else None


def need_vllm_python() -> Path:
    """The venv's python, or the test is skipped saying how to make it."""
    path = vllm_python()
    if path is None:
        pytest.skip(HOW)
    return path


def run_with_vllm(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """`python ARGS` with the vLLM venv (CPU platform forced, as the scripts do themselves)."""
    python = need_vllm_python()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=timeout, env=env)
