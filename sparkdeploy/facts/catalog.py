"""Every fact sparkdeploy reads from a node, declared once: its shell command and its typed parser.

FACTS is the one registry; STATE, RESOURCES, DOCTOR, DAYZERO and ACCESS name the sets the readers ask for
(facts/read.py runs the set asked in one round trip). Every command only looks. Add a fact: one `Fact(...)`
here, a field of NodeFacts (facts/node.py) for its value, and a unit test of its parser fed a real node's output.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sparkdeploy import healthcheck
from sparkdeploy.config.guard_settings import GUARD_FOLDER, STACK_UNIT
from sparkdeploy.config.userfile import parse_json
from sparkdeploy.errors import ConfigError
from sparkdeploy.labels import LABEL_PREFIX, MANAGED_LABEL
from sparkdeploy.nodeside.guard.run import STATUS

from .node import (
    RESOURCE_FACTS,
    ContainerFact,
    CrashRecords,
    DiskUsage,
    FileFact,
    GpuFact,
    ImageStoreFact,
    NetworkFact,
    NodeFacts,
    RdmaFact,
    StateDirFact,
    health_probes,
)
from .parsers import (
    Section,
    parse_ethtool_speed,
    parse_ibv_devinfo,
    parse_ip_json,
    parse_max_mtu,
    parse_nvidia_smi_csv,
    parse_rdma_link,
    parse_show_gids,
)
from .script import Fact

# What an engine's log says when it died (vLLM's EngineDeadError and engine core errors, the launcher's and
# vllm-sim's "engine dead: RankFailure", Ray's dead actors, NCCL errors); grep -E, no single quote. ENGINE_DEAD:
# the words that say it for certain (plan.failing trusts them for an engine Docker still calls `starting`).
ENGINE_DEAD = r"engine dead|EngineDeadError|EngineCoreError|RankFailure|RayActorError|ActorDiedError"
ENGINE_DEATH = ENGINE_DEAD + r"|NCCL error|Traceback|Error:"
GPU_FIELDS = ["index", "name", "driver_version", "memory.total", "memory.used", "memory.free", "temperature.gpu"]

# Only the fields we read: never Config.Env (it holds the values of --env-file secrets.env).
_INSPECT = (
    '{"id":{{json .Id}},"name":{{json .Name}},"image":{{json .Image}},"ref":{{json .Config.Image}},'
    '"labels":{{json .Config.Labels}},"status":{{json .State.Status}},"running":{{json .State.Running}},'
    '"restarting":{{json .State.Restarting}},"exit_code":{{json .State.ExitCode}},'
    '"started":{{json .State.StartedAt}},"finished":{{json .State.FinishedAt}},'
    '"restarts":{{json .RestartCount}},"state":{{json .State}}}'
)
# `.State.Health` named in the template fails on engines where State is a map and the container has no health
# check ("map has no entry for key"), so the whole State is read and its Health taken here (as crashes.py does).


def _int(text: str) -> int | None:
    try:
        return int(float(text.strip()))
    except (TypeError, ValueError):
        return None


def _set(name: str) -> Any:
    def store(f: NodeFacts, value: Any) -> None:
        setattr(f, name, value)

    return store


# -- the node and its Docker engine ----------------------------------------------------------------------------


def _docker(sec: Section) -> tuple[bool, str, str]:
    lines = sec.out.splitlines()
    if lines and lines[0].startswith("ok "):
        return True, lines[0].split()[1] if len(lines[0].split()) > 1 else "", ""
    return False, "", " ".join(line.strip() for line in lines[1:] if line.strip()) or "docker did not answer"


def _store_docker(f: NodeFacts, v: tuple[bool, str, str]) -> None:
    f.docker_ok, f.docker_version, f.docker_error = v


def _docker_info(sec: Section) -> tuple[str, str]:
    root, _, driver = (sec.out.strip().splitlines() or [""])[-1].partition("|")
    return root, driver


def _store_docker_info(f: NodeFacts, v: tuple[str, str]) -> None:
    f.docker_root, f.docker_driver = v


def _user(sec: Section) -> tuple[str, list[str]]:
    lines = sec.out.splitlines()
    return (lines[0].strip() if lines else ""), (lines[1].split() if len(lines) > 1 else [])


def _store_user(f: NodeFacts, v: tuple[str, list[str]]) -> None:
    f.user, f.groups = v


def _ids(sec: Section) -> tuple[str, str]:
    """`id -u; id -g`: the SSH user's numeric user and group ("" where not read)."""
    words = sec.out.split()
    return (words[0], words[1]) if len(words) >= 2 and words[0].isdigit() and words[1].isdigit() else ("", "")


