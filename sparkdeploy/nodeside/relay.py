"""Runs ON a receiving node of `images push --from`. Started by the previous hop's peer ssh as `relay CONFIG`
of this package's archive (ship.argv): CONFIG is base64 JSON, so it needs no quoting at any depth.

It reads the image stream on stdin and, chunk by chunk, writes it to this node's sink (`zstd -dc | docker
load`) and to the ssh that starts the same relay on the next node of the chain: each node forwards while it
receives, so the source sends every byte once. Progress goes up the chain as `@@sparkdeploy-progress` lines
on stderr, and each hop's result as one `@@sparkdeploy-result` JSON line on stdout (the next hops' lines pass
through first). A hop that cannot forward keeps loading; a sink that fails keeps forwarding.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
import time
from typing import IO, Any, Protocol

from . import ship
from .ship import decode, encode

PROGRESS = "@@sparkdeploy-progress "
RESULT = "@@sparkdeploy-result "
CHUNK = 1 << 20


def next_hop_argv(cfg: dict[str, Any], app: str) -> list[str] | None:
    """argv that starts the relay on the next hop (chain[1]) through this hop's peer ssh prefix; `app`: the
    archive (base64) the relay runs from there."""
    me, rest = cfg["chain"][0], cfg["chain"][1:]
    if not rest:
        return None
    return list(me["next_ssh"]) + [shlex.join(ship.argv("relay", encode(dict(cfg, chain=rest)), app=app))]


def say(stream: IO[str], prefix: str, record: dict[str, Any]) -> None:
    try:
        stream.write(prefix + json.dumps(record, separators=(",", ":")) + "\n")
        stream.flush()
    except (BrokenPipeError, OSError):
        pass


def pipe(stream: IO[bytes] | None) -> IO[bytes]:
    """A child's pipe that was asked for (subprocess.PIPE): never None."""
    if stream is None:
        raise ValueError("no pipe to the child process")
    return stream


class Readable(Protocol):
    """What run_loads reads its frames from: a pipe, or the _Tee that forwards what it reads."""

    def read(self, n: int, /) -> bytes: ...


def _read_exact(stream: Readable, n: int) -> bytes:
    parts: list[bytes] = []
    left = n
    while left:
        data = stream.read(left)
        if not data:
            break
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


class _Load:
    """One `docker load`, its output collected."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.out: list[bytes] = []
        self.reader = threading.Thread(target=lambda: self.out.append(pipe(self.proc.stdout).read()), daemon=True)
        self.reader.start()
        self.broken = False

    def write(self, data: bytes) -> None:
        if not self.broken:
            try:
                pipe(self.proc.stdin).write(data)
            except (BrokenPipeError, OSError):
                self.broken = True

    def close(self) -> None:
        try:
            pipe(self.proc.stdin).close()
        except (BrokenPipeError, OSError):
            pass

    def wait(self) -> tuple[int, str]:
        self.close()
        rc = self.proc.wait()
        self.reader.join(60)
        text = (self.out[0] if self.out else b"").decode(errors="replace")
        return rc, text


def run_loads(stream: Readable, load_argv: list[str], report: list[tuple[int, str]]) -> None:
    """The framed pipeline of loads (node_store_reader): load k+1 receives its layers while load k registers;
    its trailer (config and manifest) goes only once load k has finished, since it names load k's layers.
    A stream cut inside a load ends that load without its trailer: it loads nothing; the loads before stay."""
    prev: _Load | None = None
    current: _Load | None = None
    failed: str | None = None
    while True:
        head = _read_exact(stream, 9)
        if len(head) < 9:
            if head or current is not None:
                failed = failed or "the stream was cut in the middle of a load (the loads before it are kept)"
            break
        kind, size = head[:1], int.from_bytes(head[1:], "big")
        data = _read_exact(stream, size)
        if len(data) < size:
            failed = failed or "the stream was cut in the middle of a load (the loads before it are kept)"
            break
        if failed:
            continue  # drain: the loads after a failed one could not register
        if current is None:
            current = _Load(load_argv)
        if kind == b"T":
            if prev is not None:
                rc, text = prev.wait()
                report.append((rc, text))
                prev = None
                if rc != 0 or "Loaded image" not in text:
                    failed = "a load failed"
                    current.proc.kill()
                    current = None
                    continue
            current.write(data)
            current.close()
            prev, current = current, None
        else:
            current.write(data)
    if current is not None:
        current.proc.kill()
        current.wait()
    if prev is not None:
        report.append(prev.wait())
    if failed and (not report or report[-1][0] == 0):
        report.append((1, failed))


class _Tee:
    """The incoming stream, read by run_loads itself: every chunk it reads is forwarded to the next hop at once
    and counted (progress lines up the chain). Used when the stream is not compressed, so the frames need no
    decompressor between the wire and the loads: one copy less through the node's CPU."""

    def __init__(self, source: IO[bytes], forward: subprocess.Popen[bytes] | None, me: str, err: IO[str]) -> None:
        self.source, self.forward, self.me, self.err = source, forward, me, err
        self.forward_ok = forward is not None
        self.got, self.said = 0, time.monotonic()

    def read(self, n: int, /) -> bytes:
        data = self.source.read(n)
        if data:
            self.got += len(data)
            if self.forward is not None and self.forward_ok:
                try:
                    pipe(self.forward.stdin).write(data)
                except (BrokenPipeError, OSError):
                    self.forward_ok = False
            if time.monotonic() - self.said >= 1.0:
                self.said = time.monotonic()
                say(self.err, PROGRESS, {"node": self.me, "received": self.got})
        return data

    def drain(self) -> None:
        while self.read(CHUNK):
            pass


