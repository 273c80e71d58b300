"""`sparkdeploy setup ssh` on the lab's nodes: a new key installed through a key they accept, idempotent."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from tests.support.cli_process import failure, sd

pytestmark = pytest.mark.lab


def test_setup_ssh_installs_a_new_key_once_and_checks_sudo_and_docker(lab, tmp_path):
    data = yaml.safe_load(lab.spec.inventory_path.read_text())
    data["cluster"]["known_hosts"] = str(lab.known_hosts)
    data["cluster"].pop("secrets_file", None)
    new_key = tmp_path / "id_new"
    for node in data["nodes"]:
        node["ssh"]["key"] = str(new_key)
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(data))
    before = {n.name: lab.ssh(n, "cat ~/.ssh/authorized_keys").stdout for n in lab.nodes}
    try:
        refused = sd("setup", "ssh", "-i", str(inv), "--dry-run")
        assert refused.returncode == 1, failure(refused)
        assert "does not accept the key yet" in refused.stdout and "--ask-password" in refused.stdout
        assert not new_key.exists()  # a dry run creates no key

        dry = sd("setup", "ssh", "-i", str(inv), "--dry-run", "--login-key", str(lab.key), "--json")
        report = json.loads(dry.stdout)
        assert {n["key"] for n in report["nodes"]} == {"would-add"}, failure(dry)
        assert {n.name: lab.ssh(n, "cat ~/.ssh/authorized_keys").stdout for n in lab.nodes} == before

        r = sd("setup", "ssh", "-i", str(inv), "--login-key", str(lab.key), "--json")
        assert r.returncode == 0, failure(r)
        report = json.loads(r.stdout)
        assert [(n["login"], n["key"], n["key_login"]) for n in report["nodes"]] == [("login-key", "added", True)] * 2
        assert all(n["sudo"] == {"python3": "ok"} and n["docker_group"] for n in report["nodes"])
        pub = (tmp_path / "id_new.pub").read_text().strip()
        for n in lab.nodes:
            assert lab.ssh(n, "cat ~/.ssh/authorized_keys").stdout.splitlines().count(pub) == 1

        again = sd("setup", "ssh", "-i", str(inv), "--json")  # the new key alone now: nothing to add
        assert again.returncode == 0, failure(again)
        assert [(n["login"], n["key"]) for n in json.loads(again.stdout)["nodes"]] == [("key", "present")] * 2
        for n in lab.nodes:
            assert lab.ssh(n, "cat ~/.ssh/authorized_keys").stdout.splitlines().count(pub) == 1
    finally:
        pub_file = tmp_path / "id_new.pub"
        if pub_file.is_file():  # the shared lab's nodes lose the test's key again
            line = shlex.quote(pub_file.read_text().strip())
            for n in lab.nodes:
                lab.ssh(
                    n,
                    f"grep -vxF {line} ~/.ssh/authorized_keys > ~/.ssh/ak.tmp; mv ~/.ssh/ak.tmp ~/.ssh/authorized_keys",
                )
