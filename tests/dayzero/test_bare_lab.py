"""Day zero on the bare lab (nodes as a new pair of Sparks arrives): the README's five commands, exactly as it
prints them (its example hosts replaced by the lab's; the password typed where it asks, the host keys confirmed),
lead to a first answer with no other step: init -> setup ssh -> setup network -> doctor -> run-recipe; a re-run
of init keeps the owner's edits; a host given by its fabric address is refused with nothing pinned; and a change
that cuts the management network, undone by the node itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.dayzero import netplan
from sparkdeploy.dayzero.network_setup import Prepared, _prepare, apply_node
from tests.support.cli_process import failure, sd
from tests.support.node_hosts import node_hosts
from tests.support.readme import dayzero_commands_in_readme

pytestmark = pytest.mark.lab


def _exec(container: str, command: str) -> str:
    return subprocess.run(["docker", "exec", container, "sh", "-c", command], capture_output=True, text=True).stdout


class Owner:
    """A person at this machine: their own folder, home (~/.ssh) and sparkdeploy state (known_hosts), which holds
    the bare lab's folder as `lab up --bare` left it; the README's commands run as shell lines there."""

    def __init__(self, bare_lab, tmp: Path):
        self.dir, self.home, self.state = tmp / "work", tmp / "home", tmp / "state"
        for d in (self.dir, self.home, self.state):
            d.mkdir()
        (self.state / bare_lab.spec.directory.name).symlink_to(bare_lab.spec.directory)
        self.env = {
            **os.environ,
            "HOME": str(self.home),
            "SPARKDEPLOY_STATE": str(self.state),
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        }
        self.env.pop("SPARKDEPLOY_INVENTORY", None)
        self.password = bare_lab.password_file.read_text().strip()
        self.inventory = self.dir / "inventory.yaml"

    def run(self, line: str, stdin: str = "", timeout: float = 1200) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", line],
            cwd=self.dir,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def sd(self, *args: str) -> subprocess.CompletedProcess:
        return sd(*args, env=self.env)


def assert_network_read_by_testinfra(owner: Owner) -> None:
    """After `setup network`, a second reader of each node (testinfra over the pinned SSH, not the fact layer or
    docker exec): sparkdeploy's netplan file (root's, 0600, MTU 9000 for each port), each fabric port at MTU 9000 and
    the node's fabric_ip on one of them."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("HOME", str(owner.home))  # the owner's ~/.ssh: their key and known_hosts
        m.setenv("SPARKDEPLOY_STATE", str(owner.state))
        inventory = load_inventory(str(owner.inventory))
        with node_hosts(inventory) as hosts:
            for node in inventory.nodes:
                host = hosts[node.name]
                with host.sudo():
                    plan = host.file(netplan.PATH)
                    assert plan.exists and plan.user == "root" and plan.mode == 0o600, node.name
                    text = plan.content_string
                assert all(name in text for name in node.fabric_ifaces) and "mtu: 9000" in text, text
                addresses = set()
                for name in node.fabric_ifaces:
                    iface = host.interface(name)
                    assert iface.link[0]["mtu"] == 9000, f"{node.name} {name} (testinfra)"
                    addresses.update(iface.addresses)
                assert node.fabric_ip.split("/")[0] in addresses, f"{node.name}: {addresses}"


@pytest.fixture(scope="module")
def day_zero(bare_lab, tmp_path_factory):
    """The README's init and setup ssh on the bare nodes, as an owner types them (the password where asked)."""
    owner = Owner(bare_lab, tmp_path_factory.mktemp("dayzero"))
    commands = dayzero_commands_in_readme(bare_lab.hosts)
    t0 = time.monotonic()
    init = owner.run(commands[0], stdin=owner.password + "\n" + "y\n" * len(bare_lab.hosts))
    nokey = owner.sd("setup", "ssh", "-i", str(owner.inventory), "--json")  # no password yet: refused
    ssh = owner.run(commands[1], stdin=owner.password + "\n")
    again = owner.sd("setup", "ssh", "-i", str(owner.inventory), "--json")
    return {"owner": owner, "commands": commands, "init": init, "nokey": nokey, "ssh": ssh, "again": again, "t0": t0}


def test_bare_nodes_look_like_a_new_pair(bare_lab):
    names = bare_lab.notes["fabric_ifaces"]
    assert names == {"spark1": "enp1s0f1np1", "spark2": "enP2p1s0f1np1"}  # the names differ between nodes
    for node, iface in names.items():
        link = json.loads(_exec(bare_lab.container(node), f"ip -j addr show dev {iface}"))[0]
        assert link["mtu"] == 1500 and "UP" in link["flags"]
        assert [a for a in link["addr_info"] if a["family"] == "inet"] == []  # up, no address
        assert _exec(bare_lab.container(node), "test -e /home/spark/.ssh/authorized_keys || echo none") == "none\n"
        assert "netplan" in _exec(bare_lab.container(node), "dpkg-query -W netplan.io")
    assert len({_exec(bare_lab.container(n), "cat /etc/machine-id") for n in names}) == 2


