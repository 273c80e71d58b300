"""Runs ON the source node of `images push --from`: `push-source CONFIG` of this package's archive (ship.argv).

The layers the chain lacks, read from the node's layer store as root (store_reader, through `sudo -n`,
where that works without a password) or else from `docker save` of the image, filtered on the fly
(layers.ArchiveFilter); either way the archive loads under a temporary tag, so a cut or failed load moves no
tag. Compressed, into the peer ssh
that starts the relay on the first receiver. Reports `@@sparkdeploy-progress` (archive bytes read, bytes
sent) on stderr and one `@@sparkdeploy-result` line on stdout after the chain's own results.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import IO, Any

from . import ship
from .layers import ArchiveFilter
from .relay import PROGRESS, RESULT, next_hop_argv, pipe, say
from .ship import decode

COMPRESSORS: dict[str, list[str] | None] = {
    "zstd": ["zstd", "-1", "-T0", "-q", "-c"],
    "gzip": ["sh", "-c", "if command -v pigz >/dev/null; then exec pigz -1 -c; else exec gzip -1 -c; fi"],
    "none": None,
}


class _PassThrough:
    """The store reader writes the finished archive itself: nothing to filter."""

    done = False
    ended = False

    def __init__(self) -> None:
        self.bytes_in = 0

    def feed(self, data: bytes) -> list[bytes]:
        self.bytes_in += len(data)
        return [data]

    def finish(self) -> list[bytes]:
        return []


def _read1(stream: IO[bytes] | None) -> bytes:
    """What a child's pipe has now, up to 1 MiB (b"" at its end)."""
    data: bytes = pipe(stream).read1(1 << 20)  # type: ignore[attr-defined]  # a Popen pipe is a BufferedReader
    return data


def produce(cfg: dict[str, Any], app: str, out: IO[str] | None = None, err: IO[str] | None = None) -> int:
    """`app`: the archive (base64) the store reader and the first relay run from."""
    out, err = out or sys.stdout, err or sys.stderr
    me = cfg["relay"]["chain"][0]["name"]
    save, flt = _reader(cfg, app)
    first = next_hop_argv(cfg["relay"], app)
    if first is None:  # the source is chain[0]: a push has at least one receiver
        raise ValueError("push-source: the chain names no receiver")
    compressor = COMPRESSORS[cfg["compress"]]
    if cfg.get("reader_config") and not compressor:
        return _direct(cfg, save, first, me, out, err)
    counts = {"raw": 0, "wire": 0}
    comp: subprocess.Popen[bytes] | None = None
    pump: threading.Thread | None = None
    if compressor:
        comp, hop, pump = _compressed_hop(compressor, first, counts)
        sink = pipe(comp.stdin)
    else:
        hop = subprocess.Popen(first, stdin=subprocess.PIPE)
        sink = pipe(hop.stdin)
    error = _stream(save, flt, sink, counts, compressed=bool(compressor), me=me, err=err)
    early = flt.done
    if early:
        save.kill()
    elif error is not None:
        # The reader may be blocked writing to us: close our end (its next write fails, also through sudo, which
        # cannot pass a kill on to a root child) and ask it to stop.
        pipe(save.stdout).close()
        save.terminate()
    save_err = pipe(save.stderr).read().decode(errors="replace").strip()
    save_rc = save.wait()
    if comp is not None and pump is not None:
        comp.wait()
        pump.join()
    hop_rc = hop.wait()
    if error is None and save_rc != 0 and not early:
        what = "reading the layer store" if cfg.get("reader_config") else "docker save"
        tail = [line for line in save_err.splitlines() if not line.startswith("partial ")]
        error = f"{what} exited {save_rc}: {' | '.join(tail)[-300:]}"
    say(err, PROGRESS, {"node": me, "read": flt.bytes_in, "raw": counts["raw"], "wire": counts["wire"]})
    partials = [line.split()[1] for line in save_err.splitlines() if line.startswith("partial ")]
    say(
        out,
        RESULT,
        {
            "node": me,
            "raw": counts["raw"],
            "wire": counts["wire"],
            "read": flt.bytes_in,
            "error": error,
            "first_hop_rc": hop_rc,
            "finished_early": early,
            "partials": partials,
        },
    )
    return 0 if error is None and hop_rc == 0 else 1


