"""Fast checks of what a Spark owner relies on before an hour-long build: every external reference of every
definition is recorded with its evidence (sources.yaml), `images build --dry-run` prints the plan from it, and
recipes are validated against the CLI of the image they name (the MXFP4 image's is its fork's, not 0.32.0's).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from sparkdeploy.images import definitions
from sparkdeploy.images.definitions import definition_names, load_definition
from sparkdeploy.images.sources import problems

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
FORK_ARGS = IMAGES / "vllm-node-mxfp4" / "vllm-args-0.1.dev12777.json"


# -- sources.yaml -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", definition_names())
def test_every_source_of_every_definition_is_recorded(name):
    assert problems(load_definition(name)) == []


@pytest.fixture
def images_copy(tmp_path, monkeypatch):
    """A copy of images/ to break on purpose (definitions are cached by folder, so clear around it)."""
    root = tmp_path / "images"
    shutil.copytree(IMAGES, root, ignore=shutil.ignore_patterns("wheels", "__pycache__"))
    monkeypatch.setattr("sparkdeploy.paths.images_dir", lambda: root)
    definitions.clear_cache()
    yield root
    definitions.clear_cache()


def test_an_unrecorded_commit_url_or_arg_is_reported(images_copy):
    manifest = images_copy / "vllm-node-mxfp4" / "manifest.yaml"
    data = yaml.safe_load(manifest.read_text())
    data["build_args"]["VLLM_REF"] = "0" * 40  # a bumped commit, evidence not updated
    data["build_args"]["EXTRA_WHEEL_VERSION"] = "1.2.3"  # a new source, not recorded at all
    manifest.write_text(yaml.safe_dump(data, sort_keys=False))
    dockerfile = images_copy / "vllm-node-mxfp4" / "Dockerfile"
    dockerfile.write_text(
        dockerfile.read_text().replace(
            "ARG VLLM_REF=045293d82b832229560ac4a13152a095af603b6e", "ARG VLLM_REF=" + "0" * 40
        )
        + "RUN curl -fsSL -o /x https://example.org/unrecorded.bin\n"
    )
    found = problems(load_definition("vllm-node-mxfp4"))
    text = "\n".join(found)
    assert "does not contain build arg VLLM_REF=" + "0" * 40 in text
    assert "build arg EXTRA_WHEEL_VERSION=1.2.3 is not recorded" in text
    assert "fetches https://example.org/unrecorded.bin, which is not recorded" in text
    assert all(line.startswith("images/vllm-node-mxfp4/sources.yaml: ") for line in found)


def test_a_missing_record_or_missing_evidence_is_reported(images_copy):
    (images_copy / "lab-node" / "sources.yaml").unlink()
    assert problems(load_definition("lab-node")) == [
        "images/lab-node/sources.yaml: missing: record every external reference of lab-node (docs/images.md)"
    ]
    path = images_copy / "vllm-node" / "sources.yaml"
    data = yaml.safe_load(path.read_text())
    data["sources"][0]["evidence"] = ""
    data["sources"][0]["ref"] = "nvcr.io/nvidia/pytorch:26.05-py3"  # no longer the manifest's base
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    text = "\n".join(problems(load_definition("vllm-node")))
    assert "sources[0] has no evidence" in text
    assert "base nvcr.io/nvidia/pytorch:26.07-py3 is not recorded" in text


def test_a_changed_requirements_lock_needs_a_new_record(images_copy):
    req = images_copy / "litellm-proxy" / "requirements.txt"
    req.write_text(req.read_text() + "\n# touched\n")
    assert any("requirements.txt changed" in p for p in problems(load_definition("litellm-proxy")))


def test_sources_are_evidence_not_build_inputs():
    """sources.yaml never changes a tag: updating evidence must not rebuild the lab's images."""
    for name in definition_names():
        d = load_definition(name)
        assert "sources.yaml" not in [arc for arc, _ in d.context_files()], name


# -- images build --dry-run -------------------------------------------------------------------------------


