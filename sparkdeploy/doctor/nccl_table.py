"""Reading nccl-tests style all-reduce tables: all_reduce_perf's and the probe's (standard library only, so the
GPU benchmark can import it where only torch is installed)."""

from __future__ import annotations

import re
from typing import Any

ROW = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+|N/A)"
    r"(?:\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+|N/A)|\s+([\d.]+)\s*$)?"
)  # nccl-tests: out-of-place then in-place columns; the probe: in-place, then its host time per call
LAT = re.compile(
    r"4 KiB all-reduce: eager ([\d.]+|n/a)(?: us)?, CUDA graph ([\d.]+|n/a)(?: us)?.*?graph/eager ([\d.]+|n/a)"
)
LAT_ROW = re.compile(r"#\s+latency\s+(eager|graph)\s+(\S+)\s+([\d.]+) us\s+(?:host\s+([\d.]+) us\s+)?(.*)")
FLOOR = re.compile(r"python floor ([\d.]+) us per call")
TEARDOWN = re.compile(r"^# teardown: clean in ([\d.]+) s", re.M)
GROUPS = ("out-of-place", "in-place")


def _wrong(text: str | None) -> int | None:
    return None if text in (None, "N/A") else int(text)


def parse_nccl_table(text: str, group: str = "out-of-place") -> dict[str, Any]:
    """Rows of an nccl-tests style table: `group` picks all_reduce_perf's out-of-place or in-place columns (the
    probe prints one group, read whichever is asked, and its host time per call); the average bus bandwidth line;
    the probe's 4 KiB latency rows and summary line, its python floor and its teardown line."""
    if group not in GROUPS:
        raise ValueError(f"group: one of {', '.join(GROUPS)}")
    rows = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        m = ROW.match(line)
        if not m:
            continue
        first = 6 if group == "out-of-place" or m.group(10) is None else 10
        time_us, algbw, busbw, wrong = (m.group(first + k) for k in range(4))
        rows.append(
            {
                "size": int(m.group(1)),
                "count": int(m.group(2)),
                "type": m.group(3),
                "redop": m.group(4),
                "root": int(m.group(5)),
                "time_us": float(time_us),
                "algbw": float(algbw),
                "busbw": float(busbw),
                "wrong": _wrong(wrong),
                "host_us": float(m.group(14)) if m.group(14) else None,
            }
        )
    out: dict[str, Any] = {"rows": rows}
    m = re.search(r"#\s*Avg bus bandwidth\s*:\s*([\d.]+)", text)
    out["avg_busbw"] = float(m.group(1)) if m else None
    out["peak_busbw"] = max((r["busbw"] for r in rows), default=None)  # type: ignore[type-var]  # busbw is a float in every row
    m = LAT.search(text)
    if m:

        def num(s: str) -> float | None:
            return None if s == "n/a" else float(s)

        out["lat4k"] = {"eager_us": num(m.group(1)), "graph_us": num(m.group(2)), "ratio": num(m.group(3))}
    lat_rows = [
        {
            "id": f"{m.group(1)} {m.group(2)}",
            "mode": m.group(1),
            "path": m.group(2),
            "us": float(m.group(3)),
            "host_us": float(m.group(4)) if m.group(4) else None,
            "method": m.group(5).strip(),
        }
        for m in map(LAT_ROW.fullmatch, text.splitlines())
        if m
    ]
    if lat_rows:
        out.setdefault("lat4k", {})["rows"] = lat_rows
    m = FLOOR.search(text)
    out["python_floor_us"] = float(m.group(1)) if m else None
    m = TEARDOWN.search(text)
    out["teardown_s"] = float(m.group(1)) if m else None
    return out


def row_at(parsed: dict[str, Any], size: int) -> dict[str, Any] | None:
    return next((r for r in parsed.get("rows", []) if r["size"] == size), None)


def median_at(parsed: dict[str, Any], size: int, field: str) -> float | None:
    """The median of `field` over every row of this size (nccl-tests -N prints one row per cycle)."""
    values = sorted(r[field] for r in parsed.get("rows", []) if r["size"] == size)
    if not values:
        return None
    mid = len(values) // 2
    median: float = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2
    return median
