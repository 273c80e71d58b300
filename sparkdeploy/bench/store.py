"""Stored benchmark results: one JSON file per measured cell (recipe, topology variant, pp, tg, concurrency).

A file holds the three metrics the reports use (mean, stdev and every run's value), the metadata of what was
measured (recipe, topology, backend, routing, image ID, vLLM version, nodes, endpoint, date, tool versions)
and llama-benchy's own JSON report, unchanged. Files are written atomically (temp file + rename), so a sweep
killed mid-write never leaves a half file, and a file that exists is a finished measurement.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkdeploy.config.userfile import load_json_file
from sparkdeploy.errors import ConfigError

SCHEMA = "sparkdeploy-bench-result/1"


@dataclass(frozen=True)
class MetricDef:
    key: str
    title: str
    unit: str
    higher_is_better: bool
    benchy_field: str  # the field of llama-benchy's per-run JSON it comes from


# llama-benchy 0.4.0: at concurrency > 1, tg_throughput and pp_throughput are totals over the window from the
# first request's start to the last token (per request at c1); e2e_ttft is first content chunk - request start.
METRICS: dict[str, MetricDef] = {
    "decode_tps": MetricDef("decode_tps", "Decode throughput", "t/s", True, "tg_throughput"),
    "prefill_tps": MetricDef("prefill_tps", "Prefill throughput", "t/s", True, "pp_throughput"),
    "ttft_ms": MetricDef("ttft_ms", "Time to first token", "ms", False, "e2e_ttft"),
}

# The seeds' columns, in seed 002's order and with its names.
VARIANT_ORDER = ["solo", "cluster", "2xsolo-shuffle", "2xsolo-least-busy", "replicas"]
VARIANT_LABELS = {
    "solo": "Solo",
    "cluster": "Cluster TP=2",
    "2xsolo-shuffle": "Shuffle",
    "2xsolo-least-busy": "Least-busy",
    "replicas": "Replicas",
}


def variant_of(topology: str, routing: str | None = None) -> str:
    """The column a measurement belongs to: the topology, and for 2xsolo the proxy's routing strategy."""
    if topology != "2xsolo":
        return topology
    routing = routing or "simple-shuffle"
    return "2xsolo-shuffle" if routing == "simple-shuffle" else f"2xsolo-{routing}"


def routing_of(variant: str) -> str | None:
    """The inverse of variant_of for 2xsolo columns: the proxy's routing strategy."""
    if not variant.startswith("2xsolo-"):
        return None
    routing = variant[len("2xsolo-") :]
    return "simple-shuffle" if routing == "shuffle" else routing


def variant_label(variant: str) -> str:
    if variant in VARIANT_LABELS:
        return VARIANT_LABELS[variant]
    if variant.startswith("2xsolo-"):
        return f"2xSolo {variant[len('2xsolo-') :]}"
    return variant


def variant_sort_key(variant: str) -> tuple[int, str]:
    return (VARIANT_ORDER.index(variant) if variant in VARIANT_ORDER else len(VARIANT_ORDER), variant)


@dataclass
class Stat:
    mean: float
    std: float | None = None
    values: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std, "values": self.values}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stat:
        return cls(
            float(data["mean"]),
            None if data.get("std") is None else float(data["std"]),
            [float(v) for v in data.get("values") or []],
        )


@dataclass
class BenchResult:
    recipe: str
    variant: str
    pp: int
    tg: int
    concurrency: int
    metrics: dict[str, Stat]
    metadata: dict[str, Any] = field(default_factory=dict)
    llama_benchy: dict[str, Any] | None = None
    path: Path | None = None

    @property
    def key(self) -> tuple[str, str, int, int, int]:
        return (self.recipe, self.variant, self.pp, self.tg, self.concurrency)

    @property
    def runs(self) -> int:
        return int(self.metadata.get("runs") or 0)

    @property
    def errors(self) -> int:
        return int(self.metadata.get("failed_requests") or 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "recipe": self.recipe,
            "variant": self.variant,
            "pp": self.pp,
            "tg": self.tg,
            "concurrency": self.concurrency,
            "metrics": {k: v.to_json() for k, v in self.metrics.items()},
            "metadata": self.metadata,
            "llama_benchy": self.llama_benchy,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], path: Path | None = None) -> BenchResult:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a sparkdeploy bench result (schema {data.get('schema')!r})")
        return cls(
            recipe=str(data["recipe"]),
            variant=str(data["variant"]),
            pp=int(data["pp"]),
            tg=int(data["tg"]),
            concurrency=int(data["concurrency"]),
            metrics={k: Stat.from_json(v) for k, v in (data.get("metrics") or {}).items()},
            metadata=dict(data.get("metadata") or {}),
            llama_benchy=data.get("llama_benchy"),
            path=path,
        )


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "unnamed"