def test_dry_run_prints_the_plan_and_touches_nothing(cli, inventory_file):
    code, out, err = cli("images", "build", "vllm-node-mxfp4", "--on", "spark1", "--dry-run", "-i", str(inventory_file))
    assert code == 0, err
    d = load_definition("vllm-node-mxfp4")
    assert out.startswith("DRY RUN: nothing is built. Plan for image vllm-node-mxfp4 on spark1:")
    assert f"tag       {d.tag}" in out
    assert "platform  linux/arm64 (the node must be aarch64)" in out
    assert "base      nvcr.io/nvidia/pytorch:26.01-py3 (pulled by spark1's engine" in out
    for ref in (
        "git: https://github.com/christopherowen/vllm.git@045293d82b832229560ac4a13152a095af603b6e",
        "git: https://github.com/christopherowen/flashinfer.git@f349e52496a72a00d8c4ac02c7a1e38523ff7194",
        "git: https://github.com/christopherowen/cutlass.git@fede53000a962b46e05bafe0c86311778caeb380",
        "pypi: ray==2.60.0",
    ):
        assert f"source    {ref}" in out, ref
    assert "checked: 2026-11-23" in out
    assert "duration  about 1 h on a Spark" in out
    assert "disk      120 GB free in the node's Docker data root" in out
    assert "https://github.com/" in out and "https://nvcr.io/v2/" in out
    assert "sparkdeploy images push vllm-node-mxfp4 --from spark1" in out


def test_dry_run_of_a_lab_image_and_a_bad_node(cli, inventory_file):
    code, out, _ = cli("images", "build", "lab-node", "--dry-run")
    assert code == 0
    assert "on this machine" in out and f"base      {load_definition('debian-base').tag} (definition debian-base" in out
    assert "internet  none" in out
    code, _, err = cli("images", "build", "vllm-node", "--on", "nosuch", "--dry-run", "-i", str(inventory_file))
    assert code == 2 and "nosuch" in err


# -- recipes against the CLI of their own image ---------------------------------------------------------------


def _recipe(tmp_path: Path, image: str, extra_args: list[str]) -> Path:
    (tmp_path / "r.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "r",
                "description": "x",
                "model": "m/m",
                "image": image,
                "topologies": ["solo"],
                "default_topology": "solo",
                "vllm": {"extra_args": extra_args},
            }
        )
    )
    return tmp_path


def test_headline_recipe_lints_against_the_fork_cli(cli):
    code, out, err = cli("recipes", "lint", "--json")
    assert code == 0, out + err
    rows = [r for r in json.loads(out) if r["recipe"] == "openai-gpt-oss-120b"]
    assert rows and all(r["ok"] for r in rows)


def test_a_flag_the_image_lacks_fails_with_the_image_and_its_vllm_version(cli, tmp_path):
    # 0.14.0 and 0.32.0 have it, the fork (main before 0.14.0) does not.
    code, out, _ = cli(
        "recipes",
        "lint",
        "--recipes-dir",
        str(_recipe(tmp_path, "vllm-node-mxfp4", ["--enable-return-routed-experts"])),
    )
    assert code == 1
    assert (
        "--enable-return-routed-experts is not a flag of image vllm-node-mxfp4 (vLLM 0.1.dev12777 "
        "(christopherowen/vllm@045293d8))"
    ) in out
    assert "vllm-node" in out.split("fix:", 1)[1]  # the image that has it


def test_the_fork_flag_on_the_upstream_image_names_the_image_that_has_it(cli, tmp_path):
    code, out, _ = cli(
        "recipes", "lint", "--recipes-dir", str(_recipe(tmp_path, "vllm-node", ["--mxfp4-layers", "moe,qkv,o,lm_head"]))
    )
    assert code == 1
    assert "--mxfp4-layers is not a flag of image vllm-node (vLLM 0.32.0)" in out
    assert "vllm-node-mxfp4" in out


def test_a_flag_the_fork_dump_cannot_prove_is_refused_as_such(cli, tmp_path):
    spec = json.loads(FORK_ARGS.read_text())
    assert spec["unverified_flags"], "the fork's dump lists what it could not prove"
    flag = spec["unverified_flags"][0]
    code, out, _ = cli("recipes", "lint", "--recipes-dir", str(_recipe(tmp_path, "vllm-node-mxfp4", [flag])))
    assert code == 1 and f"{flag} may or may not be a flag of image vllm-node-mxfp4" in out


def test_a_local_build_of_an_arm64_image_on_another_arch_stops_at_once(cli, monkeypatch):
    # This machine's arch as an x86 laptop's (the real engine still answers: the tag is looked up first).
    monkeypatch.setattr("sparkdeploy.images.build.platform.machine", lambda: "x86_64")
    code, _out, err = cli("images", "build", "vllm-node", "--local")
    assert code == 1
    assert "vllm-node must be built on aarch64 and this machine is x86_64" in err
    assert "images build vllm-node --on NODE" in err
