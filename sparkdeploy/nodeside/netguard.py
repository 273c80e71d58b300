"""Runs ON a node as root (`sudo -n`, `netguard ACTION` of this package's archive): applies the fabric's netplan
file so that a change cutting the node off is undone by the node itself, the way `netplan try` does.

inspect: the netplan files (root-only on DGX OS), whether NetworkManager owns given interfaces, whether
systemd-networkd runs, and the last rollback, as JSON.
apply (JSON on stdin: path, content, takeover, timeout_s, token): saves the files it will change and the
interfaces' addresses and MTUs, writes the file (0600), checks it with `netplan generate` (undone at once if
netplan refuses it), starts a detached watcher, then applies. The watcher undoes everything after timeout_s
unless `confirm TOKEN` came first; `sparkdeploy setup network` confirms only from a NEW SSH connection, so a
change that cut the management network is undone without anyone reaching the node.
confirm TOKEN: stops the watcher ("confirmed"), or says the change was already undone ("rolled-back").
restore: puts back the files as they were before sparkdeploy first wrote its own, and applies them.

Applying: `netplan apply` where systemd runs. A lab node container has no systemd-networkd: there the
generated networkd files are applied with `ip` by a stand-in, and every answer says "standin": true (SIMULATED).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

STATE = "/var/lib/sparkdeploy/netguard"
ORIGINAL = STATE + "/original.json"  # the files before sparkdeploy's first write (for restore)
PENDING = STATE + "/pending.json"
ROLLED_BACK = STATE + "/rolled-back.json"
NETPLAN_DIR = "/etc/netplan"
NETWORKD_RUN = "/run/systemd/network"


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True)


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _write(path: str, text: str, mode: int = 0o600) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".sparkdeploy-tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _netplan_files() -> dict[str, str | None]:
    return {p: _read(p) for p in sorted(glob.glob(NETPLAN_DIR + "/*.yaml"))}


def _standin() -> bool:
    """PID 1 is not systemd (a lab node container): networkd's part is played by _apply_standin."""
    return (_read("/proc/1/comm") or "").strip() != "systemd"


def _generate() -> subprocess.CompletedProcess[str]:
    """`netplan generate`; without systemd, into / explicitly (netplan then skips `systemctl daemon-reload`)."""
    return _run(["netplan", "generate", "--root-dir", "/"] if _standin() else ["netplan", "generate"])


def _links() -> dict[str, dict[str, Any]]:
    out = _run(["ip", "-j", "addr", "show"]).stdout
    try:
        rows = json.loads(out or "[]")
    except ValueError:
        rows = []
    return {
        r["ifname"]: {
            "mtu": r.get("mtu"),
            "addrs": [f"{a['local']}/{a['prefixlen']}" for a in r.get("addr_info", []) if a.get("family") == "inet"],
        }
        for r in rows
        if r.get("ifname")
    }


def _default_routes() -> list[dict[str, str]]:
    try:
        rows = json.loads(_run(["ip", "-j", "route", "show", "default"]).stdout or "[]")
    except ValueError:
        return []
    return [{"gateway": r["gateway"], "dev": r["dev"]} for r in rows if r.get("gateway") and r.get("dev")]


def _networkd_files() -> dict[str, dict[str, Any]]:
    """What `netplan generate` wrote for networkd: {interface: {"addrs": [...], "mtu": N}}."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(glob.glob(NETWORKD_RUN + "/10-netplan-*.network")):
        name: str | None = None
        addrs: list[str] = []
        mtu: int | None = None
        for line in (_read(path) or "").splitlines():
            key, _, value = line.strip().partition("=")
            if key == "Name":
                name = value
            elif key == "Address":
                addrs.append(value)
            elif key == "MTUBytes":
                mtu = int(value)
        link = path[: -len(".network")] + ".link"
        for line in (_read(link) or "").splitlines():
            key, _, value = line.strip().partition("=")
            if key == "MTUBytes":
                mtu = int(value)
        if name:
            found[name] = {"addrs": addrs, "mtu": mtu}
    return found


def _set_link(name: str, addrs: list[str], mtu: int | None) -> None:
    if name not in _links():
        return
    _run(["ip", "-4", "addr", "flush", "dev", name])
    if mtu:
        _run(["ip", "link", "set", "dev", name, "mtu", str(mtu)])
    for a in addrs:
        _run(["ip", "addr", "add", a, "dev", name])
    _run(["ip", "link", "set", "dev", name, "up"])


def _apply_standin() -> list[str]:
    """SIMULATED systemd-networkd: the generated files' addresses and MTUs, set with ip."""
    wanted = _networkd_files()
    for name, cfg in wanted.items():
        _set_link(name, cfg["addrs"], cfg["mtu"])
    return sorted(wanted)


def _apply() -> dict[str, Any]:
    if _standin():
        return {"standin": True, "interfaces": _apply_standin()}
    r = _run(["netplan", "apply"])
    return {"standin": False, "rc": r.returncode, "error": r.stderr.strip()[-400:]}


def _restore_files(files: dict[str, str | None]) -> None:
    for path in list(_netplan_files()):
        if path not in files:
            os.remove(path)
    for path, text in files.items():
        if text is not None:
            _write(path, text)


