"""`sparkdeploy init`: read every new node and write the inventory. The CLI (cli/init_cmd.py) only prints.

Order: the addresses checked -> host keys (shown; a confirmed one serves this run) -> one facts command per
node, in parallel (discover.read_node: facts/ set DAYZERO) -> the proposal (proposal.py: addresses, names, problems) ->
the commented inventory, loaded back and validated -> written (not with --dry-run, not when a problem stops it),
and only then the confirmed host keys pinned.

Run again over an inventory it wrote (the file's own comments ask for it once the link has addresses), `init`
merges: the owner's edits are kept, the nodes' new readings replace the old (plan.merge), and the diff is shown;
--force replaces the file instead (the diff says what goes). Hosts that are a bare lab of this machine (`lab up
--bare`'s notes list them, and their GPUs say SIMULATED) get the lab's own settings in the inventory: its
SIMULATED engine, its model hub, its secrets file, its fabric subnet, so the README's next commands serve.
"""

from __future__ import annotations

import difflib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkdeploy import names, paths
from sparkdeploy.config.userfile import load_json_file, load_yaml_file, read_text
from sparkdeploy.dayzero import discover, inventory_text
from sparkdeploy.dayzero import proposal as planner
from sparkdeploy.dayzero.login import (
    Confirm,
    HostKey,
    default_known_hosts,
    key_file_problems,
    parse_hosts,
    pin,
    probe_inventory,
    trusted_keys,
)
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.runtime.remote import load_host_keys, on_nodes


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
    lab: dict[str, Any] | None = None  # the bare lab these hosts are (its notes), whose settings were added
    merged: bool = False  # the file existed: merged with the owner's (False with --force: replaced)
    changes: list[str] = field(default_factory=list)  # what the merge replaced or dropped
    diff: str = ""  # the existing file -> the new one

    @property
    def ok(self) -> bool:
        return not self.failures and self.plan is not None and not self.plan.errors

    def to_json(self) -> dict[str, Any]:
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
            "lab": self.lab["name"] if self.lab else None,
            "merged": self.merged,
            "changes": self.changes,
            "diff": self.diff,
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
    if problems:
        raise ConfigError(problems)
    return hosts


def run_init(opts: InitOptions, confirm: Confirm) -> InitResult:
    hosts = check_options(opts)
    known_hosts = opts.known_hosts or default_known_hosts()
    old = _existing(opts.out) if opts.out.is_file() and not opts.force else None
    # a key that does not exist yet (`setup ssh` creates it) is only written into the inventory
    login_key = opts.key if opts.key and Path(opts.key).expanduser().is_file() else None
    probe = probe_inventory(hosts, opts.user, login_key, known_hosts.resolve())
    result = InitResult(hosts, lab=lab_notes(hosts))
    with trusted_keys(probe, known_hosts, confirm) as (inv, keys, failures):
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
    if result.lab is not None and not all(f.simulated for f in result.facts):
        result.lab = None  # the lab's addresses, but real nodes answer: not the lab
    lab_subnet = result.lab.get("fabric_subnet") if result.lab else None
    result.plan = planner.plan(result.facts, opts.fabric_subnet or lab_subnet)
    if result.plan.errors:
        return result
    key = str(Path(opts.key).expanduser().resolve()) if opts.key else None
    data = planner.inventory_data(result.plan, opts.user, key, str(known_hosts.resolve()))
    if result.lab is not None:
        data["cluster"].update(result.lab.get("lab_cluster") or {})
    if old is not None:
        data, result.changes = planner.merge(old, data)
        result.merged = True
    result.text = inventory_text.render(result.plan, data, hosts, result.lab["name"] if result.lab else None)
    try:  # the diff against what is there (--force replaces even a file that cannot be read: no diff then)
        before = read_text(opts.out, "inventory") if opts.out.is_file() else None
    except ConfigError:
        before = None
    if before is not None:
        lines = difflib.unified_diff(
            before.splitlines(), result.text.splitlines(), str(opts.out), f"{opts.out} (new)", lineterm=""
        )
        result.diff = "\n".join(lines)
        result.changes += [
            f"your comment on line {i} is not kept: {line.strip()}"
            for i, line in enumerate(before.splitlines(), 1)
            if line.lstrip().startswith("#") and not inventory_text.ours(line) and line not in result.text.splitlines()
        ]
    if not opts.dry_run:
        _write(opts.out, result)
        pin(known_hosts, probe, result.keys)  # only now: a host init refused gets nothing pinned
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


def lab_notes(hosts: list[str]) -> dict[str, Any] | None:
    """The bare lab of this machine whose nodes these hosts are (`lab up --bare` wrote its notes), or None."""
    for path in paths.bare_lab_notes():
        try:
            notes = load_json_file(path, "bare lab notes")
        except ConfigError:  # another lab's notes, half written or not ours: not this lab
            continue
        if isinstance(notes, dict) and set(hosts) <= set(notes.get("hosts") or []):
            return {**notes, "name": path.parent.name.removeprefix("lab-")}
    return None


def _existing(path: Path) -> dict[str, Any]:
    """The inventory `init` will merge into (the owner's), read through the one door, or one line saying why it
    cannot."""
    fix = "fix it, pass --force to replace it (a backup is kept), or another --out"
    data = load_yaml_file(path, "inventory to merge into", fix)
    if isinstance(data, dict) and isinstance(data.get("nodes"), list):
        return data
    raise ConfigError(Problem(str(path), "--out", "is not an inventory to merge into (no nodes: list)", fix))
