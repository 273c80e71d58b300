"""`images build NAME --on NODE`: the build context goes over SSH to the node's `docker build -`.

Throwaway definitions in a temporary images folder (debian-base copied in, so its tag is the real one).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def images_dir(tmp_path, monkeypatch):
    from sparkdeploy.images import definitions

    root = tmp_path / "images"
    shutil.copytree(REPO / "images" / "debian-base", root / "debian-base")
    for name, run in (("push-build-ok", "test -s /hello.txt"), ("push-build-fail", "echo about to fail && false")):
        folder = root / name
        folder.mkdir()
        (folder / "manifest.yaml").write_text(f"name: {name}\ndescription: test\nbase: debian-base\n")
        (folder / "Dockerfile").write_text(f"ARG BASE\nFROM ${{BASE}}\nCOPY hello.txt /hello.txt\nRUN {run}\n")
        (folder / "hello.txt").write_text("hello from the build context\n")
    monkeypatch.setattr("sparkdeploy.paths.images_dir", lambda: root)
    definitions.clear_cache()
    yield root
    definitions.clear_cache()


def test_build_on_node(lab, images_dir, cli):
    from sparkdeploy.images.definitions import load_definition

    node = lab.nodes[0]
    tag = load_definition("push-build-ok").tag
    try:
        code, out, err = cli("images", "build", "push-build-ok", "--on", node.name, "-i",
                             str(lab.spec.inventory_path))
        assert code == 0, err
        assert out.strip() == f"{node.name}: {tag}"
        assert "step 4/5: RUN test -s /hello.txt" in err
        label = lab.ssh(node, f"docker image inspect --format '{{{{index .Config.Labels \"io.sparkdeploy.image\"}}}}' "
                              f"{tag}").stdout.strip()
        assert label == "push-build-ok"
        assert lab.ssh(node, f"docker run --rm {tag} cat /hello.txt").stdout == "hello from the build context\n"
    finally:
        lab.ssh(node, f"docker image rm {tag}", check=False)


def test_failed_build_on_node_names_the_step_and_shows_output(lab, images_dir, cli):
    code, _out, err = cli("images", "build", "push-build-fail", "--on", lab.nodes[0].name, "-i",
                          str(lab.spec.inventory_path))
    assert code == 1
    assert f"{lab.nodes[0].name}: building image push-build-fail failed at Step 4/5 : RUN echo about to fail" in err
    assert "about to fail" in err.split("failed at", 1)[1].split("\n", 1)[1]  # the build's own output follows