def result_filename(recipe: str, variant: str, pp: int, tg: int, concurrency: int) -> str:
    return f"{_safe(recipe)}__{_safe(variant)}__pp{pp}-tg{tg}__c{concurrency}.json"


def result_path(out_dir: Path, recipe: str, variant: str, pp: int, tg: int, concurrency: int) -> Path:
    return Path(out_dir) / result_filename(recipe, variant, pp, tg, concurrency)


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def save_result(result: BenchResult, out_dir: Path) -> Path:
    path = result_path(out_dir, *result.key)
    write_json_atomic(path, result.to_json())
    result.path = path
    return path


MAX_RESULT_BYTES = 64 << 20  # a result with every request's timings


def read_result(path: Path) -> BenchResult:
    return BenchResult.from_json(load_json_file(path, "benchmark result", limit=MAX_RESULT_BYTES), Path(path))


def stored(
    out_dir: Path,
    recipe: str,
    variant: str,
    pp: int,
    tg: int,
    concurrency: int,
    min_runs: int = 1,
    same: dict[str, Any] | None = None,
) -> BenchResult | None:
    """The finished measurement of that cell, or None (missing, unreadable, too few runs, failed requests, or
    metadata that differs from `same`, e.g. another image: those cells are measured again)."""
    path = result_path(out_dir, recipe, variant, pp, tg, concurrency)
    if not path.is_file():
        return None
    try:
        result = read_result(path)
    except (ValueError, KeyError, TypeError, ConfigError):
        return None
    if result.runs < min_runs or result.errors or not all(m in result.metrics for m in METRICS):
        return None
    if any(result.metadata.get(k) != v for k, v in (same or {}).items()):
        return None
    return result


def load_results(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[BenchResult], list[str]]:
    """Every result file under the given folders (recursively) or files; and one line per file skipped.
    Where two files measure the same cell, the newest (by metadata date) is kept and the other one reported."""
    found: dict[tuple[str, str, int, int, int], BenchResult] = {}
    skipped: list[str] = []
    for given in paths:
        p = Path(given)
        files = sorted(p.rglob("*.json")) if p.is_dir() else [p]
        if not p.exists():
            skipped.append(f"{p}: no such file or folder")
            continue
        for f in files:
            try:
                data = load_json_file(f, "benchmark result", limit=MAX_RESULT_BYTES)
            except ConfigError as exc:
                skipped.append(f"unreadable: {exc.problems[0]}")
                continue
            if not isinstance(data, dict) or data.get("schema") != SCHEMA:
                continue  # reports, llama-benchy's own files: not ours to read
            try:
                result = BenchResult.from_json(data, f)
            except (ValueError, KeyError, TypeError) as exc:
                skipped.append(f"{f}: not a valid result ({exc})")
                continue
            old = found.get(result.key)
            if old is not None:
                newer, older = sorted([old, result], key=lambda r: str(r.metadata.get("date", "")), reverse=True)
                skipped.append(f"{older.path}: same cell as {newer.path} (kept the newer)")
                result = newer
            found[result.key] = result
    return sorted(
        found.values(), key=lambda r: (r.recipe, r.pp, r.tg, variant_sort_key(r.variant), r.concurrency)
    ), skipped


def metrics_from_llama_benchy(report: dict[str, Any], pp: int, tg: int, concurrency: int) -> dict[str, Stat]:
    """The three metrics of one llama-benchy JSON report (format json, 0.4.0) for the pp/tg/concurrency asked."""
    runs = [
        b
        for b in report.get("benchmarks") or []
        if not b.get("is_context_prefill_phase")
        and int(b.get("concurrency", 0)) == concurrency
        and int(b.get("prompt_size", 0)) == pp
        and int(b.get("response_size", 0)) == tg
    ]
    if not runs:
        raise ValueError(f"llama-benchy's report has no run for pp{pp} tg{tg} c{concurrency}")
    run = runs[-1]
    out: dict[str, Stat] = {}
    for key, mdef in METRICS.items():
        metric = run.get(mdef.benchy_field)
        if metric:
            out[key] = Stat(float(metric["mean"]), float(metric["std"]), [float(v) for v in metric.get("values") or []])
    return out
