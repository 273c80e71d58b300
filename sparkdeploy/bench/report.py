"""Reports of stored results: tables by concurrency x topology (mean ± stdev, a Winner column with its margin in
percent, seed 002's format), PNG line charts (matplotlib, Agg), a Markdown report with the tables and mermaid
xychart-beta blocks, the same as JSON and as CSV, and the agreement of the winners with the shipped reference
tables. Figures of a simulated engine say SIMULATED in every one of them (sparkdeploy/simulated.py's LABEL): the
Markdown's headings, table headers, mermaid titles and image texts, the JSON's groups and tables, each CSV row,
the PNG's title, watermark and metadata.

Winner margin: the winner against the runner-up among the measured columns, in percent of the runner-up
((best - second) / second; negative for TTFT, where lower is better). Seed 002's own Winner column measured a
Cluster win against Solo and a Shuffle win against Cluster; the reference section shows those strings verbatim.
A margin smaller than the combined standard error of the two means is marked `~` (within noise, one sigma).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkdeploy.bench.seeds import Reference, reference_for
from sparkdeploy.bench.store import (
    METRICS,
    BenchResult,
    MetricDef,
    Stat,
    variant_label,
    variant_sort_key,
    write_json_atomic,
)
from sparkdeploy.simulated import LABEL as SIMULATED
from sparkdeploy.simulated import NOTE as SIMULATED_NOTE
from sparkdeploy.simulated import any_simulated, tag

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

WINNER_NAMES = {"solo": "Solo", "cluster": "Cluster", "2xsolo-shuffle": "Shuffle", "2xsolo-least-busy": "Least-busy"}
COLORS = {"solo": "#6b7280", "cluster": "#3b82f6", "2xsolo-shuffle": "#22c55e", "2xsolo-least-busy": "#ef4444"}
CHART_FILES = {"decode_tps": "decode.png", "prefill_tps": "prefill.png", "ttft_ms": "ttft.png"}
PNG_DATA_KEY = "sparkdeploy-bench"  # a PNG text chunk holding the plotted numbers as JSON


def winner_name(variant: str) -> str:
    return WINNER_NAMES.get(variant, variant_label(variant))


@dataclass
class Winner:
    variant: str
    margin_pct: float
    runner_up: str
    within_noise: bool

    def text(self) -> str:
        return f"{winner_name(self.variant)} ({self.margin_pct:+.0f}%)" + (" ~" if self.within_noise else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "name": winner_name(self.variant),
            "margin_pct": round(self.margin_pct, 2),
            "runner_up": self.runner_up,
            "within_noise": self.within_noise,
            "text": self.text(),
        }


def pick_winner(metric: MetricDef, cells: dict[str, Stat]) -> Winner | None:
    """The best column of one row and its margin over the runner-up; None with fewer than two columns."""
    present = {v: s for v, s in cells.items() if s is not None and s.mean is not None}
    if len(present) < 2:
        return None
    ranked = sorted(present, key=lambda v: present[v].mean, reverse=metric.higher_is_better)
    best, second = ranked[0], ranked[1]
    b, s = present[best], present[second]
    margin = (b.mean - s.mean) / s.mean * 100.0 if s.mean else 0.0
    return Winner(best, margin, second, abs(b.mean - s.mean) < math.hypot(std_error(b), std_error(s)))


def std_error(stat: Stat) -> float:
    """The standard error of a mean: stdev / sqrt(n) over its values (runs, or requests for TTFT); the stdev
    itself where the values are not known (the reference tables)."""
    if stat.std is None:
        return 0.0
    n = len(stat.values)
    return stat.std / math.sqrt(n) if n > 1 else stat.std


@dataclass
class Table:
    metric: MetricDef
    variants: list[str]
    concurrency: list[int]
    cells: dict[tuple[str, int], Stat]
    runs: dict[tuple[str, int], int] = field(default_factory=dict)

    def row(self, c: int) -> dict[str, Stat]:
        return {v: self.cells[(v, c)] for v in self.variants if (v, c) in self.cells}

    def winner(self, c: int) -> Winner | None:
        return pick_winner(self.metric, self.row(c))

    def series(self, variant: str) -> list[float | None]:
        return [self.cells[(variant, c)].mean if (variant, c) in self.cells else None for c in self.concurrency]


def build_table(metric_key: str, results: list[BenchResult]) -> Table:
    cells, runs = {}, {}
    for r in results:
        if metric_key in r.metrics:
            cells[(r.variant, r.concurrency)] = r.metrics[metric_key]
            runs[(r.variant, r.concurrency)] = r.runs
    variants = sorted({v for v, _ in cells}, key=variant_sort_key)
    conc = sorted({c for _, c in cells})
    return Table(METRICS[metric_key], variants, conc, cells, runs)


def fmt_value(metric_key: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric_key == "decode_tps":
        return f"{value:,.1f}"
    return f"{value:,.0f}"


def figures_line(metrics: dict[str, Stat], simulated: bool) -> str:
    """One measured level in one line (`bench`, `bench sweep`), labelled when the engine is simulated. A metric
    llama-benchy did not report (a prefill too short to time) shows as '-'."""

    def mean(key: str, fmt: str) -> str:
        return format(metrics[key].mean, fmt) if key in metrics else "-"

    decode = metrics.get("decode_tps")
    spread = f" ± {decode.std or 0:.1f}" if decode is not None else ""
    return (
        f"decode {mean('decode_tps', '.1f')}{spread} t/s, prefill {mean('prefill_tps', '.0f')} t/s, "
        f"TTFT {mean('ttft_ms', '.0f')} ms{tag(simulated)}"
    )


def fmt_cell(metric_key: str, stat: Stat | None) -> str:
    if stat is None:
        return "-"
    text = fmt_value(metric_key, stat.mean)
    if stat.std is not None:
        text += f" ± {fmt_value(metric_key, stat.std)}"
    return text


# ---------------------------------------------------------------- agreement with the reference


def winner_agreement(tables: dict[str, Table], reference: Reference) -> dict[str, Any]:
    """For each metric, the cells (concurrency levels) where the measured winner is the reference's winner among
    the same columns. Decode and TTFT together are the headline figure."""
    ref_tables = {m: build_table(m, reference.results) for m in METRICS}
    out: dict[str, Any] = {"reference": reference.name, "metrics": {}}
    totals = {"agree": 0, "cells": 0}
    for m, table in tables.items():
        ref = ref_tables[m]
        cells = []
        for c in table.concurrency:
            measured_row = table.row(c)
            common = [v for v in measured_row if (v, c) in ref.cells]
            if len(common) < 2:
                continue
            mw = pick_winner(table.metric, {v: measured_row[v] for v in common})
            rw = pick_winner(ref.metric, {v: ref.cells[(v, c)] for v in common})
            if mw is None or rw is None:  # a shared cell without a mean (llama-benchy left the metric out)
                continue
            cells.append(
                {
                    "concurrency": c,
                    "measured": mw.variant,
                    "measured_text": mw.text(),
                    "reference": rw.variant,
                    "reference_text": rw.text(),
                    "reference_published": reference.winner_as_published.get(m, {}).get(str(c)),
                    "agree": mw.variant == rw.variant,
                }
            )
        agree = sum(1 for x in cells if x["agree"])
        out["metrics"][m] = {
            "agree": agree,
            "cells": len(cells),
            "pct": round(100.0 * agree / len(cells), 1) if cells else None,
            "rows": cells,
        }
        if m in ("decode_tps", "ttft_ms"):
            totals["agree"] += agree
            totals["cells"] += len(cells)
    out["decode_and_ttft"] = dict(
        totals, pct=round(100.0 * totals["agree"] / totals["cells"], 1) if totals["cells"] else None
    )
    return out


# ---------------------------------------------------------------- grouping


@dataclass
class Group:
    recipe: str
    pp: int
    tg: int
    results: list[BenchResult]
    tables: dict[str, Table]
    reference: Reference | None
    agreement: dict[str, Any] | None

    @property
    def slug(self) -> str:
        return f"{self.recipe}-pp{self.pp}-tg{self.tg}"

    @property
    def simulated(self) -> bool:
        """Any column from a simulated engine labels the whole group (report.md, tables, charts)."""
        return any_simulated(r.metadata for r in self.results)

    def summary(self) -> dict[str, Any]:
        """What was measured: one entry per column; values that differ between its levels are all listed."""
        keys = (
            "topology",
            "backend",
            "routing",
            "image",
            "image_id",
            "engine",
            "simulated",
            "llama_benchy_version",
        )
        by_variant: dict[str, dict[str, Any]] = {}
        for r in self.results:
            md = r.metadata
            e = by_variant.setdefault(
                r.variant,
                {
                    "variant": r.variant,
                    "label": variant_label(r.variant),
                    "nodes": md.get("nodes"),
                    "failed_requests": 0,
                    **{k: set() for k in keys + ("dates", "runs")},
                },
            )
            md = dict(md, engine=engine_text(md))
            for k in keys:
                if md.get(k) is not None:
                    e[k].add(md[k] if not isinstance(md[k], (list, dict)) else json.dumps(md[k]))
            if md.get("date"):
                e["dates"].add(str(md["date"])[:10])
            e["runs"].add(r.runs)
            e["failed_requests"] += r.errors
        out = []
        for v in sorted(by_variant, key=variant_sort_key):
            e = by_variant[v]
            for k in keys + ("dates", "runs"):
                e[k] = sorted(e[k], key=str)
            out.append(e)
        return {"recipe": self.recipe, "pp": self.pp, "tg": self.tg, "columns": out, "simulated": self.simulated}


def engine_text(md: dict[str, Any]) -> str | None:
    """`SGLang 0.5.23` from a result's metadata; results from before issue 38 carry only vllm_version."""
    if md.get("engine_title"):
        return f"{md['engine_title']} {md.get('engine_version') or '(version unknown)'}"
    return f"vLLM {md['vllm_version']}" if md.get("vllm_version") else None


