"""The logs of sparkdeploy's containers on every node, merged by time, secrets masked.

One read-only command per node over its host-key-checked SSH connection: `docker logs --timestamps` of each
of our containers (label io.sparkdeploy.managed), every line prefixed with the container's name, so a node
costs one channel however many containers it runs. Lines are merged across nodes by Docker's timestamps
(RFC 3339 in UTC, nanoseconds), and every line passes through the secrets mask before it is printed: an
engine that logs its HF token or the proxy's master key shows `********`.

Follow mode keeps one channel per node open. A node that goes away is reported and followed again once it
answers; the other nodes go on. The remote side ends with the channel: the script waits on its stdin,
which closes when this machine closes the channel or the connection drops, and then stops its followers.
"""

from __future__ import annotations

import queue
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from sparkdeploy.labels import DEPLOYMENT_LABEL, MANAGED_LABEL
from sparkdeploy.runtime.remote import NodeConnection

READ_TIMEOUT_S = 60
RETRY_S = 5.0  # follow: how often a lost node is tried again
REORDER_S = 0.3  # follow: lines are held this long so the nodes' lines come out in time order
_TS = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z")

# $1 the label filter (ours: io.sparkdeploy.managed=true; one stack deployment's: io.sparkdeploy.deployment=NAME),
# $2 --since ('' for none), $3 --tail ('all' or N), $4 follow (1/0), $5... containers
# to show (none: every one of ours). Read-only. In follow mode each container is followed again after it
# restarts (`docker logs -f` ends when the container stops), from the moment its last stream ended.
SCRIPT = r"""
label="$1"; since="$2"; tail="$3"; follow="$4"; shift 4
want=" $* "
names=$(docker ps -a --filter "label=$label" --format '{{.Names}}' 2>/dev/null | sort)
one() {
  c="$1"; s="$since"; t="$tail"
  while :; do
    set -- --timestamps --tail "$t"; [ -n "$s" ] && set -- "$@" --since "$s"; [ "$follow" = 1 ] && set -- "$@" --follow
    docker logs "$@" "$c" 2>&1 | sed -u "s/^/$c /"  # Docker names are [A-Za-z0-9_.-]: inert in sed
    [ "$follow" = 1 ] || return 0
    s=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ); t=all
    while [ "$(docker inspect --format '{{.State.Running}}' "$c" 2>/dev/null)" != true ]; do
      docker inspect "$c" >/dev/null 2>&1 || return 0; sleep 1
    done
  done
}
for c in $names; do
  [ "$want" = "  " ] || case "$want" in *" $c "*) ;; *) continue;; esac
  printf '@@sparkdeploy-logs@@ %s\n' "$c"
  if [ "$follow" = 1 ]; then one "$c" & else one "$c"; fi
done
if [ "$follow" = 1 ]; then cat >/dev/null; kill 0; fi
"""
MARK = "@@sparkdeploy-logs@@ "


@dataclass(frozen=True)
class LogLine:
    node: str
    container: str
    time: str  # Docker's RFC 3339 timestamp ('' when the line had none)
    text: str

    @property
    def key(self) -> str:
        """A sort key in time order: the timestamp with its fraction padded to nanoseconds."""
        m = _TS.fullmatch(self.time)
        if not m:
            return ""
        return f"{m.group(1)}.{(m.group(2) or '').ljust(9, '0')}"

    def short_time(self) -> str:
        m = _TS.fullmatch(self.time)
        return f"{m.group(1)[11:]}.{(m.group(2) or '').ljust(3, '0')[:3]}" if m else "-"


def parse_line(node: str, raw: str) -> LogLine | None:
    """`CONTAINER TIMESTAMP TEXT` (the script's prefix, then docker's) -> LogLine; None for the script's marks."""
    if raw.startswith(MARK):
        return None
    container, _, rest = raw.partition(" ")
    stamp, _, text = rest.partition(" ")
    if not _TS.fullmatch(stamp):  # not a docker line (an error of docker logs itself): keep it whole
        return LogLine(node, container, "", rest)
    return LogLine(node, container, stamp, text)


def parse(node: str, text: str) -> tuple[list[LogLine], list[str]]:
    """The script's output -> (lines, containers shown)."""
    lines, containers = [], []
    for raw in text.splitlines():
        if raw.startswith(MARK):
            containers.append(raw[len(MARK) :].strip())
            continue
        line = parse_line(node, raw)
        if line is not None:
            lines.append(line)
    return lines, containers


def merge(per_node: Iterable[list[LogLine]]) -> list[LogLine]:
    """All nodes' lines in time order (stable: a node's own order is kept for equal times)."""
    return sorted((line for lines in per_node for line in lines), key=lambda line: line.key)


