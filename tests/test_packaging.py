"""`pip install .` must give a working tool outside the checkout: recipes, templates and images ship inside."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests.conftest import REPO


def test_wheel_carries_recipes_templates_and_images(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("sparkdeploy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "sparkdeploy/data/recipes/openai-gpt-oss-120b.yaml" in names
    assert "sparkdeploy/data/templates/container-run.sh.j2" in names
    assert any(n.startswith("sparkdeploy/data/images/") and n.endswith("manifest.yaml") for n in names)
    assert not any("/wheels/" in n for n in names)
    # doctor --tests @spark: the shipped example checks
    assert {"sparkdeploy/doctor/spark_checks/test_fabric.py", "sparkdeploy/doctor/spark_checks/README.md"} <= set(names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([venv / "bin" / "pip", "install", "-q", "--no-deps", str(wheel)], check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run(
        [venv / "bin" / "python", "-c", "import sparkdeploy, sys; print(sparkdeploy.__file__)"],
        cwd=elsewhere,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert str(venv) in where, "the test must exercise the installed wheel, not the checkout"
    result = subprocess.run(
        [
            venv / "bin" / "run-recipe",
            "openai-gpt-oss-120b",
            "--dry-run",
            "-t",
            "2xsolo",
            "-i",
            str(REPO / "inventory.yaml"),
        ],
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "litellm-config.yaml" in result.stdout
