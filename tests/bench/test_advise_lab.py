"""`advise` names a command `up` accepts on the lab (issue 30: for llama-3.3-70b it printed a 2xsolo command that
`up` then refused with exit 2). Its command, run with --dry-run against the lab's nodes, passes recipe checks,
preflight and plan."""

from __future__ import annotations

import json
import shlex

import pytest

from tests.support.cli_process import failure, sd


@pytest.mark.lab
@pytest.mark.parametrize("recipe", ["llama-3.3-70b-instruct", "openai-gpt-oss-120b-bench"])
def test_the_advised_command_is_one_up_accepts(lab, recipe):
    inv = str(lab.spec.inventory_path)
    r = sd("advise", "-c", "64", "-r", recipe, "-i", inv, "--json")
    assert r.returncode == 0, failure(r)
    command = shlex.split(json.loads(r.stdout)["command"])
    assert command[:2] == ["sparkdeploy", "up"] and "--inventory" in command, command
    r = sd(*command[1:], "--dry-run")
    assert r.returncode == 0, failure(r)
    assert "DRY RUN" in r.stdout
