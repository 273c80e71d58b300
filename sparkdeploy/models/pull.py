"""`models pull`: the model downloaded once, on one node, then copied node to node over the fabric.

plan:     what every node already has (complete blobs, partial ones) and free space; the hub's file list
          (revision -> commit, sizes, LFS sha256) read by the real huggingface_hub client on the download node.
          Room is checked on every node before the first byte moves; bad input (unknown model or revision,
          gated without a token) stops here with one line.
download: on the download node (the head by default), huggingface_hub in a container of the engine image;
          the token only in a 0600 env file. Then every file is verified and the manifest recorded.
copy:     a chain download-node -> n2 -> n3 ... (peers.transfer_plan): each hop runs `nodeside send | ssh
          <next fabric IP> nodeside receive` on the sender (peers.peer_ssh_argv: host keys checked), so the
          bytes never pass through this machine and the download node sends each byte once. Every hop runs
          while the download does: a sender forwards bytes as they are written on its node (nodeside's
          "follow"), so N nodes are ready about when the download ends. The receiver
          writes each blob to a partial file, resumes it from its length next time, verifies its digest and
          only then renames it; the manifest (the "complete" mark) is written after every file verified.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sparkdeploy import facts
from sparkdeploy.config.inventory import Inventory, Node
from sparkdeploy.config.secrets import Secrets
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.models import ops
from sparkdeploy.models.ops import Json, ModelRef
from sparkdeploy.nodeside import ship
from sparkdeploy.runtime.peers import ensure_peer_trust, peer_ssh_argv, transfer_plan
from sparkdeploy.runtime.remote import NodeConnection, on_nodes

MARGIN_BYTES = 64 << 20  # beyond the bytes still to come: the manifest, verify caches, filesystem slack
ENV_FILE = "models-pull.env"
POLL_S = 1.0  # each poll starts python3 on the node: often enough for a bar, not a load

TrustFn = Callable[..., list[str]]  # runtime.peers.ensure_peer_trust's shape


@dataclass
class NodeResult:
    node: str
    action: str = ""  # present | downloaded | copied | failed | skipped
    source: str = ""  # the hub, or the node it was copied from
    via: str = ""  # "172.30.124.11 -> 172.30.124.12" for a fabric copy
    bytes: int = 0  # bytes that arrived now
    seconds: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.action in ("present", "downloaded", "copied")


@dataclass
class PullResult:
    model: str
    revision: str
    commit: str = ""
    size: int = 0
    files: int = 0
    download_node: str = ""
    dry_run: bool = False
    plan: list[str] = field(default_factory=list)
    nodes: dict[str, NodeResult] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.nodes.values()) if not self.dry_run else True

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "revision": self.revision,
            "commit": self.commit,
            "size": self.size,
            "files": self.files,
            "download_node": self.download_node,
            "dry_run": self.dry_run,
            "plan": self.plan,
            "ok": self.ok,
            "nodes": {n: {k: v for k, v in vars(r).items() if k != "node"} for n, r in self.nodes.items()},
        }


class ProgressSink(Protocol):
    """What the pull reports per node (Progress, or the CLI's bars)."""

    def start(self, node: str, total: int, what: str) -> None: ...

    def update(self, node: str, done: int) -> None: ...

    def finish(self, node: str, ok: bool, note: str = "") -> None: ...


class Progress:
    """Per-node byte counts (the CLI draws bars from them); the default draws nothing."""

    def start(self, node: str, total: int, what: str) -> None: ...

    def update(self, node: str, done: int) -> None: ...

    def finish(self, node: str, ok: bool, note: str = "") -> None: ...


def _abs(path: str, home: str) -> str:
    return home.rstrip("/") + path[1:] if path.startswith("~/") else path


def _blob_sizes(manifest: Json) -> dict[str, int]:
    return {f["blob"]: f["size"] for f in manifest["files"]}


def wanted(manifest: Json, held: Json, bad: dict[str, str] | None = None) -> dict[str, int]:
    """{blob: offset} a node still needs: complete blobs skipped, partial ones resumed from their length,
    blobs of files that failed verification (`bad`: path -> problem) fetched again from 0."""
    sizes = _blob_sizes(manifest)
    again = {f["blob"] for f in manifest["files"] if f["path"] in (bad or {})}
    out: dict[str, int] = {}
    for blob, size in sizes.items():
        if blob in again:
            out[blob] = 0
        elif held["have"].get(blob) != size:
            part = held["partial"].get(blob, 0)
            out[blob] = part if part < size else 0
    return out


def _to_come(manifest: Json, held: Json, bad: dict[str, str] | None = None) -> int:
    """Bytes a node still has to receive."""
    sizes = _blob_sizes(manifest)
    return sum(sizes[b] - off for b, off in wanted(manifest, held, bad).items())


def _poll(
    conn: NodeConnection,
    hf_cache: str,
    manifest: Json,
    node: str,
    progress: ProgressSink,
    base: int,
    stop: threading.Event,
) -> None:
    """Report bytes arrived on `node` while a download or copy runs (a second SSH session, stat only)."""
    sizes = _blob_sizes(manifest)
    while not stop.wait(POLL_S):
        try:
            held = ops.have(conn, hf_cache, manifest["repo"])
        except StepFailed:  # a poll that fails (node busy, answer unreadable) is only a missed bar update
            continue
        done = sum(min(held["have"].get(b, 0) or held["partial"].get(b, 0), s) for b, s in sizes.items())
        progress.update(node, max(0, done - base))


def _env_file(ref: ModelRef, inv: Inventory, secrets: Secrets) -> str:
    lines = {"HF_HOME": "/hf", "HOME": "/tmp", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    if inv.cluster.hf_endpoint:
        lines["HF_ENDPOINT"] = inv.cluster.hf_endpoint
    token = secrets.get("HF_TOKEN")
    if token:
        if "\n" in token or "\r" in token:
            raise ConfigError(
                Problem(secrets.source or "secrets", "HF_TOKEN", "contains a line break", "write the token on one line")
            )
        lines["HF_TOKEN"] = token
    return "".join(f"{k}={v}\n" for k, v in lines.items())


class ClientSession:
    """nodeside's `hub-client pull` in one container: the manifest first, then "go" (download) or "stop" on stdin, so
    one client start serves both steps while this machine checks room on every node in between."""

    def __init__(self, puller: Puller, node: Node, ref: ModelRef, dry_run: bool = False):
        self.puller, self.node, self.ref = puller, node, ref
        conn = puller.conns[node.name]
        argv, self.env_path, self.created = puller._client_argv(node, ref, "pull", ref.revision, dry_run)
        self.conn = conn
        self.chan = conn.open().client.get_transport().open_session(timeout=conn.connect_timeout)
        self.chan.settimeout(None)
        self.chan.exec_command(shlex.join(argv))
        self.out = self.chan.makefile("rb")
        self.seen: list[str] = []
        self.manifest = self._first_json()

    def _first_json(self) -> Json:
        for raw in self.out:
            line = raw.decode(errors="replace").strip()
            self.seen.append(line)
            if line.startswith("{"):
                data: Json = json.loads(line)
                if "error" in data:
                    self.end("stop")
                    self.puller._hub_error(self.node, self.ref, data)
                return data
        self.end("stop")
        raise StepFailed(
            f"{self.node.name}: huggingface_hub in {self.puller.image} gave no file list for "
            f"{self.ref}: {self._stderr()[-300:] or ' '.join(self.seen)[-300:]}"
        )

    def _stderr(self) -> str:
        text: str = self.chan.makefile_stderr("rb").read().decode(errors="replace").strip()
        return text

    def end(self, word: str) -> Json:
        """Send `word` (go | stop), wait for the container to end; the download's answer for "go". Stopped
        before any download, the cache folders made for its mount go again (only if still empty): a refused
        pull leaves nothing on the node."""
        try:
            self.chan.sendall((word + "\n").encode())
            self.chan.shutdown_write()
            rest = self.out.read().decode(errors="replace")
            code = self.chan.recv_exit_status()
            err = self._stderr()
        finally:
            self.chan.close()
            self.conn.run(["rm", "-f", self.env_path], check=False)
            if word != "go" and self.created:
                self.conn.run(["rmdir", "--ignore-fail-on-non-empty", *reversed(self.created)], check=False)
        if word != "go":
            return {}
        return self.puller._answer(self.node, self.ref, "download", code, rest, err)


class Puller:
    def __init__(
        self,
        inv: Inventory,
        conns: dict[str, NodeConnection],
        secrets: Secrets,
        image: str,
        progress: ProgressSink | None = None,
        say: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.inv = inv
        self.conns = conns
        self.secrets = secrets
        self.image = image
        self.progress: ProgressSink = progress or Progress()
        self.say = say
        self.hf_cache = inv.cluster.hf_cache
        self.endpoint = inv.cluster.hf_endpoint or "https://huggingface.co"

    # -- the hub client on the download node -----------------------------------------------------------
    def _client_argv(
        self, node: Node, ref: ModelRef, cmd: str, revision: str, dry_run: bool = False
    ) -> tuple[list[str], str, list[str]]:
        """The `docker run` of the hub client on `node`, its env file (0600, written here; remove it after) and
        the cache folders made for its mount that did not exist before (outermost first). A dry run mounts no
        cache (it only lists files) and so creates no folder on the node."""
        conn = self.conns[node.name]
        home = conn.home()
        hf_abs = _abs(self.hf_cache, home)
        state = _abs("~/" + self.inv.cluster.state_dir, home)
        node_facts = facts.gather(
            conn,
            "pull_dry" if dry_run else "pull",
            facts.FactArgs(state_dir=self.inv.cluster.state_dir, hf_cache=self.hf_cache),
        )
        if not (node_facts.uid and node_facts.gid):
            raise StepFailed(f"{node.name}: could not read the SSH user's numeric ids (id -u, id -g)")
        created: list[str] = []
        if not dry_run:
            parts = (hf_abs.rstrip("/") + "/hub").split("/")
            paths = ["/".join(parts[:i]) for i in range(2, len(parts) + 1)]
            created = [d for d in paths if d in node_facts.hf_missing]
        conn.run(["mkdir", "-p", *([] if dry_run else [hf_abs + "/hub"]), state])
        env_path = f"{state}/{ENV_FILE}"
        conn.put(_env_file(ref, self.inv, self.secrets), env_path, mode=0o600)
        # --user: the files belong to the SSH user, who copies them to the other nodes; -i: `pull` reads "go"
        python, *client = ship.argv("hub-client", cmd, ref.repo, revision, *ref.include)
        argv = [
            "docker",
            "run",
            "--rm",
            "-i",
            "--network",
            "host",
            "--user",
            f"{node_facts.uid}:{node_facts.gid}",
            "--env-file",
            env_path,
            *([] if dry_run else ["--volume", f"{hf_abs}:/hf"]),
            "--entrypoint",
            python,
            self.image,
            *client,
        ]
        return argv, env_path, created

    def _hub_client(self, node: Node, ref: ModelRef, cmd: str, revision: str) -> Json:
        """One hub client command (plan | download) to its end; its JSON answer."""
        conn = self.conns[node.name]
        argv, env_path, _created = self._client_argv(node, ref, cmd, revision)
        try:
            result = conn.run(argv, check=False, timeout=None)
        finally:
            conn.run(["rm", "-f", env_path], check=False)
        return self._answer(node, ref, cmd, result.exit_code, result.stdout, result.stderr)

    def _answer(self, node: Node, ref: ModelRef, cmd: str, code: int, stdout: str, stderr: str) -> Json:
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        data: Json = json.loads(lines[-1]) if lines else {}
        if "error" in data:
            self._hub_error(node, ref, data)
        if code != 0 or not data:
            tail = (stderr or stdout).strip().splitlines()[-1:] or ["no output"]
            raise StepFailed(f"{node.name}: huggingface_hub in {self.image} failed ({cmd} {ref}): {tail[0]}")
        return data

    def _hub_error(self, node: Node, ref: ModelRef, data: Json) -> None:
        kind, where = data["error"], f"on {self.endpoint} (asked from {node.name})"
        if kind == "repo":
            raise ConfigError(
                Problem(
                    "models",
                    ref.repo,
                    f"no such model {where}, or it is private",
                    "check the id (e.g. openai/gpt-oss-120b); for a private model add an "
                    "HF_TOKEN line to the secrets file",
                )
            )
        if kind == "revision":
            raise ConfigError(
                Problem(
                    "models",
                    "--revision",
                    f"{ref.revision!r} is not a revision of {ref.repo} {where}",
                    "give a branch, tag or commit of the model (default: main)",
                )
            )
        if kind == "gated":
            has = bool(self.secrets.get("HF_TOKEN"))
            raise ConfigError(
                Problem(
                    "models",
                    ref.repo,
                    f"is gated {where} and " + ("the hub refused HF_TOKEN" if has else "no HF_TOKEN is set"),
                    "accept the model's license on the hub with your account, then add an HF_TOKEN line (a token "
                    "of that account) to the secrets file (cluster.secrets_file), or export HF_TOKEN",
                )
            )
        raise StepFailed(f"{node.name}: the hub client failed for {ref} {where}: {data.get('message', kind)}")

    # -- the pull ---------------------------------------------------------------------------------------
    def pull(self, ref: ModelRef, download_node: Node, targets: list[Node], dry_run: bool = False) -> PullResult:
        result = PullResult(ref.repo, ref.revision, download_node=download_node.name, dry_run=dry_run)
        everyone = [download_node] + [t for t in targets if t.name != download_node.name]
        self.say(f"reading the model cache on {', '.join(n.name for n in everyone)}")
        held = self._per_node(everyone, lambda n: ops.have(self.conns[n.name], self.hf_cache, ref.repo))
        states = self._per_node(everyone, lambda n: ops.status(self.conns[n.name], self.hf_cache, ref.repo))
        self.say(f"asking {self.endpoint} for {ref} (huggingface_hub on {download_node.name})")
        client = ClientSession(self, download_node, ref, dry_run)
        try:
            return self._pull(ref, download_node, everyone, held, states, client, result, dry_run)
        finally:
            if not client.chan.closed:  # not started: stop it (a failure, a dry run, nothing to download)
                client.end("stop")

    def _pull(
        self,
        ref: ModelRef,
        download_node: Node,
        everyone: list[Node],
        held: dict[str, Json],
        states: dict[str, Json],
        client: ClientSession,
        result: PullResult,
        dry_run: bool,
    ) -> PullResult:
        manifest = dict(client.manifest, revision=ref.revision)
        result.commit, result.size, result.files = manifest["commit"], manifest["total"], len(manifest["files"])
        exact = ModelRef(ref.repo, manifest["commit"], ref.include)
        want = self._wanted_per_node(manifest, exact, everyone, held, states)
        sizes = _blob_sizes(manifest)
        need = {name: sum(sizes[b] - off for b, off in w.items()) for name, w in want.items()}
        self._check_room(ref, everyone, held, need)

        src_done = need[download_node.name] == 0
        edges = transfer_plan(download_node, [n for n in everyone[1:] if need[n.name]])
        result.plan.extend(self._plan_lines(download_node, everyone, need, edges))
        if dry_run:
            if edges:
                result.plan.extend(self._trust(ensure_peer_trust, edges, dry_run=True))
            return result

        for n in everyone[1:]:
            if not need[n.name]:
                result.nodes[n.name] = NodeResult(n.name, "present")
        if src_done:
            result.nodes[download_node.name] = NodeResult(download_node.name, "present")
        if edges:  # node-to-node trust first: nothing starts before every hop can connect
            for line in self._trust(ensure_peer_trust, edges, dry_run=False):
                self.say(line)
        elif src_done:
            return result
        if not src_done:
            self._drop_stale(download_node, ref, held, set(want[download_node.name]))
        self._transfer(ref, download_node, None if src_done else client, manifest, held, want, edges, result)
        _blame_feeders(result, download_node, edges)
        return result

    def _wanted_per_node(
        self, manifest: Json, exact: ModelRef, everyone: list[Node], held: dict[str, Json], states: dict[str, Json]
    ) -> dict[str, dict[str, int]]:
        """{node: {blob: offset}} each node still needs (none where the exact commit verified complete)."""
        bad = {n.name: (ops.recorded(states[n.name], exact) or {}).get("bad", {}) for n in everyone}
        return {
            n.name: ({} if ops.complete_commit(states[n.name], exact) else wanted(manifest, held[n.name], bad[n.name]))
            for n in everyone
        }

    def _check_room(self, ref: ModelRef, everyone: list[Node], held: dict[str, Json], need: dict[str, int]) -> None:
        """Room on every node before the first byte moves."""
        short = [n for n in everyone if need[n.name] and held[n.name]["free"] < need[n.name] + MARGIN_BYTES]
        if short:
            raise StepFailed(
                "; ".join(
                    f"{n.name}: {self.hf_cache} has {_mb(held[n.name]['free'])} free, {ref} needs {_mb(need[n.name])} "
                    f"more (fix: free space there, or set cluster.hf_cache to a larger disk)"
                    for n in short
                )
                + ". Nothing was downloaded or copied."
            )

    def _plan_lines(
        self, download_node: Node, everyone: list[Node], need: dict[str, int], edges: list[tuple[Node, Node]]
    ) -> list[str]:
        """What the pull does on each node: the download, each hop of the chain, the nodes that have it."""
        lines = [
            f"{download_node.name}: "
            + (
                "has it (verified)"
                if need[download_node.name] == 0
                else f"download {_mb(need[download_node.name])} from {self.endpoint} with huggingface_hub "
                f"in {self.image}"
            )
        ]
        for frm, to in edges:
            lines.append(
                f"{to.name}: copy {_mb(need[to.name])} from {frm.name} over the fabric "
                f"{frm.fabric_address} -> {to.fabric_address} (ssh, host key checked), "
                f"forwarded as it arrives on {frm.name}"
            )
        lines += [f"{n.name}: has it (verified)" for n in everyone[1:] if not need[n.name]]
        return lines

    def _transfer(
        self,
        ref: ModelRef,
        download_node: Node,
        client: ClientSession | None,
        manifest: Json,
        held: dict[str, Json],
        want: dict[str, dict[str, int]],
        edges: list[tuple[Node, Node]],
        result: PullResult,
    ) -> None:
        """The download (`client`; None: the download node has it) and every hop of the chain at once: each node
        marks that bytes are arriving, and each sender forwards them as they are written (nodeside's "follow"),
        so the model reaches the last node about when the download ends, not one full copy per hop later."""
        arriving = ([] if client is None else [download_node]) + [to for _frm, to in edges]
        for node in arriving:
            self._arriving(node, ref, True)

        def download(client: ClientSession) -> None:
            try:
                result.nodes[download_node.name] = self._download(download_node, manifest, held, client)
            except Exception as exc:  # noqa: BLE001 - reported on its node's row, never lost in a thread
                result.nodes[download_node.name] = NodeResult(download_node.name, "failed", error=str(exc))
            finally:
                self._arriving(download_node, ref, False)

        def copy(frm: Node, to: Node) -> None:
            try:
                result.nodes[to.name] = self._copy(frm, to, manifest, want[to.name], ref, follow=True)
            except Exception as exc:  # noqa: BLE001 - as above
                result.nodes[to.name] = NodeResult(to.name, "failed", source=frm.name, error=str(exc))
            finally:
                self._arriving(to, ref, False)

        workers = [] if client is None else [threading.Thread(target=download, args=(client,), daemon=True)]
        workers += [threading.Thread(target=copy, args=edge, daemon=True) for edge in edges]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    def _arriving(self, node: Node, ref: ModelRef, on: bool) -> None:
        self.conns[node.name].run(
            ops.nodeside_argv("arriving", self.hf_cache, ref.repo, "on" if on else "off"), check=on
        )

    def _drop_stale(self, node: Node, ref: ModelRef, held: dict[str, Json], refetch: set[str]) -> None:
        """Blobs that failed verification, removed before the download (huggingface_hub trusts a blob's name
        and would keep them) and before any hop could read them."""
        conn = self.conns[node.name]
        stale = [b for b in refetch if held[node.name]["have"].get(b) is not None]
        if stale:
            blobs = _abs(self.hf_cache, conn.home()) + "/hub/" + ops.folder(ref.repo) + "/blobs/"
            conn.run(["rm", "-f", "--", *(blobs + b for b in sorted(stale))])

    def _trust(self, ensure_peer_trust: TrustFn, edges: list[tuple[Node, Node]], dry_run: bool) -> list[str]:
        lines: list[str] = []
        for frm, to in edges:
            lines.extend(ensure_peer_trust(self.inv, frm, [to], dry_run=dry_run))
        return lines

    def _per_node(self, nodes: list[Node], fn: Callable[[Node], Json]) -> dict[str, Json]:
        outcomes = on_nodes(nodes, fn)
        failed = [o for o in outcomes if not o.ok]
        if failed:
            raise StepFailed("; ".join(f"{o.node.name}: {o.error}" for o in failed))
        return {o.node.name: o.value for o in outcomes}

    def _download(self, node: Node, manifest: Json, held: dict[str, Json], client: ClientSession) -> NodeResult:
        res = NodeResult(node.name, "downloaded", source=self.endpoint)
        base = sum(
            min(v, _blob_sizes(manifest).get(b, 0))
            for b, v in {**held[node.name]["partial"], **held[node.name]["have"]}.items()
        )
        todo = _to_come(manifest, held[node.name])
        self.progress.start(node.name, todo, f"download from {self.endpoint}")
        stop = threading.Event()
        poller = threading.Thread(
            target=_poll,
            args=(self.conns[node.name], self.hf_cache, manifest, node.name, self.progress, base, stop),
            daemon=True,
        )
        t0 = time.monotonic()
        poller.start()
        try:
            client.end("go")
            done = ops.finish(self.conns[node.name], self.hf_cache, manifest)
        except (StepFailed, ConfigError) as exc:
            res.action, res.error = "failed", str(exc)
            self.progress.finish(node.name, False, res.error)
            return res
        finally:
            stop.set()
            poller.join()
            res.seconds = round(time.monotonic() - t0, 2)
        res.bytes = todo
        if not done.get("ok"):
            res.action = "failed"
            res.error = (
                f"{node.name}: after the download, {ops.describe_bad(done['bad'])}; run the pull again "
                "(bad files are fetched again)"
            )
        self.progress.finish(node.name, res.ok, res.error)
        return res

    def _copy(
        self, frm: Node, to: Node, manifest: Json, need: dict[str, int], ref: ModelRef, follow: bool = False
    ) -> NodeResult:
        res = NodeResult(to.name, "copied", source=frm.name, via=f"{frm.fabric_address} -> {to.fabric_address}")
        sizes = _blob_sizes(manifest)
        want: list[list[Any]] = [[b, off] for b, off in sorted(need.items())]  # [blob, offset] (JSON)
        t0 = time.monotonic()
        for attempt in (1, 2):
            todo = sum(sizes[b] - off for b, off in want)
            self.progress.start(to.name, todo, f"copy from {frm.name} {res.via}")
            request = json.dumps({"manifest": manifest, "want": want, "follow": follow})
            send = ops.nodeside_argv("send", self.hf_cache, ref.repo, request)
            receive = ops.nodeside_argv("receive", self.hf_cache, ref.repo)
            pipeline = shlex.join(send) + " | " + shlex.join(peer_ssh_argv(frm, to, receive))
            stop = threading.Event()
            base = sum(off for _b, off in want) + sum(s for b, s in sizes.items() if b not in dict(want))
            poller = threading.Thread(
                target=_poll,
                args=(self.conns[to.name], self.hf_cache, manifest, to.name, self.progress, base, stop),
                daemon=True,
            )
            poller.start()
            try:
                out = self.conns[frm.name].run(["bash", "-o", "pipefail", "-c", pipeline], check=False, timeout=None)
            except StepFailed as exc:
                res.action, res.error = (
                    "failed",
                    f"{to.name}: copy from {frm.name} broke: {exc}; run the pull again to resume",
                )
                break
            finally:
                stop.set()
                poller.join()
            res.bytes += todo
            answer = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
            verdict = json.loads(answer[-1]) if answer else {}
            if out.exit_code == 0 and verdict.get("ok"):
                res.action, res.error = "copied", ""
                break
            if verdict.get("bad") and attempt == 1:  # a blob already there was corrupt: send those again, once
                bad_blobs = {f["blob"] for f in manifest["files"] if f["path"] in verdict["bad"]}
                want = [[b, 0] for b in sorted(bad_blobs)]
                continue
            tail = _copy_problem(out.stderr, to, self.hf_cache) or ops.describe_bad(verdict.get("bad", {}))
            res.action = "failed"
            res.error = (
                f"{to.name}: copy from {frm.name} over {res.via} failed: {tail}; what arrived is kept "
                "(verified files, partial ones resume): run the pull again"
            )
            break
        res.seconds = round(time.monotonic() - t0, 2)
        self.progress.finish(to.name, res.ok, res.error)
        return res


def _blame_feeders(result: PullResult, download_node: Node, edges: list[tuple[Node, Node]]) -> None:
    """A node fed by one that failed says so, not the follower's own "nothing arriving" line."""
    feeder = {to.name: frm.name for frm, to in edges}
    for _frm, to in edges:
        up = feeder[to.name]
        if up in result.nodes and not result.nodes[up].ok and not result.nodes[to.name].ok:
            what = "the download" if up == download_node.name else "the copy"
            result.nodes[to.name] = NodeResult(
                to.name,
                "skipped",
                error=f"{what} on {up} failed before it in the chain (what arrived here is kept: run the pull again)",
            )


def _copy_problem(stderr: str, to: Node, hf_cache: str) -> str:
    """The line that says why a hop failed. Both ends write to one stderr, and the sender's last line is often
    only the broken pipe the receiver's failure caused: a full disk is named as such, and tracebacks skipped."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    if any("No space left on device" in ln for ln in lines):
        return f"{to.name}'s {hf_cache} is full (No space left on device); free space there"
    plain = [ln for ln in lines if not ln.startswith(("Traceback", "File ", "^", "~")) and "BrokenPipe" not in ln]
    return (plain or lines or [""])[-1]


def _mb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
