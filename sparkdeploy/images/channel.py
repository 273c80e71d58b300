"""Streams of bytes into a command on a node, over an SSH channel of its existing connection.

`FeedChannel` runs one command (`docker load`, `docker build -`) and feeds its stdin from a queue, in a
sender thread, while a reader thread collects its output; `Fanout` compresses one archive once (zstd or
gzip, as a local process) and queues the result to several channels. `load_argv` and `load_failure` are the
node's side of a `docker load` and how its end is read.
"""

from __future__ import annotations

import io
import queue
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable
from typing import cast

from sparkdeploy.errors import StepFailed
from sparkdeploy.images.push_progress import PushProgress
from sparkdeploy.runtime.remote import NodeConnection

CHUNK = 1024 * 1024
QUEUE_DEPTH = 16  # chunks buffered per node between the compressor and the SSH channel
STALL_TIMEOUT_S = 300  # a node that reads nothing for this long fails
NO_SPACE = re.compile(r"no space left on device", re.I)


def compressor_argv(method: str) -> list[str] | None:
    if method == "zstd":
        return ["zstd", "-1", "-q", "-c"]
    if method == "gzip":
        return ["pigz", "-1", "-c"] if shutil.which("pigz") else ["gzip", "-1", "-c"]
    return None


def load_argv(method: str) -> list[str]:
    """The node's side: docker load reads gzip and plain tar itself; zstd is unpacked first."""
    if method == "zstd":
        return ["bash", "-c", "set -o pipefail; zstd -d -q -c | docker load"]
    return ["docker", "load"]


def load_failure(exit_code: int | None, output: str) -> str | None:
    """Why a `docker load` failed, from its exit status and output; None when it loaded."""
    text = output.strip()
    tail = " | ".join(text.splitlines()[-4:])
    if NO_SPACE.search(text):
        return f"the node ran out of disk space while loading (docker load: no space left on device): {tail}"
    if exit_code is None:
        return f"docker load did not finish: {tail or 'no output'}"
    if exit_code == -1 or exit_code > 128:  # sshd reports a signal as -1, a shell as 128 + the signal
        return f"docker load was killed on the node (exit {exit_code}): {tail or 'no output'}"
    if exit_code != 0:
        return f"docker load exited {exit_code}: {tail or 'no output'}"
    if "Loaded image" not in text:
        return f"docker load reported no loaded image: {tail or 'no output'}"
    return None


class FeedChannel:
    """A command on a node (`docker load`, `docker build -`) fed through an SSH channel of its connection.

    put() queues bytes for the command's stdin (a sender thread writes them; a node that stops reading for
    `stall_timeout` fails); its output (stdout and stderr together) is collected, and passed to `on_output`
    as it comes when given. finish() ends the input and waits for the exit status.
    """

    def __init__(
        self,
        conn: NodeConnection,
        argv: list[str],
        progress: PushProgress | None = None,
        stall_timeout: float = STALL_TIMEOUT_S,
        on_output: Callable[[bytes], None] | None = None,
    ) -> None:
        self.node = conn.node.name
        self.progress = progress or PushProgress()
        self.on_output = on_output
        self.chan = conn.open().client.get_transport().open_session(timeout=conn.connect_timeout)
        self.chan.set_combine_stderr(True)
        self.chan.settimeout(stall_timeout)
        self.chan.exec_command(shlex.join(argv))
        self.stall_timeout = stall_timeout
        self.queue: queue.Queue[bytes | None] = queue.Queue(maxsize=QUEUE_DEPTH)
        self.error: str | None = None
        self.wire = 0
        self.raw = 0  # archive bytes (before compression) fed to this node's stream
        self.output = bytearray()
        self._closing = False
        self._ended = False
        self._sender = threading.Thread(target=self._send_loop, daemon=True, name=f"push-send-{self.node}")
        self._reader = threading.Thread(target=self._read_loop, daemon=True, name=f"push-read-{self.node}")
        self._sender.start()
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self.error is None

    def put(self, data: bytes | None) -> None:
        while self.error is None:
            try:
                self.queue.put(data, timeout=0.2)
                return
            except queue.Full:
                continue

    def _send_loop(self) -> None:
        try:
            while True:
                try:
                    data = self.queue.get(timeout=0.2)
                except queue.Empty:
                    if self.error is not None:  # aborted while waiting for data
                        return
                    continue
                if data is None:
                    break
                self.chan.sendall(data)
                self.wire += len(data)
                self.progress.advance(self.node, wire=len(data))
            self.chan.shutdown_write()
        except TimeoutError:
            self.error = f"the node read nothing for {self.stall_timeout:g}s"
        except Exception as exc:  # noqa: BLE001 - connection lost, or the node's docker load exited early
            self.error = f"the SSH channel closed while sending ({exc.__class__.__name__}: {exc})"
        finally:
            while self.error is not None and not self.queue.empty():  # unblock a producer
                self.queue.get_nowait()

    def _read_loop(self) -> None:
        while True:
            try:
                data = self.chan.recv(65536)
            except TimeoutError:
                if self._closing:
                    return
                continue
            except Exception:  # noqa: BLE001 - any read failure ends the reader; the writer reports
                return
            if not data:
                return
            self.output += data
            if self.on_output is not None:
                self.on_output(data)

    def end_input(self) -> None:
        """No more input: the command sees the end of its stdin once the queued bytes are sent."""
        if not self._ended:
            self._ended = True
            self.put(None)

    def finish(self, timeout: float) -> tuple[int | None, str]:
        """End the input; wait for the command to exit. Returns (exit status or None, its output)."""
        self.end_input()
        self._sender.join()
        if not self.chan.closed:
            self.chan.status_event.wait(timeout if self.error is None else 5)
        code = self.chan.exit_status if self.chan.exit_status_ready() else None
        self._closing = True
        self._reader.join(timeout=10)
        return code, self.output.decode(errors="replace")

    def abort(self) -> None:
        if self.error is None:
            self.error = "aborted"
        self._closing = True
        try:
            self.chan.close()
        except Exception:  # noqa: BLE001 - aborting: a channel that fails to close is already gone
            pass