def test_init_and_setup_ssh_over_the_password(bare_lab, day_zero):
    init = day_zero["init"]
    assert init.returncode == 0, failure(init)
    assert f"these hosts are the sparkdeploy lab `{bare_lab.spec.name}` (SIMULATED)" in init.stdout, failure(init)
    owner = day_zero["owner"]
    text = owner.inventory.read_text()
    assert "enp1s0f1np1" in text and "enP2p1s0f1np1" in text and "PROPOSED" in text
    cluster = yaml.safe_load(text)["cluster"]  # the lab's own settings reached the inventory init wrote
    assert {k: cluster[k] for k in bare_lab.notes["lab_cluster"]} == bare_lab.notes["lab_cluster"]
    assert bare_lab.notes["fabric_subnet"] in text
    pinned = (owner.state / "known_hosts").read_text().splitlines()
    assert sorted(line.split()[0] for line in pinned) == sorted(bare_lab.hosts)
    nokey = day_zero["nokey"]  # no password given: the nodes take no key yet
    assert nokey.returncode == 1 and "does not accept the key yet" in nokey.stdout, failure(nokey)
    ssh = day_zero["ssh"]
    assert ssh.returncode == 0, failure(ssh)
    assert ssh.stdout.count("logged in with password; key added; key login works; sudo: python3 granted") == 2, (
        ssh.stdout
    )
    assert (owner.home / ".ssh" / "id_ed25519").is_file()
    again = day_zero["again"]
    assert again.returncode == 0, failure(again)
    assert [(n["login"], n["key"], n["sudo"]) for n in json.loads(again.stdout)["nodes"]] == [
        ("key", "present", {"python3": "ok"})
    ] * 2


def test_setup_network_doctor_run_recipe_and_a_first_answer(bare_lab, day_zero):
    owner, commands = day_zero["owner"], day_zero["commands"]
    inv = str(owner.inventory)
    c1 = bare_lab.container("spark1")
    dry = owner.sd("setup", "network", "-i", inv, "--dry-run", "--json")
    assert dry.returncode == 0 and {n["state"] for n in json.loads(dry.stdout)["nodes"]} == {"dry-run"}, failure(dry)
    assert _exec(c1, "ls /etc/netplan") == ""  # a dry run changes nothing

    r = owner.run(commands[2])  # the README's `sparkdeploy setup network`
    assert r.returncode == 0, failure(r)
    assert r.stdout.count("confirmed (applied by the lab's stand-in for systemd-networkd: SIMULATED)") == 2, r.stdout
    assert r.stdout.count("DF pings at MTU 9000") == 2 and " fail" not in r.stdout and "RoCE v2 GID index 3" in r.stdout
    assert "mtu 9000" in _exec(bare_lab.container("spark2"), "ip link show enP2p1s0f1np1")
    assert_network_read_by_testinfra(owner)
    again = owner.sd("setup", "network", "-i", inv, "--json")
    assert {n["state"] for n in json.loads(again.stdout)["nodes"]} == {"unchanged"}, failure(again)

    # a file the owner wrote for the port: refused with its diff; --replace takes over; --restore puts it back
    theirs = "network:\n  version: 2\n  ethernets:\n    enp1s0f1np1:\n      mtu: 1500\n"
    _exec(c1, f"printf '{theirs}' > /etc/netplan/50-owner.yaml && chmod 600 /etc/netplan/50-owner.yaml")
    refused = owner.sd("setup", "network", "-i", inv)
    assert refused.returncode == 1 and "50-owner.yaml configures the fabric" in refused.stdout, failure(refused)
    assert "-      mtu: 1500" in refused.stdout and "+      mtu: 9000" in refused.stdout
    replaced = owner.sd("setup", "network", "-i", inv, "--replace")
    assert replaced.returncode == 0, failure(replaced)
    assert _exec(c1, "ls /etc/netplan").split() == [netplan.PATH.rsplit("/", 1)[1]]
    restored = owner.sd("setup", "network", "-i", inv, "--restore")
    assert restored.returncode == 0, failure(restored)
    assert _exec(c1, "ls /etc/netplan").split() == ["50-owner.yaml"] and "mtu 1500" in _exec(
        c1, "ip link show enp1s0f1np1"
    )
    _exec(c1, "rm /etc/netplan/50-owner.yaml")
    assert owner.sd("setup", "network", "-i", inv).returncode == 0

    doctor = owner.run(commands[3])  # the README's `sparkdeploy doctor`
    assert doctor.returncode == 0, failure(doctor)
    up = owner.run(commands[4])  # the README's `run-recipe openai-gpt-oss-120b`: its images pushed, SIMULATED
    assert up.returncode == 0, failure(up)
    assert "healthy in" in up.stdout + up.stderr, failure(up)
    chat = subprocess.run(
        [sys.executable, "scripts/chat.py", "--inventory", inv, "What is a DGX Spark?"],
        capture_output=True,
        text=True,
        timeout=300,
        env=owner.env,
    )
    assert chat.returncode == 0 and chat.stdout.strip(), failure(chat)
    print(f"dayzero: bare lab to first answer in {time.monotonic() - day_zero['t0']:.1f} s (init onwards)")
    # the cluster serves over this fabric: --restore (there is something to restore) names it and refuses
    t0 = time.monotonic()
    refused = owner.sd("setup", "network", "-i", inv, "--restore")
    assert refused.returncode == 1, failure(refused)
    line = "setup network --restore would break openai-gpt-oss-120b / cluster"
    assert line in refused.stderr and "--stop-deployments" in refused.stderr, failure(refused)
    assert _exec(c1, "ls /etc/netplan").split() == [netplan.PATH.rsplit("/", 1)[1]]  # nothing restored
    status = json.loads(owner.sd("status", "-i", inv, "--json").stdout)
    assert status["healthy"], status  # still serving
    print(f"dayzero: setup network --restore refused with a cluster serving in {time.monotonic() - t0:.1f} s")
    down = owner.sd("down", "--inventory", inv)
    assert down.returncode == 0, failure(down)