def relay(
    cfg: dict[str, Any],
    app: str,
    source: IO[bytes] | None = None,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
) -> int:
    source = source or sys.stdin.buffer
    out, err = out or sys.stdout, err or sys.stderr
    me = cfg["chain"][0]["name"]
    sink_out: list[bytes] = []
    loads: list[tuple[int, str]] = []
    argv = next_hop_argv(cfg, app)
    if cfg.get("framed") and list(cfg["decompress"]) == ["cat"]:
        forward = subprocess.Popen(argv, stdin=subprocess.PIPE) if argv else None
        tee = _Tee(source, forward, me, err)
        run_loads(tee, cfg["load"], loads)
        tee.drain()  # run_loads reads to the end; this only makes sure the next hop gets every byte
        return _report(cfg, me, out, err, tee.got, None, forward, loads, sink_out)
    if cfg.get("framed"):  # a pipeline of loads: the relay unpacks the stream and runs each load itself
        sink = subprocess.Popen(cfg["decompress"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        reader = threading.Thread(target=run_loads, args=(sink.stdout, cfg["load"], loads), daemon=True)
    else:
        sink = subprocess.Popen(
            ["bash", "-c", cfg["sink"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        reader = threading.Thread(target=lambda: sink_out.append(pipe(sink.stdout).read()), daemon=True)
    reader.start()
    forward = subprocess.Popen(argv, stdin=subprocess.PIPE) if argv else None  # its stdout/stderr: ours
    got, said = 0, time.monotonic()
    sink_ok, forward_ok = True, forward is not None
    while True:
        data = source.read1(CHUNK) if hasattr(source, "read1") else source.read(CHUNK)
        if not data:
            break
        got += len(data)
        if forward is not None and forward_ok:
            try:
                pipe(forward.stdin).write(data)
            except (BrokenPipeError, OSError):
                forward_ok = False
        if sink_ok:
            try:
                pipe(sink.stdin).write(data)
            except (BrokenPipeError, OSError):
                sink_ok = False
        if time.monotonic() - said >= 1.0:
            said = time.monotonic()
            say(err, PROGRESS, {"node": me, "received": got})
    try:
        pipe(sink.stdin).close()
    except (BrokenPipeError, OSError):
        pass
    return _report(cfg, me, out, err, got, sink, forward, loads, sink_out, reader)


def _report(
    cfg: dict[str, Any],
    me: str,
    out: IO[str],
    err: IO[str],
    got: int,
    sink: subprocess.Popen[bytes] | None,
    forward: subprocess.Popen[bytes] | None,
    loads: list[tuple[int, str]],
    sink_out: list[bytes],
    reader: threading.Thread | None = None,
) -> int:
    """Close the next hop's input, wait for it and for this node's loads, and say this hop's result."""
    say(err, PROGRESS, {"node": me, "received": got})
    if forward is not None:
        try:
            pipe(forward.stdin).close()
        except (BrokenPipeError, OSError):
            pass
    forward_rc = forward.wait() if forward is not None else None
    sink_rc = sink.wait() if sink is not None else 0
    if reader is not None:
        reader.join(3600 if cfg.get("framed") else 60)
    if cfg.get("framed"):
        bad = [(rc, text) for rc, text in loads if rc != 0 or "Loaded image" not in text]
        rc, text = bad[0] if bad else (loads[-1] if loads else (1, "no load arrived"))
        sink_rc = sink_rc or rc
        sink_out = [text.encode()]
    tail = (sink_out[0] if sink_out else b"").decode(errors="replace").strip().splitlines()[-5:]
    say(
        out,
        RESULT,
        {
            "node": me,
            "received": got,
            "load_rc": sink_rc,
            "load_tail": tail,
            "forward_rc": forward_rc,
            "loads": len(loads),
        },
    )
    return 0 if sink_rc == 0 and forward_rc in (None, 0) else 1


def main(argv: list[str]) -> int:
    return relay(decode(argv[0]), ship.own())
