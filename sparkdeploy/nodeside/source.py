"""Runs ON the source node of `images push --from`: `push-source CONFIG` of this package's archive (ship.argv).

The layers the chain lacks, read from the node's layer store as root (store_reader, through `sudo -n`,
where that works without a password) or else from `docker save` of the image, filtered on the fly
(layers.ArchiveFilter); either way the archive loads under a temporary tag, so a cut or failed load moves no
tag. Compressed, into the peer ssh
that starts the relay on the first receiver. Reports `@@sparkdeploy-progress` (archive bytes read, bytes
sent) on stderr and one `@@sparkdeploy-result` line on stdout after the chain's own results.
"""

import subprocess
import sys
import threading
import time

from . import ship
from .layers import ArchiveFilter
from .relay import PROGRESS, RESULT, next_hop_argv, say
from .ship import decode

COMPRESSORS = {
    "zstd": ["zstd", "-1", "-T0", "-q", "-c"],
    "gzip": ["sh", "-c", "if command -v pigz >/dev/null; then exec pigz -1 -c; else exec gzip -1 -c; fi"],
    "none": None,
}


class _PassThrough:
    """The store reader writes the finished archive itself: nothing to filter."""

    done = False
    ended = False

    def __init__(self):
        self.bytes_in = 0

    def feed(self, data):
        self.bytes_in += len(data)
        return [data]

    def finish(self):
        return []


def produce(cfg, app, out=None, err=None):
    """`app`: the archive (base64) the store reader and the first relay run from."""
    out, err = out or sys.stdout, err or sys.stderr
    me = cfg["relay"]["chain"][0]["name"]
    if cfg.get("reader_config"):  # the layer store, as root: only the layers sent are read
        save = subprocess.Popen(
            ["sudo", "-n", *ship.argv("store-reader", cfg["reader_config"], app=app)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        flt = _PassThrough()
    else:
        save = subprocess.Popen(["docker", "save", cfg["image_id"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        flt = ArchiveFilter(cfg["diff_ids"], set(cfg["needed"]), rename_to=cfg["temp_tag"], image_id=cfg["image_id"])
    first = next_hop_argv(cfg["relay"], app)
    compressor = COMPRESSORS[cfg["compress"]]
    if cfg.get("reader_config") and not compressor:
        return _direct(cfg, save, first, me, out, err)
    counts = {"raw": 0, "wire": 0}
    pump = None
    if compressor:
        comp = subprocess.Popen(compressor, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        hop = subprocess.Popen(first, stdin=subprocess.PIPE)
        sink = comp.stdin

        def copy():  # compressed bytes to the first hop, counted on the way
            try:
                while True:
                    data = comp.stdout.read1(1 << 20)
                    if not data:
                        break
                    counts["wire"] += len(data)
                    hop.stdin.write(data)
            except (BrokenPipeError, OSError):
                # The first hop is gone. Nobody reads the compressor any more: stop it, so the loop below gets a
                # broken pipe instead of waiting forever on a full one.
                comp.kill()
            finally:
                try:
                    hop.stdin.close()
                except (BrokenPipeError, OSError):
                    pass

        pump = threading.Thread(target=copy, daemon=True)
        pump.start()
    else:
        comp, hop = None, subprocess.Popen(first, stdin=subprocess.PIPE)
        sink = hop.stdin
    error, said = None, time.monotonic()
    try:
        while not flt.done:
            data = save.stdout.read1(1 << 20)
            if not data:
                for piece in flt.finish():
                    sink.write(piece)
                    counts["raw"] += len(piece)
                break
            for piece in flt.feed(data):
                sink.write(piece)
                counts["raw"] += len(piece)
                if not compressor:
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
    early = flt.done
    if early:
        save.kill()
    elif error is not None:
        # The reader may be blocked writing to us: close our end (its next write fails, also through sudo, which
        # cannot pass a kill on to a root child) and ask it to stop.
        save.stdout.close()
        save.terminate()
    save_err = save.stderr.read().decode(errors="replace").strip()
    save_rc = save.wait()
    if comp is not None:
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


def _direct(cfg, save, first, me, out, err):
    """The store reader's archive needs no filter and, uncompressed, no pump: its stdout is the first hop's
    stdin, so the bytes go from the reader to ssh without a copy through this process (the node's CPU is
    what a push is short of). The reader reports the bytes it wrote on its last stderr line."""
    hop = subprocess.Popen(first, stdin=save.stdout)
    save.stdout.close()
    save_err = save.stderr.read().decode(errors="replace").strip()
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


def main(argv):
    return produce(decode(argv[0]), ship.own())
