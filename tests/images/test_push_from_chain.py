"""The relay that runs on each receiving node of `images push --from` (nodeside/relay.py), run here as real
processes from the archive shipped to the nodes: each hop started by the previous one through a command prefix
(`sh -c` standing in for the peer ssh prefix, which the lab test uses for real), loads what it receives and
forwards it as it arrives."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from sparkdeploy.nodeside import ship
from sparkdeploy.nodeside.relay import PROGRESS, RESULT
from sparkdeploy.nodeside.ship import encode


def run_chain(tmp_path: Path, names: list[str], data: bytes, sink: str) -> tuple[list[dict], str, int]:
    hops = [{"name": n, "next_ssh": ["sh", "-c"] if i + 1 < len(names) else None} for i, n in enumerate(names)]
    cfg = {"sink": sink, "chain": hops}
    proc = subprocess.run(
        ship.argv("relay", encode(cfg)),
        input=data,
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
        env=dict(os.environ, OUT=str(tmp_path)),
    )
    results = [json.loads(line[len(RESULT) :]) for line in proc.stdout.decode().splitlines() if line.startswith(RESULT)]
    return results, proc.stderr.decode(), proc.returncode


def test_every_hop_loads_the_whole_stream_and_forwards_it(tmp_path):
    data = os.urandom(3_500_000)
    results, err, code = run_chain(tmp_path, ["n2", "n3", "n4"], data, 'cat > "$(mktemp -p "$OUT" got.XXXX)"')
    assert code == 0, err
    assert [r["node"] for r in results] == ["n4", "n3", "n2"]  # the last hop reports first, up the chain
    assert all(r["received"] == len(data) and r["load_rc"] == 0 for r in results)
    assert [r["forward_rc"] for r in results] == [None, 0, 0]
    got = sorted(tmp_path.glob("got.*"))
    assert len(got) == 3 and all(p.read_bytes() == data for p in got)
    progress = [json.loads(line[len(PROGRESS) :]) for line in err.splitlines() if line.startswith(PROGRESS)]
    assert {p["node"] for p in progress} == {"n2", "n3", "n4"}


def test_a_failing_sink_keeps_forwarding_and_is_reported(tmp_path):
    data = os.urandom(500_000)
    sink = (
        'if [ -e "$OUT/failed-once" ]; then cat > "$(mktemp -p "$OUT" got.XXXX)"; '
        'else touch "$OUT/failed-once"; echo "no space left on device" >&2; exit 3; fi'
    )
    results, _err, code = run_chain(tmp_path, ["n2", "n3"], data, sink)
    assert code == 1  # the first hop's own load failed
    by = {r["node"]: r for r in results}
    assert by["n2"]["load_rc"] == 3 and "no space left on device" in by["n2"]["load_tail"][-1]
    assert by["n3"]["load_rc"] == 0 and by["n3"]["received"] == len(data)
    assert [p.read_bytes() for p in tmp_path.glob("got.*")] == [data]


def _frames(*parts: tuple[bytes, bytes]) -> bytes:
    return b"".join(kind + len(data).to_bytes(8, "big") + data for kind, data in parts)


def test_framed_stream_becomes_a_pipeline_of_loads_and_a_cut_keeps_the_finished_ones(tmp_path, monkeypatch):
    import io

    from sparkdeploy.nodeside.relay import run_loads

    monkeypatch.setenv("OUT", str(tmp_path))
    load = ["sh", "-c", 'f=$(mktemp -p "$OUT" load.XXXX); cat > "$f"; echo "Loaded image ID: $(wc -c < "$f")"']
    report: list = []
    run_loads(
        io.BytesIO(_frames((b"B", b"a" * 10), (b"B", b"b" * 5), (b"T", b"t1"), (b"B", b"c" * 7), (b"T", b"t2"))),
        load,
        report,
    )
    assert [rc for rc, _ in report] == [0, 0]
    assert sorted(p.read_bytes() for p in tmp_path.glob("load.*")) == sorted(
        [b"a" * 10 + b"b" * 5 + b"t1", b"c" * 7 + b"t2"]
    )
    for p in tmp_path.glob("load.*"):
        p.unlink()
    report = []
    cut = _frames((b"B", b"x" * 4), (b"T", b"t1"), (b"B", b"y" * 9))[:-3]  # cut inside the second load's layers
    run_loads(io.BytesIO(cut), load, report)
    assert report[0][0] == 0 and report[-1][0] == 1 and "cut in the middle of a load" in report[-1][1]
    assert b"x" * 4 + b"t1" in [p.read_bytes() for p in tmp_path.glob("load.*")]


def test_a_framed_chain_loads_on_every_hop_uncompressed_and_compressed(tmp_path):
    """Framed (the layer-store reader's pipeline of loads) over three hops: uncompressed, each relay parses the
    frames straight off the wire and forwards what it reads (no decompressor); with gzip, through `gzip -d`."""
    import gzip

    data = _frames((b"B", os.urandom(300_000)), (b"T", b"trailer-1"), (b"B", os.urandom(200_000)), (b"T", b"trailer-2"))
    load = ["sh", "-c", 'f=$(mktemp -p "$OUT" load.XXXX); cat > "$f"; echo "Loaded image ID: $(wc -c < "$f")"']
    for decompress, wire in ((["cat"], data), (["gzip", "-d", "-c"], gzip.compress(data, 1))):
        out = tmp_path / decompress[0]
        out.mkdir()
        hops = [{"name": n, "next_ssh": ["sh", "-c"] if i < 2 else None} for i, n in enumerate(["n2", "n3", "n4"])]
        cfg = {"sink": "", "chain": hops, "framed": True, "decompress": decompress, "load": load}
        proc = subprocess.run(
            ship.argv("relay", encode(cfg)),
            input=wire,
            capture_output=True,
            timeout=60,
            cwd=out,
            env=dict(os.environ, OUT=str(out)),
        )
        results = [
            json.loads(line[len(RESULT) :]) for line in proc.stdout.decode().splitlines() if line.startswith(RESULT)
        ]
        assert proc.returncode == 0, proc.stderr.decode()
        assert sorted(r["node"] for r in results) == ["n2", "n3", "n4"]
        assert all(r["received"] == len(wire) and r["load_rc"] == 0 and r["loads"] == 2 for r in results), results
        loads = sorted(p.read_bytes() for p in out.glob("load.*"))
        first, second = data[: data.index(b"trailer-1") + 9], data[data.index(b"trailer-1") + 9 :]

        def body(part: bytes) -> bytes:  # what a load receives: the frames' payloads
            return b"".join(p[9:] for p in _split(part))

        assert loads == sorted([body(first), body(second)] * 3)


def _split(stream: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(stream):
        size = int.from_bytes(stream[pos + 1 : pos + 9], "big")
        out.append(stream[pos : pos + 9 + size])
        pos += 9 + size
    return out