def _store_ids(f: NodeFacts, v: tuple[str, str]) -> None:
    f.uid, f.gid = v


def _missing_folders(sec: Section) -> list[str]:
    """The folders of `$hf/hub` and above that do not exist, innermost first (one absolute path a line)."""
    return [line for line in sec.out.splitlines() if line.startswith("/")]


# The image store (ImageStoreFact): engine facts, then one JSON line per image. No values interpolated.
_IMAGE_FORMAT = (
    '{"id":{{json .Id}},"tags":{{json .RepoTags}},"layers":{{json .RootFS.Layers}},'
    '"labels":{{if .Config}}{{json .Config.Labels}}{{else}}null{{end}},"size":{{.Size}}}'
)
IMAGE_STORE = r"""
docker version --format '{{.Server.Version}}' >/dev/null || return 90
docker info --format 'info {"root":{{json .DockerRootDir}},"driver":{{json .Driver}},"status":{{json .DriverStatus}},"version":{{json .ServerVersion}}}' || return 90
root=$(docker info --format '{{.DockerRootDir}}')
echo "df $(df -PB1 "$root" 2>/dev/null | awk 'NR==2 {print $4}')"
echo "zstd $(command -v zstd >/dev/null 2>&1 && echo yes || echo no)"
ids=$(docker image ls -aq --no-trunc | sort -u)
[ -z "$ids" ] || docker image inspect --format 'image FORMAT' $ids || return 91
""".replace("FORMAT", _IMAGE_FORMAT)  # noqa: E501 - shell lines run as written


def image_store(sec: Section) -> ImageStoreFact:
    """`info JSON`, `df BYTES`, `zstd yes|no`, then `image JSON` per image (the IMAGE_STORE read)."""
    fact = ImageStoreFact(rc=sec.rc)
    if sec.rc not in (0, None):
        fact.error = " | ".join((sec.err or sec.out).strip().splitlines()[-3:])
    for line in sec.out.splitlines():
        kind, _, rest = line.partition(" ")
        try:
            value = json.loads(rest) if kind in ("info", "image") else None
        except ValueError:  # a cut line: not a record
            continue
        if kind == "info" and isinstance(value, dict):
            fact.info = value
        elif kind == "df":
            fact.free_bytes = int(rest) if rest.strip().isdigit() else None
        elif kind == "zstd":
            fact.zstd = rest.strip() == "yes"
        elif kind == "image" and isinstance(value, dict):
            fact.images.append(value)
    return fact


# How our containers ended (CrashRecords): the whole State (a map on some engines, where a missing Health key
# fails a template that names it), never Env; the engine's die/oom/kill events (a container its restart policy
# brought back shows `running` again and no longer says how it died). --until to the nanosecond: a whole-second
# bound left out a die event of the current second, so an engine that had just crashed read as "exited (code
# unknown)". The engine keeps its last 256 events in memory: a day back is as far as it is worth asking.
CRASH_HISTORY_S = 24 * 3600
CRASH_SECTION = "@@sparkdeploy-crashes@@"
_CRASH_INSPECT = (
    '{"id":{{json .Id}},"name":{{json .Name}},"state":{{json .State}},"restarts":{{json .RestartCount}},'
    '"role":{{json (index .Config.Labels "' + LABEL_PREFIX + '.role")}}}'
)
_CRASH_EVENT = (
    '{"action":{{json .Action}},"time":{{json .TimeNano}},"id":{{json .Actor.ID}},'
    '"code":{{json (index .Actor.Attributes "exitCode")}}}'
)
CRASHES = (
    r"""label='"""
    + MANAGED_LABEL
    + r"""'; since=$(( $(date +%s) - """
    + str(CRASH_HISTORY_S)
    + r""" ))
printf '%s inspect\n' '"""
    + CRASH_SECTION
    + r"""'
ids=$(docker ps -aq --no-trunc --filter "label=$label=true" 2>/dev/null)
[ -n "$ids" ] && docker inspect --format '"""
    + _CRASH_INSPECT.replace("'", "'\\''")
    + r"""' $ids 2>/dev/null
printf '%s events\n' '"""
    + CRASH_SECTION
    + r"""'
docker events --since "$since" --until "$(date +%s.%N)" --filter type=container --filter "label=$label=true" \
  --filter event=die --filter event=oom --filter event=kill \
  --format '"""
    + _CRASH_EVENT.replace("'", "'\\''")
    + r"""' 2>/dev/null
printf '%s now\n' '"""
    + CRASH_SECTION
    + r"""'
date -u +%Y-%m-%dT%H:%M:%SZ
"""
)