def group_results(results: list[BenchResult]) -> list[Group]:
    keys = sorted({(r.recipe, r.pp, r.tg) for r in results})
    groups = []
    for recipe, pp, tg in keys:
        rs = [r for r in results if (r.recipe, r.pp, r.tg) == (recipe, pp, tg)]
        tables = {m: build_table(m, rs) for m in METRICS}
        models = {r.metadata.get("model") for r in rs}
        ref = reference_for(recipe, pp, tg, models.pop() if len(models) == 1 else None)
        agreement = winner_agreement(tables, ref) if ref else None
        groups.append(Group(recipe, pp, tg, rs, tables, ref, agreement))
    return groups


# ---------------------------------------------------------------- charts


def chart_figure(
    table: Table, title: str, reference: Table | None = None, simulated: bool = False
) -> tuple[Figure, dict[str, Any]]:
    """The line chart of one metric (log2 concurrency axis, stdev error bars): (matplotlib figure, the plotted
    numbers). Every concurrency level that has a point, measured or reference, has its labelled tick. A chart of
    a simulated engine says SIMULATED on the picture: a line above the plot and a watermark across it."""
    import matplotlib  # about 1 s to import: only charts need it, not `bench` nor `advise`

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=100)
    data: dict[str, Any] = {
        "metric": table.metric.key,
        "unit": table.metric.unit,
        "concurrency": table.concurrency,
        "series": {},
        "reference": {},
        "simulated": simulated,
    }
    levels = set(table.concurrency)
    for v in table.variants:
        xs = [c for c in table.concurrency if (v, c) in table.cells]
        ys = [table.cells[(v, c)].mean for c in xs]
        errs = [table.cells[(v, c)].std or 0.0 for c in xs]
        ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=variant_label(v), color=COLORS.get(v))
        data["series"][v] = {str(c): y for c, y in zip(xs, ys, strict=False)}
    if reference is not None:
        levels.update(_plot_reference(ax, table, reference, data))
    ticks = sorted(levels)
    data["ticks"] = ticks
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"c{c}" for c in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlim(ticks[0] / 1.3, ticks[-1] * 1.3)
    ax.set_xlabel("Concurrency")
    ax.set_ylabel(f"{table.metric.title} ({table.metric.unit})")
    ax.set_title(title + tag(simulated), fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    if simulated:
        _mark_simulated(fig, ax)
    else:
        fig.tight_layout()
    return fig, data


def _plot_reference(ax: Axes, table: Table, reference: Table, data: dict[str, Any]) -> list[int]:
    """The reference lines (dashed, one legend entry for all) of the table's variants; their levels."""
    levels: list[int] = []
    first = True
    for v in table.variants:
        xs = [c for c in reference.concurrency if (v, c) in reference.cells]
        if not xs:
            continue
        ys = [reference.cells[(v, c)].mean for c in xs]
        ax.plot(
            xs,
            ys,
            linestyle="--",
            linewidth=1,
            alpha=0.5,
            color=COLORS.get(v),
            label="dashed: reference (seeds, hardware)" if first else None,
        )
        first = False
        levels.extend(xs)
        data["reference"][v] = {str(c): y for c, y in zip(xs, ys, strict=False)}
    return levels


def _mark_simulated(fig: Figure, ax: Axes) -> None:
    """SIMULATED on the picture: a watermark across the plot and a line above it."""
    ax.text(
        0.5,
        0.5,
        SIMULATED,
        transform=ax.transAxes,
        fontsize=64,
        color="#dc2626",
        alpha=0.12,
        rotation=20,
        ha="center",
        va="center",
        fontweight="bold",
        zorder=0,
    )
    fig.text(
        0.01,
        0.985,
        f"{SIMULATED}: {SIMULATED_NOTE}",
        color="#dc2626",
        fontsize=10,
        fontweight="bold",
        ha="left",
        va="top",
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))


