"""`images build NAME --on NODE`: the build context goes over SSH to the node's `docker build -`.

Throwaway definitions in a temporary images folder (debian-base copied in, so its tag is the real one).
"""

from __future__ import annotations

import json
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
        # The lab's nodes are x86_64 with a few GB free: needs they meet, checked before the build.
        (folder / "manifest.yaml").write_text(
            f"name: {name}\ndescription: test\nbase: debian-base\nbuild_needs: {{arch: x86_64, disk_gb: 1}}\n"
        )
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
        code, out, err = cli("images", "build", "push-build-ok", "--on", node.name, "-i", str(lab.spec.inventory_path))
        assert code == 0, err
        assert out.strip() == f"{node.name}: {tag}"
        assert f"{node.name}: ok   architecture: x86_64" in err
        assert f"{node.name}: ok   free disk: " in err and "GB free in /var/lib/docker, 1 GB needed" in err
        assert "step 4/5: RUN test -s /hello.txt" in err
        label = lab.ssh(
            node, f"docker image inspect --format '{{{{index .Config.Labels \"io.sparkdeploy.image\"}}}}' {tag}"
        ).stdout.strip()
        assert label == "push-build-ok"
        assert lab.ssh(node, f"docker run --rm {tag} cat /hello.txt").stdout == "hello from the build context\n"
    finally:
        lab.ssh(node, f"docker image rm {tag}", check=False)


def test_failed_build_on_node_names_the_step_and_shows_output(lab, images_dir, cli):
    code, _out, err = cli(
        "images", "build", "push-build-fail", "--on", lab.nodes[0].name, "-i", str(lab.spec.inventory_path)
    )
    assert code == 1
    assert f"{lab.nodes[0].name}: building image push-build-fail failed at Step 4/5 : RUN echo about to fail" in err
    assert "about to fail" in err.split("failed at", 1)[1].split("\n", 1)[1]  # the build's own output follows


def test_definition_changed_rebuilt_and_repushed_sends_only_the_new_layer(lab, images_dir, cli):
    """The issue's scenario through the CLI: build a definition here, push it to both nodes (IDs checked); change
    one small file of the definition, rebuild (a new content-hash tag; the build cache keeps the lower layers),
    push again: one layer travels, of about that file's size."""
    import json

    import docker

    from sparkdeploy.images import definitions

    folder = images_dir / "push-def"
    folder.mkdir()
    (folder / "manifest.yaml").write_text("name: push-def\ndescription: test\nbase: debian-base\n")
    (folder / "Dockerfile").write_text(
        "ARG BASE\nFROM ${BASE}\nRUN head -c 3000000 /dev/urandom > /data.bin\nCOPY hello.txt /hello.txt\n"
    )
    (folder / "hello.txt").write_text("version 1\n")
    inventory = str(lab.spec.inventory_path)
    client = docker.from_env()
    tags = []
    try:
        for version in (1, 2):
            (folder / "hello.txt").write_text(f"version {version}\n" + "x" * 20_000)
            definitions.clear_cache()
            code, out, err = cli("images", "build", "push-def", "--local")
            assert code == 0, err
            tags.append(definitions.load_definition("push-def").tag)
            code, out, err = cli("images", "push", "push-def", "--json", "-i", inventory)
            assert code == 0, err
            results = {r["node"]: r for r in json.loads(out)}
            assert set(results) == {n.name for n in lab.nodes}
            for node in lab.nodes:
                r = results[node.name]
                assert r["ok"] and r["action"] == "sent" and r["reader"] == "store", r
                node_id = lab.ssh(node, f"docker image inspect --format '{{{{.Id}}}}' {tags[-1]}").stdout.strip()
                assert node_id == client.images.get(tags[-1]).id == r["image_id"]
                if version == 1:
                    assert r["layers_sent"] >= 2, r  # the random layer and the file (the base may be there)
                else:
                    assert r["layers_sent"] == 1, r
                    assert 20_000 <= r["raw_bytes"] <= 20_000 + 16_384, r  # the file + tar headers, manifest
        assert tags[0] != tags[1]
    finally:
        for tag in tags:
            for node in lab.nodes:
                lab.ssh(node, f"docker image rm {tag}", check=False)
            try:
                client.images.remove(tag)
            except docker.errors.ImageNotFound:
                pass