def _crash_json(lines: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for line in lines:
        try:
            value = parse_json(line, "crash record")
        except ConfigError:  # a node's line, through the one door's JSON reader: a bad one is skipped
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def crash_records(sec: Section) -> CrashRecords:
    """The CRASHES read: `@@sparkdeploy-crashes@@ inspect|events|now` then its lines (pure)."""
    parts: dict[str, list[str]] = {}
    name = None
    for line in sec.out.splitlines():
        if line.startswith(CRASH_SECTION + " "):
            name = line[len(CRASH_SECTION) + 1 :].strip()
            parts[name] = []
        elif name is not None and line.strip():
            parts[name].append(line.strip())
    return CrashRecords(
        _crash_json(parts.get("inspect", [])), _crash_json(parts.get("events", [])), (parts.get("now") or [""])[0]
    )


def _names(sec: Section) -> dict[str, str]:
    """`docker ps -a` ID, managed label, names -> the names of containers that are NOT ours (name -> id)."""
    other: dict[str, str] = {}
    for line in sec.out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3:
            cid, managed, names = parts
        elif len(parts) == 2:  # an empty label value collapses to two fields
            cid, names = parts
            managed = ""
        else:
            continue
        if managed != "true":
            for name in names.split(","):
                other[name.strip()] = cid
    return other


def _containers(sec: Section) -> list[ContainerFact]:
    out = []
    for line in sec.out.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        labels = d.get("labels") or {}
        if labels.get(MANAGED_LABEL) != "true":
            continue
        out.append(
            ContainerFact(
                id=d.get("id") or "",
                name=(d.get("name") or "").lstrip("/"),
                image_id=d.get("image") or "",
                image_ref=d.get("ref") or "",
                labels=labels,
                status=d.get("status") or "",
                running=bool(d.get("running")),
                restarting=bool(d.get("restarting")),
                exit_code=int(d.get("exit_code") or 0),
                started_at=d.get("started") or "",
                finished_at=d.get("finished") or "",
                restarts=int(d.get("restarts") or 0),
                **_health(d.get("state")),
            )
        )
    return sorted(out, key=lambda c: c.name)


def _health(state: Any) -> dict[str, Any]:
    """Docker's health check of a container (State.Health): its status, and since when it fails
    (healthcheck.failing_since: from the failing streak, so it stays put from one read to the next)."""
    health = state.get("Health") if isinstance(state, dict) else None
    if not isinstance(health, dict) or not health.get("Status"):
        return {}
    log = [p for p in health.get("Log") or [] if isinstance(p, dict)]
    last = log[-1] if log else {}
    streak = _int(str(health.get("FailingStreak") or 0)) or 0
    return {
        "health": str(health["Status"]),
        "failing_since": healthcheck.failing_since(health_probes(log), streak),
        "health_output": " ".join(str(last.get("Output") or "").split())[:200] if last.get("ExitCode") else "",
    }


def _engine_errors(sec: Section) -> dict[str, str]:
    """`NAME<TAB>TEXT`: the last line of an unhealthy container's log that says why its engine died, from the
    words that say it (ENGINE_DEATH) on."""
    out = {}
    for line in sec.out.splitlines():
        name, tab, text = line.partition("\t")
        if tab and name.strip() and text.strip():
            out[name.strip()] = "".join(c if c.isprintable() else " " for c in text.strip())[:240]
    return out


def _images(sec: Section) -> tuple[dict[str, str | None], dict[str, str]]:
    """`REF ID` per reference (`REF -`: not there); `#err REF WHY` when the engine said something else than
    "no such image" (not proof of absence)."""
    ids: dict[str, str | None] = {}
    errors: dict[str, str] = {}
    for line in sec.out.splitlines():
        if line.startswith("#err "):
            ref, _, why = line[5:].partition(" ")
            errors[ref] = why.strip() or "no answer"
            continue
        ref, _, image_id = line.strip().rpartition(" ")
        if ref:
            ids[ref] = None if image_id in ("", "-") else image_id
    return ids, errors


def _store_images(f: NodeFacts, v: tuple[dict[str, str | None], dict[str, str]]) -> None:
    f.images, f.image_errors = v


def _listening(sec: Section) -> set[int]:
    ports = set()
    for line in sec.out.splitlines():
        _, _, port = line.strip().rpartition(":")
        try:
            ports.add(int(port, 16))
        except ValueError:
            pass
    return ports


def _running(sec: Section) -> dict[str, tuple[str, str]]:
    """`NAME<TAB>ROLE<TAB>DEPLOYMENT` per running container of ours (`docker ps`: the light read of `top`)."""
    out: dict[str, tuple[str, str]] = {}
    for line in sec.out.splitlines():
        name, _, rest = line.partition("\t")
        role, _, deployment = rest.partition("\t")
        if name.strip():
            out[name.strip()] = (role.strip(), deployment.strip())
    return out


# -- the state dir ---------------------------------------------------------------------------------------------


def _statedir(sec: Section) -> int | None:
    mode = sec.out.strip()
    return int(mode, 8) if re.fullmatch(r"[0-7]{3,4}", mode) else None


def _files(sec: Section) -> tuple[dict[str, FileFact], list[str]]:
    files: dict[str, FileFact] = {}
    other: list[str] = []
    for line in sec.out.splitlines():
        m = re.fullmatch(r"([0-7]{3,4}) (\w) (.+)", line)
        if m and m.group(2) == "f":
            files[m.group(3)] = FileFact(m.group(3), int(m.group(1), 8))
        elif m:
            other.append(m.group(3))  # a folder or link: never ours (another tool's, e.g. doctor/)
    return files, other


def _store_files(f: NodeFacts, v: tuple[dict[str, FileFact], list[str]]) -> None:
    # sha256 sums may have been stored first (the order of sections is the script's, not guaranteed here)
    for name, fact in v[0].items():
        known = vars(f).get("files", {})  # not read yet: parse stores the registry's order, files first
        fact.sha256 = known[name].sha256 if name in known else fact.sha256
    f.files, f.other_entries = v


def _sha(sec: Section) -> dict[str, str]:
    out = {}
    for line in sec.out.splitlines():
        m = re.fullmatch(r"([0-9a-f]{64})  \./(.+)", line)
        if m:
            out[m.group(2)] = m.group(1)
    return out


def _store_sha(f: NodeFacts, v: dict[str, str]) -> None:
    for name, digest in v.items():
        if name in f.files:
            f.files[name].sha256 = digest


def _manifest(sec: Section) -> tuple[dict[str, Any] | None, str]:
    text = sec.out.strip()
    if not text:
        return None, ""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg})"
    return (data, "") if isinstance(data, dict) else (None, "not a JSON object")


