"""`sparkdeploy init`: read every new node and write the inventory. The CLI (cli/init_cmd.py) only prints.

Order: the addresses checked -> host keys (shown, pinned once confirmed) -> one facts command per node, in
parallel (discover.read_node: facts/ set DAYZERO) -> the plan (plan.py: addresses, names, problems) -> the
commented inventory, loaded back and validated -> written (not with --dry-run, not when a problem stops it, not
over an existing file unless --force, which keeps a backup).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from sparkdeploy import names
from sparkdeploy.dayzero import discover, inventory_text
from sparkdeploy.dayzero import plan as planner
from sparkdeploy.dayzero.session import (
    Confirm,
    HostKey,
    default_known_hosts,
    key_file_problems,
    parse_hosts,
    probe_inventory,
    trusted_keys,
)
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.remote import load_host_keys, on_nodes


@dataclass
class InitOptions:
    hosts: str
    user: str | None = None
    key: str | None = None
    out: Path = Path("inventory.yaml")
    known_hosts: Path | None = None
    fabric_subnet: str | None = None
    dry_run: bool = False
    force: bool = False
    password: str | None = None  # for nodes that take only a password yet (day zero)


@dataclass
class InitResult:
    hosts: list[str]
    keys: list[HostKey] = field(default_factory=list)
    facts: list[discover.DiscoveredNode] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # hosts that could not be read
    plan: planner.InitPlan | None = None
    text: str = ""
    written: str = ""  # the path written ("" with --dry-run or a problem)
    backup: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures and self.plan is not None and not self.plan.errors

    def to_json(self) -> dict:
        return {
            "ok": self.ok,
            "hosts": self.hosts,
            "host_keys": [k.to_json() for k in self.keys],
            "failures": self.failures,
            "nodes": [f.to_json() for f in self.facts],
            "problems": [f.to_json() for f in self.plan.findings] if self.plan else [],
            "fabric_subnet": self.plan.subnet if self.plan else "",
            "inventory": self.text,
            "written": self.written,
            "backup": self.backup,
        }


def check_options(opts: InitOptions) -> list[str]:
    """Every argument checked before anything connects: the hosts (returned), the user, the key, the
    known_hosts file, the fabric subnet and --out. ConfigError with one line per problem."""
    problems: list[Problem] = []
    hosts: list[str] = []
    try:
        hosts = parse_hosts(opts.hosts)
    except ConfigError as exc:
        problems += exc.problems
    if opts.user is not None:
        problems += [p for p in [names.problem("user", opts.user, "init", "--user")] if p]
    if opts.key is not None:
        problems += key_file_problems(opts.key, "init", "--key")
    known_hosts = opts.known_hosts or default_known_hosts()
    try:
        load_host_keys(known_hosts)
    except ConfigError as exc:
        problems += exc.problems
    if opts.fabric_subnet is not None:
        problems += planner.subnet_problems(opts.fabric_subnet, len(hosts) or 1)
    if opts.out.exists() and not opts.out.is_file():
        problems.append(Problem(str(opts.out), "--out", "is not a file", "name a file, e.g. inventory.yaml"))
    elif opts.out.is_file() and not opts.force and not opts.dry_run:
        problems.append(
            Problem(str(opts.out), "--out", "exists", "pass --force to replace it (a backup is kept) or another --out")
        )
    if problems:
        raise ConfigError(problems)
    return hosts


def run_init(opts: InitOptions, confirm: Confirm) -> InitResult:
    hosts = check_options(opts)
    known_hosts = opts.known_hosts or default_known_hosts()
    # a key that does not exist yet (`setup ssh` creates it) is only written into the inventory
    login_key = opts.key if opts.key and Path(opts.key).expanduser().is_file() else None
    probe = probe_inventory(hosts, opts.user, login_key, known_hosts.resolve())
    result = InitResult(hosts)
    with trusted_keys(probe, known_hosts, confirm, opts.dry_run) as (inv, keys, failures):
        result.keys, result.failures = keys, failures
        fps = {k.host: k.fingerprint for k in keys if k.status in ("pinned", "accepted")}
        usable = [n for n in inv.nodes if n.mgmt_ip in fps]
        outcomes = on_nodes(usable, lambda n: discover.read_node(n, inv, fps[n.mgmt_ip], opts.password))
    for o in outcomes:
        if o.ok:
            result.facts.append(o.value)
        elif isinstance(o.error, StepFailed):
            result.failures.append(str(o.error))
        else:
            raise o.error  # type: ignore[misc]  # a bug, not a node's state
    if result.failures:
        return result
    result.facts.sort(key=lambda f: hosts.index(f.host))
    result.plan = planner.plan(result.facts, opts.fabric_subnet)
    if result.plan.errors:
        return result
    key = str(Path(opts.key).expanduser().resolve()) if opts.key else None
    data = planner.inventory_data(result.plan, opts.user, key, str(known_hosts.resolve()))
    result.text = inventory_text.render(result.plan, data, hosts)
    if not opts.dry_run:
        _write(opts.out, result)
    return result


def _write(path: Path, result: InitResult) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        backup = path.with_name(path.name + ".bak")
        shutil.copy2(path, backup)
        result.backup = str(backup)
    tmp = path.with_name(f".{path.name}.sparkdeploy-tmp")
    tmp.write_text(result.text)
    os.replace(tmp, path)
    result.written = str(path)
