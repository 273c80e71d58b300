"""The guard's loop: sample, decide, act, record.

Every `interval_s` (0.2 s: five samples a second) it reads the node's available memory (memory.py decides
where from) and PSI. Lines, in bytes of available memory:
- soft: drop the page cache (write 3 to the host's /proc/sys/vm/drop_caches, bound into the container: the one
  privilege the soft line needs, as root; in the lab the page cache is the host's, so it is skipped and said so)
  and warn: state `soft` in status.json, which `status`, `top` and `logs` show. At most once every 10 s.
- hard (or PSI `full` avg10 at or above `psi_full_hard`): stop the node's engine containers through the Docker
  socket: restart policy `no` first (so neither Docker nor a reboot brings them straight back into the same
  wall), then Docker's stop (SIGTERM, SIGKILL after `grace_s`), all engines at once. State `held` with the
  reason, until an engine runs again (`sparkdeploy up` after the pressure ended starts it: the plan sees it
  stopped and converges).
Once a second it writes a sample to the black box (ring.py) and status.json (atomically: a temp file renamed).

Beside it, in its own thread, the watcher (watch.py; `watch.enabled` in the config): it restarts a group of engine
containers that stopped serving, and gives up after too many restarts. It never starts an engine this guard
stopped (restart policy `no`, state `held`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from . import memory
from .dockerapi import Docker, DockerError
from .ring import GAP_S, Ring
from .watch import Watcher

MANAGED = "io.sparkdeploy.managed=true"
ROLE_LABEL = "io.sparkdeploy.role"
NOT_ENGINES = ("guard", "proxy", "metrics")
KMSG_PATTERN = re.compile(r"out of memory|oom[-_ ]kill|oom-killer|\bxid\b|\baer\b|pcie bus error", re.I)
DROP_EVERY_S = 10.0
GPU_EVERY_S = 15.0
RESTARTS_EVERY_S = 5.0
STATUS = "status.json"
MiB = 1 << 20


def lines(cfg: dict[str, Any], total: int) -> tuple[int, int]:
    """(soft, hard) in bytes of available memory: the absolute values when given, else the fractions of total."""
    soft = cfg.get("soft_bytes") or int(total * cfg["soft_fraction"])
    hard = cfg.get("hard_bytes") or int(total * cfg["hard_fraction"])
    return soft, hard


def decide(avail: int, psi: dict[str, float] | None, soft: int, hard: int, psi_full_hard: float) -> tuple[str, str]:
    """'hard', 'soft' or 'ok', and why (one line)."""
    if avail < hard:
        return "hard", f"available memory {avail // MiB} MiB < hard line {hard // MiB} MiB"
    if psi is not None and psi_full_hard and psi["full10"] >= psi_full_hard:
        return "hard", f"memory pressure full avg10 {psi['full10']:.1f}% >= {psi_full_hard:.1f}%"
    if avail < soft:
        return "soft", f"available memory {avail // MiB} MiB < soft line {soft // MiB} MiB"
    return "ok", ""


def gpu_sample(simulated: bool) -> dict[str, Any]:
    """Temperature (C), SM clock (MHz) and power (W) from nvidia-smi; in the lab a labelled stand-in."""
    if simulated:
        return {"source": "SIMULATED (lab stand-in)", "temp_c": 45, "sm_mhz": 2405, "power_w": 30.0}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=temperature.gpu,clocks.sm,power.draw", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"source": "nvidia-smi", "error": str(exc)[:80]}
    cells = [c.strip() for c in out.stdout.splitlines()[0].split(",")] if out.stdout.strip() else []
    if out.returncode or len(cells) < 3:
        return {"source": "nvidia-smi", "error": (out.stderr.strip() or "no output")[:80]}

    def num(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:
            return None

    return {"source": "nvidia-smi", "temp_c": num(cells[0]), "sm_mhz": num(cells[1]), "power_w": num(cells[2])}


class Kmsg:
    """New kernel messages about OOM, Xid and PCIe AER, from /dev/kmsg when readable (else a note)."""

    def __init__(self, path: str = "/dev/kmsg") -> None:
        self.fd: int | None = None
        self.note: str | None = None
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self.fd, 0, os.SEEK_END)  # only what happens from now on
        except OSError as exc:
            self.note = f"kernel messages unreadable ({path}: {exc.strerror})"

    def read(self) -> list[str]:
        found: list[str] = []
        while self.fd is not None:
            try:
                raw = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: messages overwritten before we read them; go on from the next one
                continue
            if not raw:
                break
            text = raw.decode(errors="replace").split(";", 1)[-1].splitlines()[0]
            if KMSG_PATTERN.search(text):
                found.append(text[:200])
        return found


class Guard:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.folder = cfg["state"]
        os.makedirs(self.folder, exist_ok=True)
        self.docker = Docker(cfg.get("socket", "/var/run/docker.sock"))
        self.source = memory.memory_source(cfg.get("proc", "/proc"), cfg.get("cgroup_root", "/host/cgroup"))
        self.psi_note = memory.psi_note(cfg.get("proc", "/proc"))
        self.kmsg = Kmsg(cfg.get("kmsg", "/dev/kmsg"))
        self.boot = memory.boot_id(cfg.get("proc", "/proc"))[:8]
        self.ring = Ring(self.folder, cfg.get("sync_s", 1.0))
        self.state, self.reason, self.since = "ok", "", time.time()
        self.last_stop: dict[str, Any] | None = None
        self.dropped_at = 0.0
        self.restarts: dict[str, int] = {}
        self.gpu: dict[str, Any] | None = None
        self.error: str | None = None
        self.previous_end = self._previous_end()
        watch = cfg.get("watch") or {}
        self.watcher: Watcher | None = None
        self.stopping = threading.Event()
        if watch.get("enabled"):
            self.watcher = Watcher(watch, self.docker, cfg.get("node"), self.folder, lambda: self.state, self.said)

    def said(self, msg: str) -> None:
        """A line of the watcher's: the container's log (`sparkdeploy logs`) and an event in the black box."""
        print(f"guard: {msg}", flush=True)
        self.event("watch", msg)

    def start_watcher(self) -> None:
        """The watcher's loop in its own thread (a group restart waits on Docker; the memory loop never does), and
        its endpoint for the other nodes' watchers (a port taken: said, and the watcher runs without it)."""
        if self.watcher is None:
            return
        watch = self.cfg["watch"]
        try:
            self.watcher.serve(watch.get("listen") or "0.0.0.0", watch.get("port", 7390))
        except OSError as exc:
            self.watcher.error = f"cannot answer on {watch.get('listen')}:{watch.get('port')}: {exc.strerror}"
            print(f"guard: watch: {self.watcher.error}", flush=True)
        threading.Thread(target=self.watcher.run, args=(self.stopping,), name="watch", daemon=True).start()
        print(f"guard: watch: restarting groups that stop serving ({watch})", flush=True)

    def _previous_end(self) -> dict[str, Any] | None:
        """How the record before this start ended, when it broke off (reboot, power-off, the guard killed)."""
        prev = self.ring.previous
        if prev is None:
            return None
        if prev.get("boot") and prev["boot"] != self.boot:
            kind = "reboot or power-off"
        elif time.time() - prev.get("t", 0) > GAP_S and prev.get("ev") != "exit":
            kind = "guard stopped without a clean exit"
        else:
            return None
        return {"kind": kind, "last_sample_at": prev.get("t"), "last": prev}

    def event(self, ev: str, msg: str, **extra: Any) -> None:
        self.ring.write(
            {"kind": "e", "t": round(time.time(), 2), "boot": self.boot, "ev": ev, "msg": msg, **extra}, True
        )

    def engines(self) -> list[dict[str, Any]]:
        found = self.docker.containers(MANAGED)
        return [c for c in found if (c.get("Labels") or {}).get(ROLE_LABEL) not in NOT_ENGINES]

    def stop_engines(self, why: str) -> list[str]:
        t0 = time.monotonic()
        running = self.engines()
        stopped: list[str] = []
        errors: list[str] = []

        def stop(c: dict[str, Any]) -> None:
            name = (c.get("Names") or ["?"])[0].lstrip("/")
            try:
                self.docker.no_restart(c["Id"])
                self.docker.stop(c["Id"], self.cfg["grace_s"])
                stopped.append(name)
            except DockerError as exc:
                errors.append(f"{name}: {exc}")

        threads = [threading.Thread(target=stop, args=(c,)) for c in running]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - t0
        self.last_stop = {
            "at": time.time(),
            "reason": why,
            "engines": sorted(stopped),
            "errors": errors,
            "stop_s": round(took, 3),
        }
        self.event(
            "stopped", f"{why}: stopped {', '.join(sorted(stopped)) or 'nothing'} in {took:.2f} s", stop=self.last_stop
        )
        return stopped

    def drop_caches(self) -> str:
        path = self.cfg.get("drop_caches", "/host/drop_caches")
        if self.source.kind == "cgroup":
            return "page cache drop skipped: SIMULATED memory (lab): the page cache is the host's"
        try:
            with open(path, "w") as f:
                f.write("3\n")
            return "page cache dropped"
        except OSError as exc:
            return f"page cache drop failed ({path}: {exc.strerror})"

    def write_status(self, avail: int, total: int, psi: dict[str, float] | None, soft: int, hard: int) -> None:
        data = {
            "node": self.cfg.get("node"),
            "state": self.state,
            "reason": self.reason,
            "since": self.since,
            "updated": time.time(),
            "memory_source": self.source.kind,
            "memory_label": self.source.label,
            "available_mb": avail // MiB,
            "total_mb": total // MiB,
            "soft_mb": soft // MiB,
            "hard_mb": hard // MiB,
            "psi": psi and {"some10": psi["some10"], "full10": psi["full10"]},
            "psi_note": self.psi_note,
            "kmsg_note": self.kmsg.note,
            "gpu": self.gpu,
            "last_stop": self.last_stop,
            "previous_end": self.previous_end,
            "error": self.error,
            "pid": os.getpid(),
            "watch": None if self.watcher is None else self.watcher.status(),
        }
        tmp = os.path.join(self.folder, STATUS + ".tmp")
        with open(tmp, "w") as f:
            json.dump(data, f, sort_keys=True)
        os.replace(tmp, os.path.join(self.folder, STATUS))

    def check_restarts(self) -> bool | None:
        try:
            for c in self.engines():
                info = self.docker.inspect(c["Id"])
                name = info["Name"].lstrip("/")
                count = info.get("RestartCount", 0)
                if name in self.restarts and count > self.restarts[name]:
                    self.event("restart", f"{name} restarted (count {count})")
                self.restarts[name] = count
            return any(c.get("State") == "running" for c in self.engines())
        except DockerError as exc:
            self.error = str(exc)[:200]
            return None

    def run(self, max_s: float | None = None) -> int:
        cfg = self.cfg
        avail, total = self.source.read()
        soft, hard = lines(cfg, total)
        if hard >= total or soft >= total:
            self.state, self.reason = "refused", f"a guard line is above the node's memory ({total // MiB} MiB)"
            self.write_status(avail, total, None, soft, hard)
            print(self.reason, file=sys.stderr)
            return 2
        note = f"memory: {self.source.label}; soft {soft // MiB} MiB, hard {hard // MiB} MiB"
        self.event(
            "start",
            note + (f"; {self.psi_note}" if self.psi_note else "") + (f"; {self.kmsg.note}" if self.kmsg.note else ""),
        )
        print(f"guard: {note}", flush=True)
        for msg in filter(None, (self.psi_note, self.kmsg.note)):
            print(f"guard: {msg}", flush=True)
        if self.previous_end:
            print(f"guard: the previous record ended: {self.previous_end['kind']}", flush=True)
        self.start_watcher()
        start = time.monotonic()
        next_record = next_gpu = next_restarts = 0.0
        prev_psi = memory.read_psi(cfg.get("proc", "/proc"))
        worst = None
        while max_s is None or time.monotonic() - start < max_s:
            now = time.monotonic()
            avail, total = self.source.read()
            soft, hard = lines(cfg, total)  # the lab's limit can change under a running node (docker update)
            psi = memory.read_psi(cfg.get("proc", "/proc"))
            level, why = decide(avail, psi, soft, hard, cfg.get("psi_full_hard", 0))
            worst = avail if worst is None else min(worst, avail)
            if level == "hard" and self.state != "held":
                print(f"guard: HARD line: {why}", flush=True)
                self.event("hard", why)
                stopped = self.stop_engines(why)
                if stopped:
                    self.state, self.reason, self.since = "held", f"engines stopped: {why}", time.time()
                    print(
                        f"guard: stopped {', '.join(stopped)} in {(self.last_stop or {}).get('stop_s')} s", flush=True
                    )
                    self.write_status(avail, total, psi, soft, hard)
            elif level == "soft" and self.state in ("ok", "soft") and time.time() - self.dropped_at >= DROP_EVERY_S:
                done = self.drop_caches()
                self.dropped_at = time.time()
                self.state, self.reason, self.since = "soft", f"{why}; {done}", time.time()
                print(f"guard: soft line: {self.reason}", flush=True)
                self.event("soft", self.reason)
            elif level == "ok" and self.state == "soft":
                self.state, self.reason, self.since = "ok", "", time.time()
            for line in self.kmsg.read():
                self.event("kmsg", line)
            if now >= next_restarts:
                next_restarts = now + RESTARTS_EVERY_S
                running = self.check_restarts()
                if self.state == "held" and running:
                    self.state, self.reason, self.since = "ok", "", time.time()  # `up` started the engine again
            if now >= next_gpu:
                next_gpu = now + GPU_EVERY_S
                self.gpu = gpu_sample(cfg.get("simulated_gpu", False))
            if now >= next_record:
                next_record = now + 1.0
                deltas = None
                if psi is not None and prev_psi is not None:
                    deltas = [psi["some_total"] - prev_psi["some_total"], psi["full_total"] - prev_psi["full_total"]]
                record = {
                    "kind": "s",
                    "t": round(time.time(), 2),
                    "boot": self.boot,
                    "avail_mb": worst // MiB,
                    "total_mb": total // MiB,
                    "psi": psi and [psi["some10"], psi["full10"], *(deltas or [])],
                    "state": self.state,
                    "gpu": self.gpu,
                    "restarts": self.restarts,
                }
                self.ring.write(record)
                self.write_status(avail, total, psi, soft, hard)
                prev_psi, worst = psi, None
            time.sleep(max(0.0, cfg.get("interval_s", 0.2) - (time.monotonic() - now)))
        return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 -m guard CONFIG (JSON)", file=sys.stderr)
        return 2
    cfg = json.loads(argv[0])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # docker stop: record a clean exit
    guard = Guard(cfg)
    try:
        return guard.run(cfg.get("max_s"))
    except KeyboardInterrupt:
        return 0
    finally:
        guard.stopping.set()
        guard.event("exit", "guard stopped")
        guard.ring.close()
