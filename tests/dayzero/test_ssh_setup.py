"""setup ssh's report: the key's state and the node's facts (set ACCESS), and the one line per missing piece with
its exact fix."""

from __future__ import annotations

from pathlib import Path

from sparkdeploy import facts
from sparkdeploy.dayzero import sudo_needs
from sparkdeploy.dayzero.ssh_setup import NodeSsh, from_facts
from tests.dayzero.spark_samples import render_sections

LAB_BARE = Path(__file__).parents[1] / "facts" / "samples" / "lab-bare-access.txt"


def parse(node: str, key: str, sudo: str, groups: str, user: str = "spark") -> NodeSsh:
    """What the node says: the key script's line, then the ACCESS facts (`id -un; id -Gn`, the sudo lines)."""
    text = render_sections(
        {"home": ("/home/spark", "", 0), "user": (f"{user}\n{groups}", "", 0), "sudo": (sudo, "", 0)}
    )
    return from_facts(node, key, facts.parse(node, text))


def test_missing_sudo_is_named_with_the_exact_sudoers_line():
    r = parse("spark1", "added", "python3 missing /usr/bin/python3\n", "spark sudo")
    r.key_login = True
    problems = r.problems()
    assert len(problems) == 2
    assert "no passwordless sudo for python3" in problems[0]
    assert "spark ALL=(root) NOPASSWD: /usr/bin/python3" in problems[0]
    assert sudo_needs.why("python3") in problems[0]
    assert (
        problems[1]
        == "spark1: spark is not in the docker group (fix: sudo usermod -aG docker spark, then log in again)"
    )


def test_all_present_is_no_problem_and_every_need_is_checked():
    text = "".join(f"{c} ok /usr/bin/{c}\n" for c in sudo_needs.commands())
    r = parse("spark2", "present", text, "spark docker")
    r.key_login = True
    assert r.problems() == [] and list(r.sudo) == sudo_needs.commands()


def test_a_key_that_does_not_log_in_is_a_problem():
    r = parse("spark3", "present", "", "spark docker")
    assert r.problems() == ["spark3: the key is in ~/.ssh/authorized_keys but logging in with it fails"]


def test_a_bare_lab_node_read_over_ssh_with_its_password():
    r = from_facts("spark1", "would-add", facts.parse("spark1", LAB_BARE.read_text()))
    assert r.user == "spark" and r.docker_group
    assert r.sudo == {"python3": "missing"} and r.sudo_paths == {"python3": "/usr/bin/python3"}