def _store_manifest(f: NodeFacts, v: tuple[dict[str, Any] | None, str]) -> None:
    f.manifest, f.manifest_error = v


def _store_routes(f: NodeFacts, v: tuple[dict[str, Any] | None, str]) -> None:
    f.routes, f.routes_error = v


def _state_dirs(sec: Section) -> dict[str, StateDirFact]:
    """`NAME<TAB>MODE<TAB>FOREIGN<TAB>ENTRY...` per folder (FOREIGN: a path the SSH user does not own, or empty)."""
    out: dict[str, StateDirFact] = {}
    for line in sec.out.splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or not parts[0]:
            continue
        mode = int(parts[1], 8) if re.fullmatch(r"[0-7]{3,4}", parts[1]) else None
        out[parts[0]] = StateDirFact(parts[0], mode, parts[2], sorted(p for p in parts[3:] if p))
    return out


def _manifests(sec: Section) -> dict[str, dict[str, Any]]:
    """`@@manifest NAME` then its manifest.json, per folder of ours (the state dir, a stack's `<state_dir>-NAME`);
    one that is not a JSON object is left out (it names no container)."""
    out: dict[str, dict[str, Any]] = {}
    for block in ("\n" + sec.out).split("\n@@manifest ")[1:]:
        name, _, text = block.partition("\n")
        data, _ = _manifest(Section(text, "", 0))
        if data is not None:
            out[name.strip()] = data
    return out


# The memory guard's status file: in the single deployment's state dir, or in a stack's guard unit's
# (`<state_dir>-guard`); paths relative to the home (guard/state.py picks the one a guard writes).
GUARD_STATUS_FILES = (f"{GUARD_FOLDER}/{STATUS}", f"-{STACK_UNIT}/{GUARD_FOLDER}/{STATUS}")


def _guard_status(sec: Section) -> dict[str, str]:
    """`@@status PATH` then the file's text, per guard status file there (PATH relative to the home)."""
    out: dict[str, str] = {}
    for block in ("\n" + sec.out).split("\n@@status ")[1:]:
        path, _, text = block.partition("\n")
        out[path.strip()] = text.rstrip("\n")
    return out


# -- memory, GPU, disk -----------------------------------------------------------------------------------------


def _meminfo(sec: Section) -> dict[str, int]:
    """MemTotal / MemAvailable in MiB."""
    out = {}
    for line in sec.out.splitlines():
        m = re.match(r"^(MemTotal|MemAvailable):\s+(\d+) kB", line)
        if m:
            out[m.group(1)] = int(m.group(2)) // 1024
    return out


