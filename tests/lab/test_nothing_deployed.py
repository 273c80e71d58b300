"""Nothing deployed: every command that needs a deployment says so in one line with the same exit code (1: the
cluster's state, not bad usage); `status`, which reports that state, exits 0 (issue 30: `top` exited 1 and `bench`
2)."""

from __future__ import annotations

import pytest

from tests.support.cli_process import failure, sd

LINE = "nothing of sparkdeploy's runs on"


@pytest.mark.lab
def test_nothing_deployed_is_one_line_and_exit_1_everywhere(lab):
    inv = str(lab.spec.inventory_path)
    r = sd("down", "-i", inv)
    assert r.returncode == 0, failure(r)
    for command in (["top", "--once"], ["logs", "--tail", "5"], ["bench", "-c", "1"]):
        r = sd(*command, "-i", inv)
        said = " ".join(r.stderr.split())
        assert r.returncode == 1 and LINE in said and "Traceback" not in r.stderr, (command, failure(r))
    r = sd("status", "-i", inv)
    assert r.returncode == 0 and "nothing of sparkdeploy's is deployed" in r.stdout, failure(r)