def render_chart(table: Table, path: Path, title: str, reference: Table | None = None, simulated: bool = False) -> Path:
    """chart_figure as a PNG; the plotted numbers are also stored in the PNG's text chunk `sparkdeploy-bench` as
    JSON, so the chart can be checked against the tables."""
    import matplotlib.pyplot as plt  # lazy, as in chart_figure (about 1 s)

    fig, data = chart_figure(table, title, reference, simulated)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(
        path,
        format="png",
        metadata={"Title": title + (f" ({SIMULATED})" if simulated else ""), PNG_DATA_KEY: json.dumps(data)},
    )
    plt.close(fig)
    return path


def read_chart_data(path: Path) -> dict[str, Any]:
    """The numbers a chart was drawn from (its `sparkdeploy-bench` text chunk)."""
    from PIL import Image  # about 40 ms to import: only a chart's reader needs it

    with Image.open(path) as img:
        data: dict[str, Any] = json.loads(img.text[PNG_DATA_KEY])  # type: ignore[attr-defined]  # a PNG's text chunks (PngImageFile)
        return data


# ---------------------------------------------------------------- markdown


def metric_heading(metric: MetricDef, pp: int, tg: int) -> str:
    if metric.key == "decode_tps":
        return f"Decode throughput (tg{tg}, t/s total) — higher is better"
    if metric.key == "prefill_tps":
        return f"Prefill throughput (pp{pp}, t/s total) — higher is better"
    return "Time to first token (ms, end to end) — lower is better"