class Fanout:
    """One archive for several nodes: compressed once, the result queued to each node's channel."""

    def __init__(self, method: str, channels: list[FeedChannel], progress: PushProgress):
        self.channels = channels
        self.progress = progress
        self.method = method
        argv = compressor_argv(method)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE) if argv else None
        self.pump = threading.Thread(target=self._pump, daemon=True, name="push-compress") if self.proc else None
        if self.pump:
            self.pump.start()
        self.pending = bytearray()  # uncompressed: gathered into chunks

    @property
    def alive(self) -> bool:
        return any(c.alive for c in self.channels)

    def write(self, pieces: list[bytes]) -> None:
        """More of the archive (uncompressed)."""
        self._write(pieces)

    def finish(self) -> None:
        """The archive is complete: flush the compressor and end every channel's input."""
        if self.proc is not None:
            assert self.proc.stdin is not None and self.pump is not None, "stdin=PIPE; a pump runs with every proc"
            self.proc.stdin.close()
            self.pump.join()
            if self.proc.wait() != 0:
                raise StepFailed(f"the local {self.method} compressor failed (exit {self.proc.returncode})")
        elif self.pending:
            self._send(bytes(self.pending))
            self.pending.clear()
        for c in self.channels:
            c.end_input()

    def _write(self, pieces: list[bytes]) -> None:
        size = sum(len(p) for p in pieces)
        if not size:
            return
        if self.proc is not None:
            assert self.proc.stdin is not None, "stdin=PIPE"
            for piece in pieces:
                self.proc.stdin.write(piece)
        else:
            for piece in pieces:
                self.pending += piece
            if len(self.pending) >= CHUNK:
                self._send(bytes(self.pending))
                self.pending.clear()
        for c in self.channels:
            if c.alive:
                c.raw += size
                self.progress.advance(c.node, raw=size)

    def _pump(self) -> None:
        assert self.proc is not None, "the pump runs only with a proc"
        out = cast(io.BufferedReader, self.proc.stdout)  # stdout=PIPE, buffered (the default): a BufferedReader
        while True:
            data = out.read1(CHUNK)
            if not data:
                return
            self._send(data)

    def _send(self, data: bytes) -> None:
        for c in self.channels:
            c.put(data)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def open_loads(
    conns: dict[str, NodeConnection], names: list[str], method: str, progress: PushProgress
) -> tuple[dict[str, FeedChannel], dict[str, str]]:
    """A `docker load` on each named node; returns the channels that started and, per node, why one did not."""
    channels: dict[str, FeedChannel] = {}
    failed: dict[str, str] = {}
    for name in names:
        try:
            channels[name] = FeedChannel(conns[name], load_argv(method), progress)
        except Exception as exc:  # noqa: BLE001 - this node fails, the others go on
            failed[name] = f"could not start docker load over SSH: {exc}"
    return channels, failed


def wait_load(channel: FeedChannel, timeout: float) -> str | None:
    """End the load's input and wait for it; why it failed, or None when it loaded."""
    code, output = channel.finish(timeout)
    error = load_failure(code, output) if code is not None else None
    if error is None and channel.error is not None:
        error = channel.error  # our side failed: the reader, a stall, or the connection
    if error is None and code is None:
        error = "docker load did not finish in time"
    return error


def load_timeout(nbytes: int) -> float:
    """How long a load of `nbytes` may take after its input ends (at least 10 minutes; 20 MB/s beyond)."""
    return max(600.0, nbytes / 20e6)