def _rollback(pending: dict[str, Any], reason: str) -> None:
    _restore_files(pending["files"])
    if _standin():
        generated = _generate()
        for name in pending["touched"]:  # what the change set, back as the snapshot had it
            before = pending["links"].get(name)
            if before is not None:
                _set_link(name, before["addrs"], before["mtu"])
        for route in pending.get("routes", []):  # flushing an address drops the routes through it
            _run(["ip", "route", "replace", "default", "via", route["gateway"], "dev", route["dev"]])
        _apply_standin() if generated.returncode == 0 else None
    else:
        _run(["netplan", "apply"])
    _write(ROLLED_BACK, json.dumps({"token": pending["token"], "reason": reason, "at": time.time()}), 0o644)
    try:
        os.remove(PENDING)
    except OSError:
        pass


def _watch(token: str, deadline: float) -> None:
    """The detached watcher: confirmed in time -> done; else undo the change."""
    confirmed = f"{STATE}/confirmed-{token}"
    while time.time() < deadline:
        if os.path.exists(confirmed):
            os.remove(confirmed)
            try:
                os.remove(PENDING)
            except OSError:
                pass
            return
        time.sleep(0.25)
    pending = json.loads(_read(PENDING) or "null")
    if pending and pending.get("token") == token:
        _rollback(pending, f"not confirmed within {pending['timeout_s']} s")


def _detach(token: str, deadline: float) -> None:
    """Double fork: the watcher outlives this command and the SSH session (new session, stdio on /dev/null)."""
    if os.fork() != 0:
        return
    os.setsid()
    if os.fork() != 0:
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        _watch(token, deadline)
    finally:
        os._exit(0)


def inspect(ifaces: list[str]) -> dict[str, Any]:
    nm: dict[str, str] = {}
    if shutil.which("nmcli"):
        out = _run(["nmcli", "-t", "-f", "DEVICE,STATE", "device"]).stdout
        for line in out.splitlines():
            dev, _, state = line.partition(":")
            if dev in ifaces:
                nm[dev] = state
    return {
        "files": _netplan_files(),
        "networkmanager": nm,
        "standin": _standin(),
        "pending": json.loads(_read(PENDING) or "null"),
        "rolled_back": json.loads(_read(ROLLED_BACK) or "null"),
        "original": os.path.exists(ORIGINAL),
    }


def apply(cfg: dict[str, Any]) -> dict[str, Any]:
    if os.path.exists(PENDING):
        old = json.loads(_read(PENDING) or "{}")
        if old.get("deadline", 0) > time.time():
            return {"error": "another change waits for its confirmation", "token": old.get("token")}
    os.makedirs(STATE, mode=0o700, exist_ok=True)
    files = _netplan_files()
    links = _links()
    original = json.loads(_read(ORIGINAL) or "null") or {
        "files": {p: c for p, c in files.items() if p != cfg["path"]},
        "links": links,
    }
    for path in cfg.get("takeover", []):  # a file taken over is kept for restore as it is now
        if path in files and path != cfg["path"]:
            original["files"][path] = files[path]
    _write(ORIGINAL, json.dumps(original))
    pending = {
        "token": cfg["token"],
        "timeout_s": cfg["timeout_s"],
        "deadline": time.time() + cfg["timeout_s"],
        "files": files,
        "links": links,
        "routes": _default_routes(),
        "touched": [],
    }
    for path in cfg.get("takeover", []):
        if path in files and path != cfg["path"]:
            os.remove(path)
    _write(cfg["path"], cfg["content"])
    generated = _generate()
    if generated.returncode != 0:
        _restore_files(files)
        return {"error": "netplan generate refused the file: " + generated.stderr.strip()[-600:]}
    pending["touched"] = sorted(_networkd_files())
    _write(PENDING, json.dumps(pending))
    try:
        os.remove(ROLLED_BACK)
    except OSError:
        pass
    _detach(cfg["token"], pending["deadline"])
    result = _apply()
    result.update({"token": cfg["token"], "timeout_s": cfg["timeout_s"], "touched": pending["touched"]})
    return result


def confirm(token: str) -> dict[str, Any]:
    done = json.loads(_read(ROLLED_BACK) or "null")
    if done and done.get("token") == token:
        return {"state": "rolled-back", "reason": done.get("reason", "")}
    pending = json.loads(_read(PENDING) or "null")
    if not pending or pending.get("token") != token:
        return {"state": "unknown"}
    _write(f"{STATE}/confirmed-{token}", "", 0o600)
    for _ in range(40):  # the watcher sees it within 0.25 s
        if not os.path.exists(PENDING):
            return {"state": "confirmed"}
        time.sleep(0.1)
    return {"state": "confirmed-late"}


def restore() -> dict[str, Any]:
    original = json.loads(_read(ORIGINAL) or "null")
    if original is None:
        return {"state": "nothing-to-restore"}
    touched = sorted(_networkd_files())
    _restore_files(original["files"])
    if _standin():
        _generate()
        for name in touched:  # the interfaces sparkdeploy's file set: as they were before it
            before = original["links"].get(name)
            if before is not None:
                _set_link(name, before["addrs"], before["mtu"])
        _apply_standin()
        applied: dict[str, Any] = {"standin": True}
    else:
        r = _run(["netplan", "apply"])
        applied = {"standin": False, "rc": r.returncode}
    os.remove(ORIGINAL)
    return dict(applied, state="restored", files=sorted(original["files"]))


def main(argv: list[str]) -> int:
    action = argv[0] if argv else ""
    if action == "inspect":
        out = inspect(json.loads(argv[1]) if len(argv) > 1 else [])
    elif action == "apply":
        out = apply(json.loads(sys.stdin.read()))
    elif action == "confirm" and len(argv) > 1:
        out = confirm(argv[1])
    elif action == "restore":
        out = restore()
    else:
        print("usage: netguard inspect IFACES_JSON | apply < CONFIG_JSON | confirm TOKEN | restore", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 1 if "error" in out else 0