def markdown_table(table: Table, simulated: bool = False) -> str:
    """The table of one metric; a simulated engine's says so in its header row."""
    head = ["Concurrency" + tag(simulated)] + [variant_label(v) for v in table.variants] + ["Winner"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in table.concurrency:
        w = table.winner(c)
        cells = [fmt_cell(table.metric.key, table.cells.get((v, c))) for v in table.variants]
        lines.append("| " + " | ".join([f"c{c}"] + cells + [w.text() if w else "-"]) + " |")
    return "\n".join(lines)


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1
    mag: float = 10 ** math.floor(math.log10(value))
    for step in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if value <= step * mag:
            return step * mag
    return 10 * mag


def mermaid_chart(table: Table, title: str, simulated: bool = False) -> str:
    title += tag(simulated)
    ymax = _nice_max(1.1 * max((s.mean for s in table.cells.values()), default=1))
    ylabel = f"{table.metric.title} ({table.metric.unit})"
    palette = ", ".join(COLORS.get(v, "#a855f7") for v in table.variants)
    lines = [
        "```mermaid",
        "---",
        "config:",
        "  themeVariables:",
        "    xyChart:",
        f'      plotColorPalette: "{palette}"',
        "---",
        "xychart-beta",
        f'    title "{title}"',
        '    x-axis "Concurrency" [' + ", ".join(f"c{c}" for c in table.concurrency) + "]",
        f'    y-axis "{ylabel}" 0 --> {ymax:g}',
    ]
    for v in table.variants:
        values = [
            "0" if x is None else (f"{x:.1f}" if table.metric.key == "decode_tps" else f"{x:.0f}")
            for x in table.series(v)
        ]
        lines.append(f'    line "{variant_label(v)}" [' + ", ".join(values) + "]")
    lines.append("```")
    legend = " · ".join(f"{variant_label(v)} {COLORS.get(v, '#a855f7')}" for v in table.variants)
    return "\n".join(lines) + f"\n\nLegend (line colours): {legend}"


def render_markdown(groups: list[Group], chart_files: dict[str, dict[str, str]], skipped: list[str]) -> str:
    out = ["# Benchmark report", ""]
    for g in groups:
        s = g.summary()
        sim = g.simulated
        out += [f"## {g.recipe} — pp{g.pp} / tg{g.tg}{tag(sim)}", ""]
        if s["simulated"]:
            out += [
                (
                    "> **Simulated.** These numbers come from the vLLM simulator (vllm-sim) standing in for GPU "
                    "images in the lab, not from DGX Spark hardware: they exercise the sweep and the report end to "
                    "end and compare the simulator's calibration with the seeds. They are not hardware "
                    "measurements."
                ),
                "",
            ]
        out += _columns_markdown(s["columns"])
        for m, table in g.tables.items():
            if not table.cells:
                continue
            heading = metric_heading(table.metric, g.pp, g.tg)
            out += [
                f"### {heading}{tag(sim)}",
                "",
                markdown_table(table, sim),
                "",
                mermaid_chart(table, heading.split(" — ")[0], sim),
                "",
            ]
            png = chart_files.get(g.slug, {}).get(m)
            if png:
                out += [f"![{heading}{tag(sim)}]({png})", ""]
        if g.agreement and g.reference is not None:  # an agreement comes with its reference (group_results)
            out += _agreement_markdown(g.agreement, g.reference, sim)
    if skipped:
        out += ["## Files skipped", ""] + [f"- {s}" for s in skipped] + [""]
    return "\n".join(out)


def _columns_markdown(columns: list[dict[str, Any]]) -> list[str]:
    """The table of what each column ran (topology, image, engine, nodes, runs, dates), and how it was measured."""

    def join(values: list[Any]) -> str:
        return ", ".join(str(x) for x in values) or "-"

    out = [
        (
            "| Column | Topology | Backend / routing | Image | Image ID | Engine | Nodes | Runs | Date "
            "| Failed requests |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for col in columns:
        nodes = col.get("nodes") or []
        node_text = ", ".join(n.get("name", "?") if isinstance(n, dict) else str(n) for n in nodes) or "-"
        ids = ", ".join(i[:19] if i.startswith("sha256:") else i for i in col["image_id"]) or "-"
        out.append(
            f"| {col['label']} | {join(col['topology'])} | "
            f"{join(col['backend']) if col['backend'] else join(col['routing'])} | {join(col['image'])} | "
            f"{ids} | {join(col['engine'])} | {node_text} | {join(col['runs'])} | "
            f"{join(col['dates'])} | {col['failed_requests']} |"
        )
    lb = sorted({v for c in columns for v in c["llama_benchy_version"]})
    out += [
        "",
        (
            f"Measured with llama-benchy {', '.join(lb) or '(version not recorded)'}: decode = "
            "`tg_throughput`, prefill = `pp_throughput` (totals over the window at c > 1), TTFT = `e2e_ttft`; "
            "cells are mean ± stdev (throughput: over runs; TTFT: over requests). "
            "Winner: margin over the runner-up; "
            "`~` = the margin is within the combined standard error of the two means."
        ),
        "",
    ]
    return out


def _agreement_markdown(a: dict[str, Any], reference: Reference, sim: bool) -> list[str]:
    """The winners measured here against the reference's: per metric, decode + TTFT, then cell by cell."""
    out = [
        f"### Winners compared with the reference{tag(sim)}",
        "",
        (
            f"Reference: {reference.describe()}. Each cell compares the winner among the columns "
            "measured here with the reference's winner among the same columns."
        ),
        "",
        f"| Metric{tag(sim)} | Cells agreeing | % |",
        "|---|---|---|",
    ]
    for m, info in a["metrics"].items():
        pct = "-" if info["pct"] is None else f"{info['pct']:.0f}%"
        out.append(f"| {METRICS[m].title} | {info['agree']}/{info['cells']} | {pct} |")
    dt = a["decode_and_ttft"]
    pct = "-" if dt["pct"] is None else f"{dt['pct']:.0f}%"
    out += [f"| **Decode + TTFT** | **{dt['agree']}/{dt['cells']}** | **{pct}** |", ""]
    rows = [(m, r) for m, info in a["metrics"].items() for r in info["rows"]]
    out += [
        (f"| Metric | Concurrency | Measured winner{tag(sim)} | Reference winner | Seed 002 as published | Agree |"),
        "|---|---|---|---|---|---|",
    ]
    for m, r in rows:
        out.append(
            f"| {METRICS[m].title} | c{r['concurrency']} | {r['measured_text']} | "
            f"{r['reference_text']} | {r['reference_published'] or '-'} | "
            f"{'yes' if r['agree'] else '**no**'} |"
        )
    out.append("")
    return out


# ---------------------------------------------------------------- entry point


def report_json(groups: list[Group], chart_files: dict[str, dict[str, str]], skipped: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "simulated": any(g.simulated for g in groups),
        "note": SIMULATED_NOTE if any(g.simulated for g in groups) else None,
        "groups": [],
        "skipped": skipped,
    }
    for g in groups:
        tables = {}
        for m, t in g.tables.items():
            rows = []
            for c in t.concurrency:
                w = t.winner(c)
                rows.append(
                    {
                        "concurrency": c,
                        "cells": {
                            v: {"mean": st.mean, "std": st.std, "runs": t.runs.get((v, c))}
                            for v, st in t.row(c).items()
                        },
                        "winner": w.to_json() if w else None,
                    }
                )
            tables[m] = {
                "title": t.metric.title + tag(g.simulated),
                "simulated": g.simulated,
                "unit": t.metric.unit,
                "higher_is_better": t.metric.higher_is_better,
                "variants": t.variants,
                "rows": rows,
            }
        summary = g.summary()
        out["groups"].append(
            {
                "simulated": g.simulated,
                "label": SIMULATED if g.simulated else None,
                "recipe": g.recipe,
                "pp": g.pp,
                "tg": g.tg,
                "summary": summary,
                "tables": tables,
                "charts": chart_files.get(g.slug, {}),
                "agreement": g.agreement,
            }
        )
    return out


CSV_FIELDS = ("recipe", "pp", "tg", "metric", "unit", "concurrency", "variant", "mean", "std", "runs", "simulated")


def report_csv(groups: list[Group]) -> str:
    """Every cell of every table, one row each (for a spreadsheet); a simulated engine's rows say SIMULATED in
    their `simulated` column, so no row of it can be read as a hardware figure once the file is filtered."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for g in groups:
        for m, t in g.tables.items():
            for c in t.concurrency:
                for v, st in t.row(c).items():
                    writer.writerow(
                        [g.recipe, g.pp, g.tg, m, t.metric.unit, c, v, st.mean, st.std, t.runs.get((v, c))]
                        + [SIMULATED if g.simulated else ""]
                    )
    return buf.getvalue()


def write_report(
    results: list[BenchResult], out_dir: Path, skipped: list[str] | None = None, charts: bool = True
) -> dict[str, Any]:
    """Write report.md, report.json, report.csv and the PNG charts into out_dir; return the report as JSON."""
    skipped = list(skipped or [])
    groups = group_results(results)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    chart_files: dict[str, dict[str, str]] = {}
    if charts:
        for g in groups:
            prefix = "" if len(groups) == 1 else f"{g.slug}-"
            ref_tables = {m: build_table(m, g.reference.results) for m in METRICS} if g.reference else {}
            for m, table in g.tables.items():
                if not table.cells:
                    continue
                name = prefix + CHART_FILES[m]
                render_chart(
                    table,
                    out_dir / name,
                    f"{g.recipe}: {metric_heading(table.metric, g.pp, g.tg)}",
                    ref_tables.get(m),
                    simulated=g.simulated,
                )
                chart_files.setdefault(g.slug, {})[m] = name
    data = report_json(groups, chart_files, skipped)
    (out_dir / "report.md").write_text(render_markdown(groups, chart_files, skipped))
    write_json_atomic(out_dir / "report.json", data)
    (out_dir / "report.csv").write_text(report_csv(groups))
    data["files"] = {
        "markdown": str(out_dir / "report.md"),
        "json": str(out_dir / "report.json"),
        "csv": str(out_dir / "report.csv"),
        "charts": [str(out_dir / f) for g in chart_files.values() for f in g.values()],
    }
    return data