def _reader(cfg: dict[str, Any], app: str) -> tuple[subprocess.Popen[bytes], _PassThrough | ArchiveFilter]:
    """The archive's reader and its filter: the layer store as root (only the layers sent are read, the archive
    finished by the reader) where the config names one, else `docker save` filtered on the fly."""
    if cfg.get("reader_config"):
        save = subprocess.Popen(
            ["sudo", "-n", *ship.argv("store-reader", cfg["reader_config"], app=app)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        return save, _PassThrough()
    save = subprocess.Popen(["docker", "save", cfg["image_id"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    flt = ArchiveFilter(cfg["diff_ids"], set(cfg["needed"]), rename_to=cfg["temp_tag"], image_id=cfg["image_id"])
    return save, flt


def _compressed_hop(
    compressor: list[str], first: list[str], counts: dict[str, int]
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], threading.Thread]:
    """The compressor and the first hop, a thread pumping the compressed bytes from one to the other (counted in
    counts["wire"] on the way). Returns (compressor, first hop, pump), the pump started."""
    comp = subprocess.Popen(compressor, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    hop = subprocess.Popen(first, stdin=subprocess.PIPE)
    hop_in = pipe(hop.stdin)

    def copy() -> None:  # compressed bytes to the first hop, counted on the way
        try:
            while True:
                data = _read1(comp.stdout)
                if not data:
                    break
                counts["wire"] += len(data)
                hop_in.write(data)
        except (BrokenPipeError, OSError):
            # The first hop is gone. Nobody reads the compressor any more: stop it, so the loop below gets a
            # broken pipe instead of waiting forever on a full one.
            comp.kill()
        finally:
            try:
                hop_in.close()
            except (BrokenPipeError, OSError):
                pass

    pump = threading.Thread(target=copy, daemon=True)
    pump.start()
    return comp, hop, pump


def _stream(
    save: subprocess.Popen[bytes],
    flt: _PassThrough | ArchiveFilter,
    sink: IO[bytes],
    counts: dict[str, int],
    *,
    compressed: bool,
    me: str,
    err: IO[str],
) -> str | None:
    """The reader's archive through the filter into `sink` (the compressor or the first hop), counted in counts
    ("wire" too when uncompressed), progress on `err` each second; `sink` closed after. Returns what broke, or
    None."""
    error, said = None, time.monotonic()
    try:
        while not flt.done:
            data = _read1(save.stdout)
            if not data:
                for piece in flt.finish():
                    sink.write(piece)
                    counts["raw"] += len(piece)
                break
            for piece in flt.feed(data):
                sink.write(piece)
                counts["raw"] += len(piece)
                if not compressed:
                    counts["wire"] += len(piece)
            if time.monotonic() - said >= 1.0:
                said = time.monotonic()
                say(err, PROGRESS, {"node": me, "read": flt.bytes_in, "raw": counts["raw"], "wire": counts["wire"]})
    except (BrokenPipeError, OSError) as exc:
        error = f"the stream to the first node broke ({exc.__class__.__name__})"
    except ValueError as exc:
        error = f"docker save: {exc}"
    finally:
        try:
            sink.close()
        except (BrokenPipeError, OSError):
            pass
    return error


def _direct(
    cfg: dict[str, Any],
    save: subprocess.Popen[bytes],
    first: list[str],
    me: str,
    out: IO[str],
    err: IO[str],
) -> int:
    """The store reader's archive needs no filter and, uncompressed, no pump: its stdout is the first hop's
    stdin, so the bytes go from the reader to ssh without a copy through this process (the node's CPU is
    what a push is short of). The reader reports the bytes it wrote on its last stderr line."""
    hop = subprocess.Popen(first, stdin=save.stdout)
    pipe(save.stdout).close()
    save_err = pipe(save.stderr).read().decode(errors="replace").strip()
    save_rc, hop_rc = save.wait(), hop.wait()
    lines = save_err.splitlines()
    sent = next((int(line.split()[1]) for line in reversed(lines) if line.startswith("wrote ")), 0)
    error = None
    if save_rc != 0:
        tail = [line for line in lines if not line.startswith(("partial ", "wrote "))]
        error = (
            f"the stream to the first node broke (its ssh exited {hop_rc})"
            if hop_rc != 0
            else f"reading the layer store exited {save_rc}: {' | '.join(tail)[-300:]}"
        )
    say(err, PROGRESS, {"node": me, "read": sent, "raw": sent, "wire": sent})
    partials = [line.split()[1] for line in lines if line.startswith("partial ")]
    say(
        out,
        RESULT,
        {
            "node": me,
            "raw": sent,
            "wire": sent,
            "read": sent,
            "error": error,
            "first_hop_rc": hop_rc,
            "finished_early": False,
            "partials": partials,
        },
    )
    return 0 if error is None and hop_rc == 0 else 1


def main(argv: list[str]) -> int:
    return produce(decode(argv[0]), ship.own())
