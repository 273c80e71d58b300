"""benchmarks/empty_machine.py removes only what sparkdeploy made, and nothing without --yes.

The choice on a listing written here (pure logic), then the script itself against the real engine: test objects
of its own (tiny images made with `docker import` of an empty tar, a container, volumes), some marked as
sparkdeploy's and some not, all carrying a label unique to the run that `--only-label` restricts it to, so
nothing else on the engine is ever considered."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import empty_machine as em  # noqa: E402


def test_the_marks_are_the_ones_sparkdeploy_sets():
    from sparkdeploy.images.definitions import LABEL, load_definition
    from sparkdeploy.images.push import INCOMING_REPO
    from sparkdeploy.lab.spec import LAB_LABEL, LabSpec
    from sparkdeploy.labels import MANAGED_LABEL
    from tests.images.conftest import TEST_REPO

    assert (em.LAB_LABEL, em.MANAGED_LABEL, em.IMAGE_LABEL) == (LAB_LABEL, MANAGED_LABEL, LABEL)
    assert LabSpec().labels()[LAB_LABEL] == "1"
    for tag in (load_definition("vllm-sim").tag, f"{INCOMING_REPO}/vllm-sim:abc", f"{TEST_REPO}:v1"):
        assert em.OWN_REPOSITORY.match(tag), tag
    for tag in ("sparkdeployer/x:1", "library/sparkdeploy:1", "sparkdeploy:1", "vllm/vllm-openai:v0.32"):
        assert not em.OWN_REPOSITORY.match(tag), tag


def _obj(kind, name, labels=None, tags=None):
    return em.EngineObject(kind, f"sha256:{name}", name, labels or {}, tags or [])


def test_only_sparkdeploys_objects_are_chosen():
    lab = {"io.sparkdeploy.lab": "1", "io.sparkdeploy.lab.name": "other-lab"}
    listing = [
        _obj("container", "sparkdeploy-other-lab-spark1", lab),
        _obj("container", "sparkdeploy-vllm", {"io.sparkdeploy.managed": "true"}),
        _obj("container", "postgres", {"com.docker.compose.project": "shop"}),
        _obj("container", "not-a-lab", {"io.sparkdeploy.lab": "0"}),
        _obj("network", "sparkdeploy-other-lab-mgmt", lab),
        _obj("network", "bridge"),
        _obj("network", "managed-net", {"io.sparkdeploy.managed": "true"}),  # only containers carry that one
        _obj("volume", "sparkdeploy-other-lab-spark1-docker", lab),
        _obj("volume", "pgdata"),
        _obj("image", "sim", {"io.sparkdeploy.image": "vllm-sim"}, ["sparkdeploy/vllm-sim:0123456789ab"]),
        _obj("image", "both", {"io.sparkdeploy.image": "vllm-sim"}, ["sparkdeploy/vllm-sim:old", "mine:1"]),
        _obj("image", "incoming", {}, ["sparkdeploy-incoming/vllm-sim:5f5f"]),
        _obj("image", "step", {"io.sparkdeploy.image": "debian-base"}),  # untagged: a build step, an old ID
        _obj("image", "derived", {"io.sparkdeploy.image": "debian-base"}, ["someones/app:2"]),
        _obj("image", "dangling"),  # untagged and unlabelled: another project's
        _obj("image", "python", {"maintainer": "x"}, ["python:3.11"]),
    ]
    chosen = em.select(listing)
    names = {kind: [o.name for o in objs] for kind, objs in chosen.remove.items()}
    assert names == {
        "container": ["sparkdeploy-other-lab-spark1", "sparkdeploy-vllm"],
        "network": ["sparkdeploy-other-lab-mgmt"],
        "volume": ["sparkdeploy-other-lab-spark1-docker"],
        "image": ["step"],
    }
    assert chosen.untag == [
        "sparkdeploy-incoming/vllm-sim:5f5f",
        "sparkdeploy/vllm-sim:0123456789ab",
        "sparkdeploy/vllm-sim:old",
    ]
    assert chosen.kept == [
        "image mine:1: also tagged sparkdeploy/vllm-sim:old (that tag goes, the image stays)",
        "image someones/app:2: built from a sparkdeploy image, tagged by someone else",
    ]
    assert "image sha256:step (dangling, io.sparkdeploy.image=debian-base)" in chosen.lines()

    only = em.select(listing, ("io.sparkdeploy.lab.name", "other-lab"))
    assert [o.name for objs in only.remove.values() for o in objs] == [
        "sparkdeploy-other-lab-spark1",
        "sparkdeploy-other-lab-mgmt",
        "sparkdeploy-other-lab-spark1-docker",
    ]
    assert only.untag == [] and not em.select(listing, ("io.sparkdeploy.lab.name", "mine")).lines()


# -- the script, against the real engine -----------------------------------------------------------------------


def _docker(*args: str, stdin: bytes | None = None) -> str:
    r = subprocess.run(["docker", *args], input=stdin, capture_output=True, timeout=120)
    assert r.returncode == 0, f"docker {args}: {r.stderr.decode()}"
    return r.stdout.decode().strip()


def _exists(kind: str, ref: str) -> bool:
    return subprocess.run(["docker", kind, "inspect", ref], capture_output=True, timeout=60).returncode == 0


def _empty_tar() -> bytes:
    buf = io.BytesIO()
    tarfile.open(fileobj=buf, mode="w").close()
    return buf.getvalue()


@pytest.fixture
def engine_objects():
    """Our own objects on the real engine, each labelled with this run's id (what --only-label restricts to);
    removed at the end whatever the script did."""
    run = uuid.uuid4().hex[:12]
    mark = f"io.sparkdeploy-test.empty-machine={run}"
    made: dict[str, str] = {}

    def image(key: str, tag: str | None, *labels: str) -> None:
        changes = [a for label in (mark, *labels) for a in ("--change", f"LABEL {label}")]
        made[key] = _docker("import", *changes, "-", *([tag] if tag else []), stdin=_empty_tar())

    try:
        image("ours", f"sparkdeploy/empty-machine-test:{run}", "io.sparkdeploy.image=empty-machine-test")
        image("ours_untagged", None, "io.sparkdeploy.image=empty-machine-test")
        image("foreign", f"empty-machine-foreign/empty-machine:{run}")
        image("foreign_untagged", None)
        image("derived", f"empty-machine-foreign/derived:{run}", "io.sparkdeploy.image=empty-machine-test")
        # the lab container uses our image: it must go first, or `docker rmi` refuses the tag
        made["lab_container"] = _docker(
            "create",
            "--label",
            mark,
            "--label",
            "io.sparkdeploy.lab=1",
            "--name",
            f"sparkdeploy-test-empty-{run}",
            made["ours"],
            "true",
        )
        made["foreign_container"] = _docker(
            "create", "--label", mark, "--name", f"empty-machine-other-{run}", made["foreign"], "true"
        )
        made["lab_volume"] = _docker("volume", "create", "--label", mark, "--label", "io.sparkdeploy.lab=1")
        made["foreign_volume"] = _docker("volume", "create", "--label", mark)
        yield mark, made
    finally:
        for key in ("lab_container", "foreign_container"):
            if key in made:
                subprocess.run(["docker", "rm", "-f", made[key]], capture_output=True, timeout=60)
        for key in ("lab_volume", "foreign_volume"):
            if key in made:
                subprocess.run(["docker", "volume", "rm", made[key]], capture_output=True, timeout=60)
        for key in ("ours", "ours_untagged", "foreign", "foreign_untagged", "derived"):
            if key in made:
                subprocess.run(["docker", "rmi", made[key]], capture_output=True, timeout=60)


def _script(*args: str, state: Path) -> subprocess.CompletedProcess:
    # the system interpreter, as fresh_clone_ci.py runs it once the venv is gone
    return subprocess.run(
        [sys._base_executable, "-I", str(REPO / "benchmarks" / "empty_machine.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, SPARKDEPLOY_STATE=str(state)),
    )


def test_empty_machine_removes_only_sparkdeploys_objects_and_only_with_yes(tmp_path, engine_objects):
    mark, made = engine_objects
    checkout = tmp_path / "checkout"
    for folder in ("sparkdeploy", ".venv/bin", ".venv-litellm", "images/vllm-sim/wheels", "images/debian-base"):
        (checkout / folder).mkdir(parents=True)
    (checkout / "sparkdeploy" / "__init__.py").write_text("")
    (checkout / "images" / "vllm-sim" / "Dockerfile").write_text("FROM x\n")
    state = tmp_path / "state"
    (state / "lab").mkdir(parents=True)
    args = ("--repo", str(checkout), "--only-label", mark)
    ours = ("lab_container", "lab_volume", "ours", "ours_untagged")
    theirs = ("foreign_container", "foreign_volume", "foreign", "foreign_untagged", "derived")
    kind = {
        "lab_container": "container",
        "foreign_container": "container",
        "lab_volume": "volume",
        "foreign_volume": "volume",
    }

    dry = _script(*args, state=state)
    assert dry.returncode == 2, dry.stdout + dry.stderr
    assert dry.stderr.strip().splitlines() == [
        (
            "empty_machine: nothing removed; add --yes to remove the above (usage: python3 benchmarks/empty_machine.py "
            "[--repo PATH] [--only-label KEY=VALUE] --yes)"
        )
    ], dry.stderr
    run = mark.rsplit("=", 1)[1]
    listed = dry.stdout.splitlines()
    assert f"would remove: container sparkdeploy-test-empty-{run}" in listed, dry.stdout
    assert f"would remove: volume {made['lab_volume']}" in listed
    assert f"would remove: image tag sparkdeploy/empty-machine-test:{run}" in listed
    assert (
        f"would remove: image {made['ours_untagged'][:19]} (dangling, io.sparkdeploy.image=empty-machine-test)"
        in listed
    )
    assert {f"would remove: folder {checkout / f}" for f in (".venv", ".venv-litellm", "images/vllm-sim/wheels")} | {
        f"would remove: folder {state}"
    } <= set(listed)
    assert len([line for line in listed if line.startswith("would remove:")]) == 8, dry.stdout
    assert (
        f"keeping: image empty-machine-foreign/derived:{run}: built from a sparkdeploy image, tagged by someone else"
    ) in listed
    assert all(_exists(kind.get(k, "image"), made[k]) for k in ours + theirs), "the dry run removed something"
    assert (checkout / ".venv").is_dir() and state.is_dir()

    done = _script(*args, "--yes", state=state)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [k for k in ours if _exists(kind.get(k, "image"), made[k])] == [], done.stdout
    assert [k for k in theirs if not _exists(kind.get(k, "image"), made[k])] == [], done.stdout
    assert sorted(p.name for p in checkout.iterdir()) == ["images", "sparkdeploy"]
    assert sorted(p.name for p in (checkout / "images").rglob("*")) == ["Dockerfile", "debian-base", "vllm-sim"]
    assert not state.exists()
    assert json.loads(_docker("image", "inspect", "--format", "{{json .RepoTags}}", made["derived"])) == [
        f"empty-machine-foreign/derived:{run}"
    ]


def test_fresh_clone_ci_empties_the_cache_pip_uses(monkeypatch, tmp_path):
    """fresh_clone_ci.py's own step after empty_machine.py: the folder it removes is pip's cache."""
    import fresh_clone_ci

    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pipcache"))
    assert fresh_clone_ci.pip_cache_dir() == tmp_path / "pipcache"
