"""setup ssh's report: what the node script says, and the one line per missing piece with its exact fix."""

from __future__ import annotations

from sparkdeploy.dayzero import sudo_needs
from sparkdeploy.dayzero.ssh_setup import parse


def test_missing_sudo_is_named_with_the_exact_sudoers_line():
    r = parse(
        "spark1",
        "key added\nsudo python3 missing /usr/bin/python3\ndocker no\nuser spark\n",
    )
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
    text = "key present\n" + "".join(f"sudo {c} ok /usr/bin/{c}\n" for c in sudo_needs.commands()) + "docker yes\n"
    r = parse("spark2", text + "user spark\n")
    r.key_login = True
    assert r.problems() == [] and list(r.sudo) == sudo_needs.commands()


def test_a_key_that_does_not_log_in_is_a_problem():
    r = parse("spark3", "key present\ndocker yes\nuser spark\n")
    assert r.problems() == ["spark3: the key is in ~/.ssh/authorized_keys but logging in with it fails"]