def _store_meminfo(f: NodeFacts, v: dict[str, int]) -> None:
    f.mem_total_mb, f.mem_available_mb = v.get("MemTotal"), v.get("MemAvailable")


def _cpus(sec: Section) -> int | None:
    """`nproc`: the CPUs this user's processes may run on (the stack gateway's worker count follows it)."""
    text = sec.out.strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _store_cpus(f: NodeFacts, v: int | None) -> None:
    f.cpus = v


def _gpu(sec: Section) -> GpuFact:
    text = sec.out + "\n" + sec.err
    ok = sec.rc in (0, None)  # None: an output without exit code (a captured sample)
    return GpuFact(
        rc=sec.rc,
        gpus=parse_nvidia_smi_csv(sec.out, GPU_FIELDS) if ok else [],
        error=(sec.err or sec.out).strip() if not ok else "",
        simulated="SIMULATED" in text,
    )


def _store_gpu(f: NodeFacts, v: GpuFact) -> None:
    f.gpu = v
    first = v.gpus[0] if v.gpus else {}  # a DGX Spark has one GPU (and reports [N/A] for unified memory)
    total, free = _int(first.get("memory.total") or ""), _int(first.get("memory.free") or "")
    known = total is not None and free is not None  # both, or neither (unified memory: MemAvailable counts)
    f.gpu_mem_total_mb, f.gpu_mem_free_mb = (total, free) if known else (None, None)


def _disk(sec: Section) -> dict[str, DiskUsage]:
    """`WHAT` then df -Pk's columns (filesystem blocks used available capacity mount), in KiB -> bytes."""
    out = {}
    for line in sec.out.splitlines():
        parts = line.split()
        if len(parts) >= 7 and all(_int(p) is not None for p in parts[2:5]):
            size, used, avail = (int(p) * 1024 for p in parts[2:5])
            out[parts[0]] = DiskUsage(size, used, avail, parts[6])
    return out