def test_init_again_keeps_the_owners_edits_and_shows_the_diff(bare_lab, day_zero):
    owner = day_zero["owner"]
    text = owner.inventory.read_text()
    edited = text.replace("  name: sparks\n", "  name: my-pair\n  default_recipe: glm-4.7-flash\n") + "# my note\n"
    owner.inventory.write_text(edited)
    r = owner.run(day_zero["commands"][0], stdin=owner.password + "\n")  # the keys are pinned: no question now
    assert r.returncode == 0, failure(r)
    data = yaml.safe_load(owner.inventory.read_text())
    assert data["cluster"]["name"] == "my-pair" and data["cluster"]["default_recipe"] == "glm-4.7-flash"
    assert [n["gid_index"] for n in data["nodes"]] == [3, 3]  # read now that the link has its addresses
    assert "+    gid_index: 3" in r.stdout and "spark1.gid_index: None -> 3 (read from the node now)" in r.stdout
    assert "your comment on line" in r.stdout and "# my note" in r.stdout  # what it does not keep, said
    assert (owner.dir / "inventory.yaml.bak").read_text() == edited


def test_a_host_given_by_its_fabric_address_is_refused_and_nothing_is_pinned(bare_lab, day_zero):
    owner = day_zero["owner"]
    fabric = load_inventory(owner.inventory).nodes[0].fabric_address
    kh = owner.dir / "kh-refused"
    r = owner.sd(
        "init",
        "--hosts",
        f"{bare_lab.hosts[0]},{fabric}",
        "--user",
        "spark",
        "--known-hosts",
        str(kh),
        "--out",
        str(owner.dir / "refused.yaml"),
        "--yes",
    )
    assert r.returncode == 1 and f"{fabric}: is the same machine as {bare_lab.hosts[0]}" in r.stdout, failure(r)
    assert not kh.exists() and not (owner.dir / "refused.yaml").exists()


def test_a_change_that_cuts_management_is_undone_by_the_node(bare_lab, day_zero, monkeypatch):
    monkeypatch.setenv("HOME", str(day_zero["owner"].home))  # the owner's key (~/.ssh/id_ed25519), in-process
    inv = load_inventory(day_zero["owner"].inventory)
    node = inv.nodes[1]
    prepared: Prepared = _prepare(inv, node)
    mgmt = prepared.facts.mgmt_iface
    cut = prepared.result.text + f'    "{mgmt}":\n      addresses: ["10.254.254.1/24"]\n'  # management moves away
    prepared.result.text = cut
    start = time.monotonic()
    apply_node(inv, prepared, [], rollback_s=15)
    assert prepared.result.state == "rolled-back", prepared.result.detail
    assert "cut spark2 off the management network" in prepared.result.detail
    assert time.monotonic() - start < 90
    container = bare_lab.container("spark2")
    assert f"{node.mgmt_ip}/24" in _exec(container, f"ip -br addr show {mgmt}")  # back as it was
    assert "10.254.254.1" not in _exec(container, "cat /etc/netplan/*.yaml")
    assert day_zero["owner"].sd("setup", "network", "-i", str(day_zero["owner"].inventory)).returncode == 0
