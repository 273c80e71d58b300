"""A real Docker engine inside each node, reachable by the SSH user, with the `--gpus` driver registered."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.lab


def test_docker_info_over_ssh(lab):
    for node in lab.nodes:
        out = lab.ssh(node, "docker info --format '{{.ServerVersion}} {{.Driver}}'").stdout.split()
        assert out[0].startswith("20.10")
        assert out[1] in ("overlay2", "vfs")


def test_inner_storage_driver_is_overlay2(lab):
    """overlay2 on the node's volume works on this kernel; vfs is only the fallback (see lab-service)."""
    for node in lab.nodes:
        assert (
            lab.docker_exec(node, "head", "-n1", "/var/lib/docker/.sparkdeploy-lab-storage-driver").stdout.strip()
            == "overlay2"
        )


def _any_image(lab, node) -> str:
    """An image to run inside the node: the lab's own base, loaded once if the node has none yet."""
    import docker

    from sparkdeploy.images.definitions import load_definition

    tag = load_definition("debian-base").tag
    if lab.ssh(node, f"docker image inspect {tag}", check=False).returncode != 0:
        from sparkdeploy.config.inventory import load_inventory
        from sparkdeploy.lab.engine_images import preload

        preload(
            docker.from_env(), ["debian-base"], load_inventory(str(lab.spec.inventory_path)), print, nodes=[node.name]
        )
    return tag


def test_docker_run_gpus_all(lab):
    """Docker 20.10 registers its nvidia device driver when nvidia-container-runtime-hook is in PATH."""
    node = lab.nodes[0]
    tag = _any_image(lab, node)
    lab.docker_exec(node, "sh", "-c", ": > /var/log/sparkdeploy-lab-gpu-hook.log")
    out = lab.ssh(node, f"docker run --rm --gpus all {tag} sh -c 'echo ok; echo $NVIDIA_VISIBLE_DEVICES'").stdout
    assert out.split() == ["ok", "all"]
    hook_log = lab.docker_exec(node, "cat", "/var/log/sparkdeploy-lab-gpu-hook.log").stdout
    assert "SIMULATED prestart" in hook_log  # the daemon really ran the hook as an OCI prestart hook


def test_memlock_unlimited_is_simulated_and_says_so(lab):
    """The run scripts ask for --ulimit memlock=-1 (RDMA on a Spark); this host cannot grant it, so the lab's
    docker wrapper maps it to the node's hard limit and prints SIMULATED. Without the wrapper runc refuses."""
    node = lab.nodes[0]
    tag = _any_image(lab, node)
    run = lab.ssh(node, f"docker run --rm --ulimit memlock=-1 {tag} sh -c 'ulimit -l'", check=False)
    assert run.returncode == 0, run.stderr
    assert "SIMULATED" in run.stderr and "memlock" in run.stderr
    hard = lab.ssh(node, "ulimit -H -l").stdout.strip()
    assert run.stdout.strip() == hard
    direct = lab.ssh(node, f"/usr/bin/docker run --rm --ulimit memlock=-1 {tag} true", check=False)
    assert direct.returncode != 0 and "rlimit" in direct.stderr.lower()


def test_preload_pushes_once_then_skips(scratch_lab):
    """Pushed (over SSH, only missing layers) into every node lacking the image; a second pass finds the same
    image ID and skips; a definition that does not exist is skipped with the reason."""
    import docker

    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.lab import engine_images

    lab = scratch_lab
    client = docker.from_env()
    names = sorted(n.name for n in lab.nodes)
    inventory = load_inventory(str(lab.spec.inventory_path))
    tag = engine_images.resolve("debian-base", client, print)[0]
    for node in lab.nodes:
        lab.docker_exec(node, "sh", "-c", f"docker rmi -f {tag} >/dev/null 2>&1 || true")
    first = engine_images.preload(client, ["debian-base", "no-such-image"], inventory, print)
    assert sorted(first[0].loaded) == names and first[0].present == []
    assert first[1].tag is None and "no definition" in first[1].skipped
    for node in lab.nodes:
        inner = lab.ssh(node, f"docker image inspect --format '{{{{.Id}}}}' {tag}").stdout.strip()
        assert inner == client.images.get(tag).id
    second = engine_images.preload(client, ["debian-base"], inventory, print)
    assert second[0].loaded == [] and sorted(second[0].present) == names


def test_engine_images_from_lab_up_are_on_every_node(lab):
    """What `lab up` reported as loaded or present is really there (definitions not written yet: skipped)."""
    for item in lab.result.images:
        if not item.tag:
            assert item.skipped
            continue
        assert sorted(item.loaded + item.present) == sorted(n.name for n in lab.nodes)
        for node in lab.nodes:
            assert lab.ssh(node, f"docker image inspect {item.tag}", check=False).returncode == 0