def _store_disk(f: NodeFacts, v: dict[str, DiskUsage]) -> None:
    f.disk = v
    f.disk_free_mb = {where: d.avail // 2**20 for where, d in v.items()}


def _store_resources(f: NodeFacts, _v: object) -> None:
    f.resources = True


def _store_model(f: NodeFacts, v: bool) -> None:
    f.model_cached = v


# -- network and RDMA (doctor) ---------------------------------------------------------------------------------


def _network(sec: Section) -> NetworkFact:
    addr, sep, rest = ("\n" + sec.out).partition("\n@@ethtool ")
    speeds: dict[str, int | None] = {}
    simulated: set[str] = set()
    for block in rest.split("\n@@ethtool ") if sep else []:
        iface, _, text = block.partition("\n")
        speeds[iface.strip()] = parse_ethtool_speed(text)
        if "SIMULATED" in text:
            simulated.add(iface.strip())
    return NetworkFact(parse_ip_json(addr), speeds, bool(simulated), simulated)


def _rdma(sec: Section) -> RdmaFact:
    devinfo, _, gids = ("\n" + sec.out).partition("\n@@gids\n")
    err = sec.err.strip()
    rc = sec.rc
    m = re.search(r"^@@devinfo-rc (\d+)$", gids, re.M)
    if m:
        rc = int(m.group(1))
        gids = gids[: m.start()] + gids[m.end() :]
    return RdmaFact(
        rc=rc,
        error=(err or devinfo.strip()) if rc not in (0, None) else "",
        devices=parse_ibv_devinfo(devinfo),
        gids=parse_show_gids(gids),
        gids_text=gids,
    )


# -- day zero: what `init` and `setup ssh` read on a new node -----------------------------------------------------


def _machine_id(sec: Section) -> str:
    return sec.out.strip() if sec.rc in (0, None) else ""


def _hostname(sec: Section) -> str:
    lines = sec.out.strip().splitlines()
    return lines[0].strip() if lines else ""


def _rdma_netdevs(sec: Section) -> tuple[dict[str, str], bool]:
    """`sys HCA NETDEV` lines from /sys/class/infiniband/*/device/net; without any, `rdma -j link` after
    `@@rdma-link` (the lab's stand-in: simulated)."""
    sysfs, _, link = sec.out.partition("@@rdma-link\n")
    found: dict[str, str] = {}
    for line in sysfs.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "sys":
            found[words[1]] = words[2]
    return (found, False) if found else parse_rdma_link(link)


def _store_rdma_netdevs(f: NodeFacts, v: tuple[dict[str, str], bool]) -> None:
    f.rdma_netdevs, f.rdma_netdevs_simulated = v


def _sudo(sec: Section) -> tuple[dict[str, str], dict[str, str]]:
    """`PROGRAM ok|missing|absent PATH|-` per program asked (FactArgs.sudo_programs)."""
    states: dict[str, str] = {}
    paths: dict[str, str] = {}
    for line in sec.out.splitlines():
        words = line.split()
        if len(words) >= 2 and words[1] in ("ok", "missing", "absent"):
            states[words[0]] = words[1]
            if len(words) >= 3 and words[2] != "-":
                paths[words[0]] = words[2]
    return states, paths


def _store_sudo(f: NodeFacts, v: tuple[dict[str, str], dict[str, str]]) -> None:
    f.sudo, f.sudo_paths = v


FACTS: dict[str, Fact] = {
    f.name: f
    for f in (
        Fact("home", r"""printf '%s\n' "$HOME" """, lambda s: s.out.strip(), _set("home")),
        Fact(
            "docker",
            r"""if out=$(docker version --format '{{.Server.Version}}' 2>&1); then echo "ok $out"; """
            r"""else echo "fail"; printf '%s\n' "$out" | tail -n 3; fi""",
            _docker,
            _store_docker,
        ),
        Fact("docker_info", r"docker info --format '{{.DockerRootDir}}|{{.Driver}}'", _docker_info, _store_docker_info),
        Fact("user", "id -un; id -Gn", _user, _store_user),
        Fact("ids", "id -u; id -g", _ids, _store_ids),
        Fact("image_store", IMAGE_STORE, image_store, _set("image_store")),
        Fact("crashes", CRASHES, crash_records, _set("crashes")),
        # push --from's layer store reader: may root (sudo -n, no password) read the image's config in the
        # engine's store? ("$@": the image IDs asked)
        Fact(
            "store_readable",
            r"""store=$(docker info --format '{{.DockerRootDir}}/image/{{.Driver}}') || return 1
for id; do sudo -n test -r "$store/imagedb/content/sha256/${id#sha256:}" && printf 'readable %s\n' "$id"; done""",
            lambda s: {line.split(" ", 1)[1] for line in s.out.splitlines() if line.startswith("readable ")},
            _set("store_readable"),
        ),
        # the HF cache's hub folder and its parents that are not there (a pull makes them for its mount and
        # takes back those still empty when it stops): walking up from $hf/hub to the first that exists
        Fact(
            "hf_missing",
            r"""d="${hf%/}/hub"; while [ -n "$d" ] && [ ! -d "$d" ]; do printf '%s\n' "$d"; d="${d%/*}"; done""",
            _missing_folders,
            _set("hf_missing"),
        ),
        Fact(
            "names",
            r"""docker ps -a --no-trunc --format '{{.ID}} {{.Label "io.sparkdeploy.managed"}} {{.Names}}'""",
            _names,
            _set("other_names"),
        ),
        Fact(
            "inspect",
            r"""ids=$(docker ps -aq --no-trunc --filter label=io.sparkdeploy.managed=true)
[ -n "$ids" ] && docker inspect --format '"""
            + _INSPECT.replace("'", "'\\''")
            + r"""' $ids""",
            _containers,
            _set("containers"),
        ),
        Fact(
            "engine_errors",  # only unhealthy or starting containers: why the engine died, from its last log lines
            r"""for __c in $(docker ps --filter label=io.sparkdeploy.managed=true --filter health=unhealthy \
  --filter health=starting --format '{{.Names}}' 2>/dev/null); do
  __l=$(docker logs --tail 200 "$__c" 2>&1 | grep -aoE '("""
            + ENGINE_DEATH
            + r""").*' | tail -n 1)
  [ -n "$__l" ] && printf '%s\t%s\n' "$__c" "$__l"
done; true""",  # __c, __l: not `n` (bash's dynamic scope: the `sec` wrapper's own local)
            _engine_errors,
            _set("engine_errors"),
        ),
        Fact(
            "images",
            r"""for ref in "$@"; do
  if id=$(docker image inspect --format '{{.Id}}' "$ref" 2>&1); then printf '%s %s\n' "$ref" "${id:--}"
  else printf '%s -\n' "$ref"
    case "$id" in *"o such image"*) ;; *) printf '#err %s %s\n' "$ref" "$(printf '%s' "$id" | tail -n 1)";; esac
  fi
done""",
            _images,
            _store_images,
        ),
        Fact("statedir", r"""[ -d "$dir" ] && stat -c '%a' "$dir" """, _statedir, _set("state_dir_mode")),
        Fact(
            "foreign",
            r"""[ -d "$dir" ] && find "$dir" -maxdepth 1 ! -user "$(id -u)" -print -quit""",
            lambda s: s.out.strip(),
            _set("state_dir_foreign"),
        ),
        Fact(
            "files",
            r"""[ -d "$dir" ] && (cd "$dir" && find . -mindepth 1 -maxdepth 1 -printf '%m %y %f\n')""",
            _files,
            _store_files,
        ),
        Fact(
            "sha",
            r"""[ -d "$dir" ] && (cd "$dir" && find . -maxdepth 1 -type f -exec sha256sum -- {} +)""",
            _sha,
            _store_sha,
        ),
        Fact("manifest", r"""[ -f "$dir/manifest.json" ] && cat "$dir/manifest.json" """, _manifest, _store_manifest),
        # the stack gateway's routes (read with the gateway's state dir; absent anywhere else)
        Fact("routes", r"""[ -f "$dir/routes.json" ] && cat "$dir/routes.json" """, _manifest, _store_routes),
        # every folder of ours in the home: the state dir and a stack's `<state_dir>-NAME` (what `down` leaves,
        # what doctor looks at): its mode, a path in it the SSH user does not own, its entries
        Fact(
            "state_dirs",
            r"""cd "$HOME" 2>/dev/null || exit 0
u=$(id -u)
for d in "$sd" "$sd"-*; do
  [ -d "$d" ] && [ ! -L "$d" ] || continue
  printf '%s\t%s\t%s' "$d" "$(stat -c %a "$d")" "$(find "$HOME/$d" -maxdepth 1 ! -user "$u" -print -quit 2>/dev/null)"
  find "$HOME/$d" -mindepth 1 -maxdepth 1 -printf '\t%f' 2>/dev/null
  printf '\n'
done""",
            _state_dirs,
            _set("state_dirs"),
        ),
        Fact(
            "running",  # the light read: names, roles and stack deployments of our running containers
            r"""docker ps --filter label=io.sparkdeploy.managed=true \
  --format '{{.Names}}	{{.Label "io.sparkdeploy.role"}}	{{.Label "io.sparkdeploy.deployment"}}'""",
            _running,
            _set("running"),
        ),
        Fact(
            "manifests",  # every folder of ours' manifest.json (each container's health port)
            r"""for f in "$dir/manifest.json" "$dir"-*/manifest.json; do
  [ -f "$f" ] || continue
  d=${f%/manifest.json}; printf '@@manifest %s
' "${d##*/}"; cat "$f"; printf '
'
done; true""",
            _manifests,
            _set("manifests"),
        ),
        Fact(
            "guard_status",  # the memory guard's status.json, where a guard writes it (GUARD_STATUS_FILES)
            r"""for f in "$sd/"""
            + GUARD_STATUS_FILES[0]
            + r"""" "$sd"""
            + GUARD_STATUS_FILES[1]
            + r""""; do
  [ -f "$HOME/$f" ] || continue
  printf '@@status %s\n' "$f"; cat "$HOME/$f"; printf '\n'
done; true""",
            _guard_status,
            _set("guard_status"),
        ),
        Fact(
            "listen",
            r"""cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A" {print $2}'""",
            _listening,
            _set("listening"),
        ),
        Fact("resources", "true", lambda s: True, _store_resources),
        Fact("meminfo", r"grep -E '^(MemTotal|MemAvailable):' /proc/meminfo", _meminfo, _store_meminfo),
        Fact("cpus", "nproc", _cpus, _store_cpus),
        Fact(
            "gpu",
            'nvidia-smi --query-gpu="' + ",".join(GPU_FIELDS) + '" --format=csv,noheader,nounits',
            _gpu,
            _store_gpu,
        ),
        Fact(
            "model",
            r"""[ -n "$model" ] && [ -d "$hf/hub/$model" ] && echo cached""",
            lambda s: s.out.strip() == "cached",
            _store_model,
        ),
        Fact(
            "disk",
            r"""droot=$(docker info --format '{{.DockerRootDir}}' 2>/dev/null); [ -n "$droot" ] || droot=/var/lib/docker
p="$hf"; while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done
for pair in "home:$HOME" "hf_cache:$p" "docker:$droot"; do
  [ -n "${pair#*:}" ] && printf '%s ' "${pair%%:*}" && df -Pk "${pair#*:}" 2>/dev/null | tail -n 1
done""",
            _disk,
            _store_disk,
        ),
        Fact("kernel", "uname -r", lambda s: s.out.strip(), _set("kernel")),
        Fact(
            "network",
            r"""ip -j addr show
if [ "$ifaces" = '*' ]; then list=""; for i in /sys/class/net/en*; do [ -e "$i" ] && list="$list ${i##*/}"; done
else list=${ifaces//,/ }; fi
for iface in $list; do printf '\n@@ethtool %s\n' "$iface"; ethtool "$iface" 2>&1; done""",
            _network,
            _set("network"),
        ),
        Fact(
            "rdma",
            r"""ibv_devinfo; rc=$?
printf '\n@@gids\n'
if command -v show_gids >/dev/null 2>&1; then show_gids
else  # the same table from sysfs where Mellanox's show_gids script is not installed
  for d in /sys/class/infiniband/*; do
    [ -d "$d" ] || continue; dev=${d##*/}
    for p in "$d"/ports/*; do port=${p##*/}
      for g in "$p"/gids/*; do idx=${g##*/}; gid=$(cat "$g" 2>/dev/null) || continue
        case "$gid" in 0000:0000:0000:0000:0000:0000:0000:0000|"") continue;; esac
        typ=$(cat "$p/gid_attrs/types/$idx" 2>/dev/null); ndev=$(cat "$p/gid_attrs/ndevs/$idx" 2>/dev/null)
        case "$typ" in *v2*) ver=v2;; *) ver=v1;; esac
        echo "$dev $port $idx $gid $ver ${ndev:--}"
      done
    done
  done
fi
printf '@@devinfo-rc %s\n' "$rc" """,
            _rdma,
            _set("rdma"),
        ),
        Fact("machine_id", "cat /etc/machine-id", _machine_id, _set("machine_id")),
        Fact("hostname", "hostname", _hostname, _set("hostname")),
        Fact("max_mtu", "ip -d -j link show", lambda s: parse_max_mtu(s.out), _set("max_mtu")),
        Fact(
            "rdma_netdevs",
            r"""found=
for d in /sys/class/infiniband/*; do
  [ -d "$d" ] || continue
  for i in "$d"/device/net/*; do [ -e "$i" ] && echo "sys ${d##*/} ${i##*/}" && found=1; done
done
[ -n "$found" ] || { printf '@@rdma-link\n'; rdma -j link show; }""",
            _rdma_netdevs,
            _store_rdma_netdevs,
        ),
        Fact(
            "sudo",
            r"""for c in ${progs//,/ }; do
  p=$(command -v "$c") || { echo "$c absent -"; continue; }
  if sudo -n -l "$p" >/dev/null 2>&1; then echo "$c ok $p"; else echo "$c missing $p"; fi
done""",
            _sudo,
            _store_sudo,
        ),
    )
}

# What each reader asks for (one round trip per node each time).
STATE = (
    "home",
    "docker",
    "names",
    "inspect",
    "engine_errors",
    "images",
    "statedir",
    "foreign",
    "files",
    "sha",
    "manifest",
    "routes",
    "listen",
)
RESOURCES = ("home", *RESOURCE_FACTS)
DOCTOR = (
    *STATE,
    "docker_info",
    "user",
    *RESOURCES[1:],
    "kernel",
    "network",
    "rdma",
    "state_dirs",
    "manifests",
    "guard_status",
)
# `down`: the state, and every folder of ours (a stack's whose containers are gone); after the removal, what is
# left of sparkdeploy's (its last line): the containers and the folders
DOWN = (*STATE, "state_dirs")
LEFTOVERS = ("home", "docker", "inspect", "state_dirs")
# `init` and `setup network` on a node (FactArgs(fabric_ifaces=(EVERY_PORT,))); `setup ssh`'s checks
DAYZERO = ("home", "machine_id", "hostname", "gpu", "network", "max_mtu", "rdma_netdevs", "rdma")
ACCESS = ("home", "user", "sudo")
# `top`: what serves where, and each container's health port (daytwo/top.py)
TOP = ("home", "running", "manifests")
# the memory guard's status (guard/state.py: `top`, `status`)
GUARD = ("home", "guard_status")
# what a history record keeps of each node (deploy/history.py): the image ID of the tag, the GPU driver
HISTORY = ("home", "images", "gpu")
# what `models pull` needs of its download node (models/pull.py): the numeric ids its client runs as, and the
# cache folders its mount would create (a dry run mounts none: PULL_DRY)
# how our containers ended (daytwo/crashes.py: `status`, doctor's engine.crashes)
CRASHES_SET = ("home", "crashes")
# push --from's check of its source's layer store (images/push_from.py)
STORE_SET = ("home", "store_readable")
# what a push and a registry pull read of each node (images/inventory_images.py)
IMAGE_STORE_SET = ("home", "image_store")
PULL = ("home", "ids", "hf_missing")
PULL_DRY = ("home", "ids")