def test_build_on_node_checks_arch_disk_and_internet_first(lab, images_dir, cli):
    """A definition the node cannot build (an arm64 image, more disk than it has, a host that does not answer)
    stops before anything is sent, with one line per failed check, and builds nothing."""
    from sparkdeploy.images.definitions import load_definition

    folder = images_dir / "push-build-needs"
    folder.mkdir()
    (folder / "manifest.yaml").write_text(
        "name: push-build-needs\ndescription: test\nbase: debian-base\nplatform: linux/arm64\n"
        "build_needs: {arch: aarch64, disk_gb: 100000, internet: ['http://127.0.0.1:9/']}\n"
    )
    (folder / "Dockerfile").write_text("ARG BASE\nFROM ${BASE}\nRUN true\n")
    node = lab.nodes[0]
    code, _out, err = cli("images", "build", "push-build-needs", "--on", node.name, "-i", str(lab.spec.inventory_path))
    assert code == 1
    assert f"{node.name}: FAIL architecture: x86_64, but push-build-needs must be built on aarch64" in err
    assert "FAIL free disk: " in err and "100000 GB needed" in err
    assert "FAIL internet http://127.0.0.1:9/: no answer (URLError" in err
    assert f"{node.name}: not building push-build-needs" in err
    tag = load_definition("push-build-needs").tag
    assert lab.ssh(node, f"docker image inspect {tag}", check=False).returncode != 0


def test_failed_build_resumes_from_cache_then_goes_to_the_other_node(lab, images_dir, cli):
    """After a failure the same command resumes: the finished step comes from the node's cache. The image it
    built is then sent from that node to the other (`images push --from`), with the same image ID."""
    from sparkdeploy.images import definitions

    folder = images_dir / "push-build-resume"
    folder.mkdir()
    (folder / "manifest.yaml").write_text("name: push-build-resume\ndescription: test\nbase: debian-base\n")
    (folder / "Dockerfile").write_text(
        "ARG BASE\nFROM ${BASE}\nRUN head -c 100000 /dev/urandom > /slow.bin\n"
        "COPY flag.txt /flag.txt\nRUN grep -q ok /flag.txt\n"
    )
    (folder / "flag.txt").write_text("not yet\n")
    src, dst = lab.nodes[0], lab.nodes[1]
    inventory = str(lab.spec.inventory_path)
    tags = []
    try:
        code, _out, err = cli("images", "build", "push-build-resume", "--on", src.name, "-i", inventory)
        assert code == 1 and "failed at Step 5/6 : RUN grep -q ok /flag.txt" in err
        (folder / "flag.txt").write_text("ok\n")
        definitions.clear_cache()
        code, out, err = cli("images", "build", "push-build-resume", "--on", src.name, "-i", inventory)
        assert code == 0, err
        assert f"{src.name}: Step 3/6 already built (cache)" in err  # the slow step was not run again
        tags.append(out.strip().split(": ", 1)[1])
        code, out, err = cli(
            "images", "push", "push-build-resume", "--from", src.name, "--to", dst.name, "--json", "-i", inventory
        )
        assert code == 0, err
        (result,) = json.loads(out)["nodes"]  # --from: {"source", "chain", "nodes": [...]}
        assert result["node"] == dst.name and result["ok"] and result["action"] == "sent", result
        ids = {
            n.name: lab.ssh(n, f"docker image inspect --format '{{{{.Id}}}}' {tags[0]}").stdout.strip()
            for n in (src, dst)
        }
        assert ids[src.name] == ids[dst.name] == result["image_id"]
        code, out, _ = cli(
            "images", "push", "push-build-resume", "--from", src.name, "--to", dst.name, "--json", "-i", inventory
        )
        assert code == 0 and json.loads(out)["nodes"][0]["action"] == "present"
    finally:
        for tag in tags:
            for node in (src, dst):
                lab.ssh(node, f"docker image rm {tag}", check=False)
