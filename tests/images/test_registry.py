"""Registry images without the lab: the reference, the recipe field, the CLI read from an image's own help, and
the checks that use it (the lab proves the pull, the digest check and the spread: test_registry_lab.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparkdeploy.errors import ConfigError
from sparkdeploy.images import image_ref as reference
from sparkdeploy.images.image_ref import RegistryImage, parse_reference, registry_image
from sparkdeploy.images.registry_pull import parse_help
from sparkdeploy.recipes import recipe as recipes

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32
NGC = f"nvcr.io/nvidia/vllm:26.01-py3@{DIGEST}"


@pytest.fixture(scope="module")
def sim_help() -> str:
    """The text vllm-sim's `vllm serve --help` prints (what read_cli reads in the image), from its own code."""
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'images' / 'vllm-sim'}{os.pathsep}{REPO / 'images' / 'launcher'}")
    run = subprocess.run(
        [sys.executable, "-m", "vllm_sim", "serve", "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


def test_references_parse_into_their_parts():
    ref = parse_reference(NGC)
    assert (ref.domain, ref.path, ref.tag, ref.digest) == ("nvcr.io", "nvidia/vllm", "26.01-py3", DIGEST)
    assert ref.pull_ref == f"nvcr.io/nvidia/vllm@{DIGEST}"  # by digest: the engine checks the content
    assert ref.local_tag == "nvcr.io/nvidia/vllm:26.01-py3"
    lab = parse_reference("172.31.77.6:5000/lab/vllm-sim:v1")
    assert (lab.registry, lab.repository, lab.digest) == ("172.31.77.6:5000", "172.31.77.6:5000/lab/vllm-sim", None)
    assert lab.pull_ref == lab.local_tag == "172.31.77.6:5000/lab/vllm-sim:v1"
    assert parse_reference(f"localhost:5000/x@{DIGEST}").local_tag == f"localhost:5000/x:sha256-{'ab' * 6}"
    assert parse_reference("ubuntu:22.04").registry == "docker.io"


@pytest.mark.parametrize(
    "text",
    ["nvcr.io/NVIDIA/vllm:1", "nvcr.io/nvidia/vllm:1@sha256:abc", "nvcr.io/nvidia/vllm:bad tag", "a//b:1", "x:1;rm"],
)
def test_a_bad_reference_is_one_problem_with_its_fix(text):
    with pytest.raises(ConfigError) as exc:
        parse_reference(text, "r.yaml")
    (problem,) = exc.value.problems
    assert problem.field == "image" and "HOST[:PORT]/REPO[:TAG][@sha256:" in problem.fix


def _recipe(tmp_path: Path, image: str, **extra) -> Path:
    data = {
        "name": "reg",
        "description": "a registry image",
        "model": "org/model",
        "image": image,
        "topologies": ["solo", "cluster"],
        "default_topology": "solo",
        **extra,
    }
    path = tmp_path / "reg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_recipe_names_a_definition_or_a_registry_reference(tmp_path):
    assert recipes.load_recipe(str(_recipe(tmp_path, NGC)))[0].image == NGC
    assert recipes.load_recipe(str(_recipe(tmp_path, "vllm-node")))[0].image == "vllm-node"
    with pytest.raises(ConfigError) as exc:
        recipes.load_recipe(str(_recipe(tmp_path, "nvcr.io/nvidia/vllm:1@sha256:short")))
    assert "is not a registry reference" in str(exc.value) and "reg.yaml" in str(exc.value)


def test_the_cli_read_from_an_images_help_is_exactly_its_parser(sim_help):
    """vllm-sim's help, parsed, gives every flag of vLLM 0.32's dumped parser with the same value-taking and
    choices, plus the sim's declared extra flags: what lint then checks a registry image against."""
    spec = parse_help(sim_help)["flags"]
    dump = json.loads((REPO / "images" / "vllm-node" / "vllm-args-0.32.0.json").read_text())["flags"]
    expected = {f for f in dump if f not in ("-h", "--help")}
    assert expected <= set(spec), sorted(expected - set(spec))[:5]
    assert set(spec) - expected == {"--mxfp4-layers", "--mxfp4-backend"}
    for flag in expected:
        assert spec[flag]["takes_value"] == dump[flag].get("takes_value", True), flag
        if dump[flag].get("choices"):
            assert spec[flag]["choices"] == [str(c) for c in dump[flag]["choices"]], flag


def _save_cli(ref_text: str, spec: dict, simulated: bool = True) -> None:
    ref = parse_reference(ref_text)
    reference.save(
        ref,
        ref.digest or DIGEST,
        {"image_id": "sha256:" + "cd" * 32, "vllm_version": "0.32.0", "simulated": simulated, "cli": spec},
    )


def _lint_inventory():
    from sparkdeploy.config.inventory import Inventory
    from sparkdeploy.topologies.lint import LINT_INVENTORY

    return Inventory.model_validate(LINT_INVENTORY)


def _render(path: Path, sets=()):
    from sparkdeploy.config.secrets import Secrets
    from sparkdeploy.topologies import build_deployment

    resolved = recipes.resolve(str(path), sets=list(sets))
    return build_deployment(_lint_inventory(), resolved, Secrets({"HF_TOKEN": "hf_x"}, source="t"))


def test_a_registry_images_flags_are_checked_against_the_cli_read_from_it(tmp_path, state, sim_help):
    path = _recipe(tmp_path, NGC)
    before = _render(path)
    assert isinstance(before.image, RegistryImage) and before.image_tag == "nvcr.io/nvidia/vllm:26.01-py3"
    assert any("not known yet" in w for w in before.warnings)  # not pulled: said, flags checked after the pull
    _save_cli(NGC, parse_help(sim_help))
    dep = _render(path, ["vllm.max_num_seqs=64"])
    rendered = "\n".join(f.content for f in dep.nodes[0].files)
    assert "--max-num-seqs 64" in rendered and not any("not known" in w for w in dep.warnings)
    with pytest.raises(ConfigError) as exc:
        _render(path, ["vllm.extra_args=[--no-such-flag]"])
    assert "--no-such-flag is not a flag of image " + NGC in str(exc.value)
    with pytest.raises(ConfigError) as exc:  # choices come from the image's help too
        _render(path, ["vllm.kv_cache_dtype=fp7"])
    assert "'fp7' is not one of the choices" in str(exc.value)


def test_a_registry_image_runs_as_it_is_in_the_lab(tmp_path, state, sim_help):
    """The lab's image_override (vllm-sim for our GPU definitions) does not replace a registry image: the lab's
    registry serves an image the lab built. Its simulated flag is the image's own label, read at the pull."""
    ref = "172.31.77.6:5000/lab/vllm-sim:v1"
    _save_cli(ref, parse_help(sim_help), simulated=True)
    inv = _lint_inventory()
    inv.cluster.image_override = "vllm-sim"
    from sparkdeploy.config.secrets import Secrets
    from sparkdeploy.topologies import build_deployment

    dep = build_deployment(inv, recipes.resolve(str(_recipe(tmp_path, ref))), Secrets({}, source="t"))
    assert dep.image_tag == ref and registry_image(ref).simulated is True
    engines = {c.image for nd in dep.nodes for c in nd.containers if c.role != "guard"}  # the guard is ours
    assert engines == {ref}


def test_images_pull_dry_run_and_bad_input(cli, tmp_path, state):
    inv = tmp_path / "inventory.yaml"
    from sparkdeploy.topologies.lint import LINT_INVENTORY

    inv.write_text(yaml.safe_dump(LINT_INVENTORY))
    code, out, err = cli("images", "pull", NGC, "--on", "spark2", "--dry-run", "-i", str(inv))
    assert code == 0, err
    assert f"pull nvcr.io/nvidia/vllm@{DIGEST} once, on spark2" in out
    assert f"RepoDigests must list {DIGEST}" in out and "from spark2 to spark1" in out
    code, out, err = cli("images", "pull", "nvcr.io/nvidia/vllm:1@sha256:12", "--dry-run", "-i", str(inv))
    assert code == 2 and "is not a registry reference" in err and "Traceback" not in err
    code, out, err = cli("images", "pull", "openai-gpt-oss-120b", "--dry-run", "-i", str(inv))
    assert code == 2 and "is an image definition, not a registry image" in err


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            "Error response from daemon: manifest for nvcr.io/nvidia/vllm@sha256:abab not found: manifest unknown",
            "the digest does not match, refused",
        ),
        (
            'Error response from daemon: Get "https://nvcr.io/v2/": dial tcp: lookup nvcr.io: no such host',
            "spark1: cannot reach the registry nvcr.io",
        ),
        ("Error response from daemon: unauthorized: authentication required", "docker login nvcr.io"),
    ],
)
def test_a_failed_pull_is_one_line_naming_the_node_and_the_fix(output, expected):
    """Docker's own error lines (as `docker pull` prints them) -> the one line `images pull` and `up` report."""
    from sparkdeploy.images.registry_pull import _pull_failure

    message = str(_pull_failure("spark1", parse_reference(NGC), output))
    assert expected in message and "\n" not in message