def label_filter(deployment: str | None = None) -> str:
    """Which containers: every one of ours, or one deployment's of a stack (`logs --deployment NAME`)."""
    return f"{DEPLOYMENT_LABEL}={deployment}" if deployment else f"{MANAGED_LABEL}=true"


def _argv(
    since: str | None, tail: int | None, follow: bool, containers: tuple[str, ...], label: str | None = None
) -> list[str]:
    return [
        "bash",
        "-c",
        SCRIPT,
        "sparkdeploy-logs",
        label or label_filter(),
        since or "",
        "all" if tail is None else str(tail),
        "1" if follow else "0",
        *containers,
    ]


def read(
    conn: NodeConnection,
    since: str | None = None,
    tail: int | None = None,
    containers: tuple[str, ...] = (),
    label: str | None = None,
) -> tuple[list[LogLine], list[str]]:
    """One node's logs (not following). label: label_filter()'s."""
    result = conn.run(_argv(since, tail, False, containers, label), check=False, timeout=READ_TIMEOUT_S)
    return parse(conn.node.name, result.stdout)


# -- follow ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Notice:
    """Something to tell the user about a node while following (lost, back)."""

    node: str
    text: str


def _stream(conn: NodeConnection, argv: list[str], stop: threading.Event) -> Iterator[str]:
    """Lines of one long-running command on the node, until it ends, the channel drops or `stop` is set."""
    transport = conn.open().client.get_transport()
    chan = transport.open_session(timeout=conn.connect_timeout)
    try:
        chan.settimeout(1.0)
        chan.exec_command(shlex.join(argv))  # stdin stays open: the script ends when the channel closes
        pending = b""
        while not stop.is_set():
            try:
                data = chan.recv(65536)
            except TimeoutError:
                if not transport.is_active():
                    raise ConnectionError("the SSH connection dropped") from None
                continue
            if not data:
                break
            pending += data
            *complete, pending = pending.split(b"\n")
            for raw in complete:
                yield raw.decode(errors="replace")
        if pending:
            yield pending.decode(errors="replace")
    finally:
        chan.close()


def follow(
    conns: list[NodeConnection],
    emit: Callable[[LogLine | Notice], None],
    stop: threading.Event,
    since: str | None = None,
    tail: int | None = None,
    containers: tuple[str, ...] = (),
    label: str | None = None,
) -> None:
    """Follow every node until `stop` is set. A node that drops is announced, retried every RETRY_S seconds
    (from its last line's time, so nothing is shown twice), and announced again when it is back."""
    out: queue.Queue[LogLine | Notice] = queue.Queue()

    def node_loop(conn: NodeConnection) -> None:
        name = conn.node.name
        last = ""  # the newest timestamp seen from this node
        lost = False
        while not stop.is_set():
            try:
                # Again after a drop: from the last line shown (docker's --since includes it; skipped below).
                argv = (
                    _argv(last, None, True, containers, label) if last else _argv(since, tail, True, containers, label)
                )
                for raw in _stream(conn, argv, stop):
                    if lost:
                        out.put(Notice(name, "back; following it again"))
                        lost = False
                    line = parse_line(name, raw)
                    if line is None:
                        continue
                    if line.time and last and line.key <= _key(last):
                        continue  # already shown before the node dropped
                    if line.time:
                        last = line.time
                    out.put(line)
                if stop.is_set():
                    return
                raise ConnectionError("the log stream ended")
            except Exception as exc:  # noqa: BLE001 - any failure of one node is reported, the others go on
                if stop.is_set():
                    return
                if not lost:
                    out.put(
                        Notice(
                            name,
                            f"lost ({exc.__class__.__name__}: {exc}); following the other nodes, "
                            f"retrying every {RETRY_S:g} s",
                        )
                    )
                    lost = True
                conn.close()  # a dead connection closes quietly (NodeConnection.close)
                stop.wait(RETRY_S)

    threads = [threading.Thread(target=node_loop, args=(c,), daemon=True, name=f"logs-{c.node.name}") for c in conns]
    for t in threads:
        t.start()
    held: list[LogLine] = []
    held_since: float | None = None
    while not stop.is_set():
        try:
            item = out.get(timeout=0.1)
        except queue.Empty:
            item = None
        if isinstance(item, Notice):
            emit(item)
        elif item is not None:
            held.append(item)
            held_since = held_since or time.monotonic()
        if held and (time.monotonic() - (held_since or 0)) >= REORDER_S:
            for line in sorted(held, key=lambda line: line.key):
                emit(line)
            held, held_since = [], None
    for line in sorted(held, key=lambda line: line.key):
        emit(line)


def _key(stamp: str) -> str:
    return LogLine("", "", stamp, "").key
