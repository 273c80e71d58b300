"""A topology sweep: for each topology in turn, deploy it, bench every concurrency level not stored yet, then
write the report. Stored cells are skipped, so a sweep that was interrupted (Ctrl-C, a lost node, a failed
deploy) resumes where it stopped when the same command runs again; the interruption itself is reported with
what is stored and what is left.

The deploy and bench steps are functions passed in (the real ones: deploy_link.Deployer and runner.run_cell),
so the resume logic is tested without a cluster.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from sparkdeploy.bench.benchy import BenchSettings, Endpoint
from sparkdeploy.bench.report import figures_line
from sparkdeploy.bench.seeds import seed_reference
from sparkdeploy.bench.store import BenchResult, routing_of, stored, variant_label, variant_of
from sparkdeploy.errors import ConfigError, Problem, SparkdeployError
from sparkdeploy.recipes.recipe import TOPOLOGIES
from sparkdeploy.simulated import LABEL, NOTE, is_simulated

ROUTINGS = (
    "simple-shuffle",
    "least-busy",
    "usage-based-routing",
    "usage-based-routing-v2",
    "latency-based-routing",
    "cost-based-routing",
)
DEPLOY_ESTIMATE_S = 90.0  # before the first deploy was timed


@dataclass(frozen=True)
class TopologySpec:
    topology: str
    routing: str | None = None  # 2xsolo only; None: the recipe's

    def variant(self, recipe_routing: str | None = None) -> str:
        return variant_of(self.topology, self.routing or recipe_routing)

    @property
    def text(self) -> str:
        return self.topology + (f":{self.routing}" if self.routing else "")


def parse_topologies(text: str) -> list[TopologySpec]:
    """`solo,cluster,2xsolo` (2xsolo with the recipe's routing), or `2xsolo:least-busy` for another routing."""
    specs, problems = [], []
    for item in [x.strip() for x in text.split(",") if x.strip()]:
        topo, _, routing = item.partition(":")
        if topo not in TOPOLOGIES:
            problems.append(Problem("--topologies", item, "unknown topology", f"use {', '.join(TOPOLOGIES)}"))
        elif routing and topo != "2xsolo":
            problems.append(Problem("--topologies", item, "only 2xsolo has a routing strategy", f"use {topo}"))
        elif routing and routing not in ROUTINGS:
            problems.append(
                Problem("--topologies", item, "unknown LiteLLM routing strategy", f"use one of {', '.join(ROUTINGS)}")
            )
        else:
            spec = TopologySpec(topo, routing or None)
            if spec not in specs:
                specs.append(spec)
    if problems:
        raise ConfigError(problems)
    if not specs:
        raise ConfigError(Problem("--topologies", text, "no topology given", "e.g. solo,cluster,2xsolo"))
    return specs


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ConfigError(Problem("--concurrency", text, "expected comma-separated integers", "e.g. 1,2,4,8")) from None
    if not levels or any(c < 1 for c in levels):
        raise ConfigError(Problem("--concurrency", text, "levels must be >= 1", "e.g. 1,2,4,8,16,32,64"))
    return sorted(set(levels))


# ---------------------------------------------------------------- time estimates (for the ETA)


def estimate_cell_s(variant: str, concurrency: int, settings: BenchSettings) -> float:
    """Seconds one level takes by the reference tables: (runs + warmup) x (TTFT + tg x c / decode t/s), plus
    start-up (tokenizing the corpus, warmup, coherence, latency probes)."""
    ref = seed_reference()
    cells = {(r.variant, r.concurrency): r for r in ref.results}
    v = variant if any(k[0] == variant for k in cells) else "solo"
    levels = sorted(c for (vv, c) in cells if vv == v)
    nearest = min(levels, key=lambda c: abs(math.log2(c) - math.log2(concurrency)))
    r = cells[(v, nearest)]
    scale = concurrency / nearest
    ttft_s = r.metrics["ttft_ms"].mean / 1000.0 * (settings.pp / ref.pp) * scale
    decode = max(r.metrics["decode_tps"].mean, 1.0)
    per_run = ttft_s + settings.tg * concurrency / decode
    return (settings.runs + 1) * per_run + 8.0


# ---------------------------------------------------------------- progress display


class SweepReporter(Protocol):
    def start(self, plan: SweepPlan) -> None: ...
    def topology(self, spec: TopologySpec, variant: str, todo: list[int], skipped: list[int]) -> None: ...
    def deploying(self, spec: TopologySpec) -> None: ...
    def deployed(self, spec: TopologySpec, endpoint: Endpoint, seconds: float) -> None: ...
    def cell_start(self, variant: str, concurrency: int) -> None: ...
    def cell_progress(self, variant: str, concurrency: int, done: int, total: int) -> None: ...
    def cell_done(self, variant: str, concurrency: int, result: BenchResult, seconds: float) -> None: ...
    def failed(self, variant: str, concurrency: int | None, message: str) -> None: ...
    def finish(self, summary: SweepSummary) -> None: ...


@dataclass
class SweepPlan:
    recipe: str
    specs: list[TopologySpec]
    levels: list[int]
    settings: BenchSettings
    out_dir: Path
    variants: dict[TopologySpec, str] = field(default_factory=dict)
    todo: dict[TopologySpec, list[int]] = field(default_factory=dict)
    done: dict[TopologySpec, list[int]] = field(default_factory=dict)

    @property
    def total_cells(self) -> int:
        return len(self.specs) * len(self.levels)

    @property
    def stored_cells(self) -> int:
        return sum(len(v) for v in self.done.values())

    def estimate_s(self, spec: TopologySpec, levels: list[int]) -> float:
        return sum(estimate_cell_s(self.variants[spec], c, self.settings) for c in levels)


@dataclass
class SweepSummary:
    recipe: str
    out_dir: Path
    status: str = "running"  # complete | interrupted | failed
    measured: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    interrupted_at: dict[str, Any] | None = None
    remaining: list[dict[str, Any]] = field(default_factory=list)
    report: dict[str, Any] | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "out_dir": str(self.out_dir),
            "status": self.status,
            "measured": self.measured,
            "skipped_stored": self.skipped,
            "failures": self.failures,
            "interrupted_at": self.interrupted_at,
            "remaining": self.remaining,
            "seconds": round(self.seconds, 1),
            "report": (self.report or {}).get("files"),
        }

    def message(self) -> str:
        n_left = len(self.remaining)
        if self.status == "complete":
            return (
                f"sweep complete: {len(self.measured)} level(s) measured, {len(self.skipped)} already stored, "
                f"in {self.out_dir}"
            )
        where = ""
        if self.interrupted_at:
            where = (
                f" during {self.interrupted_at['variant']} c{self.interrupted_at['concurrency']}"
                if self.interrupted_at.get("concurrency")
                else f" during {self.interrupted_at['variant']} deploy"
            )
        head = (
            "sweep interrupted" + where
            if self.status == "interrupted"
            else f"sweep finished with {len(self.failures)} failure(s)"
        )
        return (
            f"{head}: {len(self.measured)} level(s) measured now, {len(self.skipped)} stored before, "
            f"{n_left} left; stored results are in {self.out_dir}. Run the same command again to resume "
            "(stored levels are skipped)."
        )


def _error_text(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return text if isinstance(exc, SparkdeployError) else f"{exc.__class__.__name__}: {text}"


DeployFn = Callable[[str, "str | None"], Endpoint]
BenchFn = Callable[[Endpoint, int, Callable[[int, int], None]], BenchResult]


def make_plan(
    recipe: str,
    specs: list[TopologySpec],
    levels: list[int],
    settings: BenchSettings,
    out_dir: Path,
    recipe_routing: str | None = None,
    expected: Callable[[TopologySpec], dict[str, Any]] | None = None,
) -> SweepPlan:
    """What is stored and what is left. `expected(spec)`: metadata a stored result must match to count (the
    image the deploy would run now: a result of another image is measured again, never mixed in)."""
    plan = SweepPlan(recipe, specs, levels, settings, Path(out_dir))
    variants = [s.variant(recipe_routing) for s in specs]
    if len(set(variants)) != len(variants):
        raise ConfigError(
            Problem(
                "--topologies",
                ",".join(s.text for s in specs),
                "two entries measure the same column",
                "list each topology once",
            )
        )
    for spec, variant in zip(specs, variants, strict=False):
        plan.variants[spec] = variant
        same = expected(spec) if expected else None
        have = [c for c in levels if stored(out_dir, recipe, variant, settings.pp, settings.tg, c, settings.runs, same)]
        plan.done[spec] = have
        plan.todo[spec] = [c for c in levels if c not in have]
    return plan


def run_sweep(
    plan: SweepPlan,
    deploy: DeployFn,
    bench: BenchFn,
    reporter: SweepReporter,
    write_report: Callable[[], dict[str, Any]] | None = None,
) -> SweepSummary:
    """Deploy and bench every topology whose levels are not all stored; return what happened. Ctrl-C stops
    cleanly (llama-benchy is stopped by run_cell) and is reported; nothing half-written is left behind."""
    summary = SweepSummary(plan.recipe, plan.out_dir)
    t0 = time.monotonic()
    reporter.start(plan)
    current: dict[str, Any] = {}
    try:
        for spec in plan.specs:
            variant = plan.variants[spec]
            todo, have = plan.todo[spec], plan.done[spec]
            summary.skipped += [{"variant": variant, "concurrency": c} for c in have]
            reporter.topology(spec, variant, todo, have)
            if not todo:
                continue
            current = {"variant": variant, "concurrency": None}
            reporter.deploying(spec)
            td = time.monotonic()
            try:
                endpoint = deploy(spec.topology, spec.routing)
            except Exception as exc:  # noqa: BLE001 - any failure of one topology's deploy: recorded, the next one goes on
                summary.failures.append(
                    {"variant": variant, "concurrency": None, "step": "deploy", "error": _error_text(exc)}
                )
                reporter.failed(variant, None, f"deploy failed: {_error_text(exc)}")
                continue
            # the stored key is the planned column (deploy rendered the same recipe with the same routing)
            endpoint.metadata["topology"] = spec.topology
            endpoint.metadata["routing"] = routing_of(variant)
            reporter.deployed(spec, endpoint, time.monotonic() - td)
            for c in todo:
                current = {"variant": variant, "concurrency": c}
                reporter.cell_start(variant, c)
                tc = time.monotonic()
                try:
                    result = bench(endpoint, c, functools.partial(reporter.cell_progress, variant, c))
                except Exception as exc:  # noqa: BLE001 - any failure of one cell: recorded, the next cell goes on
                    summary.failures.append(
                        {"variant": variant, "concurrency": c, "step": "bench", "error": _error_text(exc)}
                    )
                    reporter.failed(variant, c, _error_text(exc))
                    break  # the engine may be gone: the next topology's deploy starts afresh
                summary.measured.append({"variant": variant, "concurrency": c, "file": str(result.path)})
                reporter.cell_done(variant, c, result, time.monotonic() - tc)
                if result.errors:  # stored, shown in the report, and measured again by the next run
                    first = (result.metadata.get("request_errors") or ["?"])[0]
                    text = (
                        f"{result.errors} of {result.metadata.get('requests', '?')} requests failed "
                        f"(first: {first}); the level is measured again on the next run"
                    )
                    summary.failures.append({"variant": variant, "concurrency": c, "step": "requests", "error": text})
                    reporter.failed(variant, c, text)
            current = {}
        summary.status = "failed" if summary.failures else "complete"
    except KeyboardInterrupt:
        summary.status = "interrupted"
        summary.interrupted_at = current or None
    finally:
        redo = {(f["variant"], f["concurrency"]) for f in summary.failures if f["step"] == "requests"}
        done = {(m["variant"], m["concurrency"]) for m in summary.measured + summary.skipped} - redo
        summary.remaining = [
            {"variant": plan.variants[s], "concurrency": c}
            for s in plan.specs
            for c in plan.levels
            if (plan.variants[s], c) not in done
        ]
        if write_report is not None and (summary.measured or summary.skipped):
            try:
                summary.report = write_report()
            except Exception as exc:  # noqa: BLE001 - a report problem must not hide the sweep's own outcome
                summary.failures.append({"variant": None, "concurrency": None, "step": "report", "error": str(exc)})
        summary.seconds = time.monotonic() - t0
        reporter.finish(summary)
    return summary


# ---------------------------------------------------------------- reporters


def sweep_request(
    inventory: str | None, recipe: str | None, topologies: str, concurrency: str, recipes_dir: str | None
) -> tuple[str, list[TopologySpec], list[int], str]:
    """`bench sweep`'s arguments checked: (the recipe's name, its topologies to sweep, the levels, its
    routing strategy); a topology the recipe does not support is refused."""
    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.recipes.recipe import load_recipe
    from sparkdeploy.topologies.context import recipe_name_for

    specs = parse_topologies(topologies)
    levels = parse_levels(concurrency)
    name = recipe_name_for(load_inventory(inventory), recipe)
    r, _, _ = load_recipe(name, recipes_dir)
    missing = [s.topology for s in specs if s.topology not in r.topologies]
    if missing:
        raise ConfigError(
            Problem(
                f"recipe {name}",
                "topologies",
                f"does not support {', '.join(missing)}",
                f"use {', '.join(r.topologies)}",
            )
        )
    return name, specs, levels, r.litellm.routing_strategy


def sweep_recipe(
    inventory: str | None,
    recipe: str,
    specs: list[TopologySpec],
    levels: list[int],
    routing: str,
    settings: BenchSettings,
    out: Path,
    recipes_dir: str | None,
    deploy_timeout: float | None,
    down_after: bool,
    reporter: SweepReporter,
) -> SweepSummary:
    """The sweep of one recipe: each topology deployed in turn (levels already stored in `out` skipped),
    benched, then the report written; the deployment removed after with `down_after` unless interrupted."""
    from sparkdeploy.bench import report as report_mod
    from sparkdeploy.bench.benchy import run_cell
    from sparkdeploy.bench.deploy_link import Deployer, endpoint_of, expected_image
    from sparkdeploy.bench.store import load_results

    deployer = Deployer(inventory, recipe, recipes_dir, deploy_timeout)

    def expected(spec: TopologySpec) -> dict[str, str]:  # rendered locally: the image this deploy would run
        return expected_image(
            endpoint_of(inventory, recipe, spec.topology, None, deployer.sets_for(spec.routing), recipes_dir)
        )

    plan = make_plan(recipe, specs, levels, settings, out, routing, expected)

    def bench_fn(endpoint: Endpoint, c: int, progress: Callable[[int, int], None]) -> BenchResult:
        return run_cell(endpoint, settings, c, out, on_progress=progress)

    def write_report() -> dict[str, Any]:
        results, skipped = load_results([out])
        return report_mod.write_report([x for x in results if x.recipe == recipe], out, skipped)

    summary = run_sweep(plan, deployer, bench_fn, reporter, write_report)
    if down_after and summary.status != "interrupted":
        deployer.down()
    return summary


def cell_line(variant: str, c: int, result: BenchResult, seconds: float) -> str:
    figures = figures_line(result.metrics, is_simulated(result.metadata))
    return f"[{variant_label(variant)}] c{c}: {figures} ({seconds:.0f}s)"


def deployed_note(endpoint: Endpoint) -> str:
    return f" — {LABEL} engine: {NOTE}" if is_simulated(endpoint.metadata) else ""


class PlainReporter:
    """One line per event (logs, CI, --json runs: to stderr)."""

    def __init__(self, echo: Callable[[str], None]):
        self.echo = echo

    def start(self, plan: SweepPlan) -> None:
        todo = sum(len(v) for v in plan.todo.values())
        self.echo(
            f"sweep {plan.recipe}: {len(plan.specs)} topologies x {len(plan.levels)} levels, "
            f"{plan.stored_cells} stored, {todo} to measure (pp{plan.settings.pp}/tg{plan.settings.tg}, "
            f"{plan.settings.runs} runs) -> {plan.out_dir}"
        )

    def topology(self, spec: TopologySpec, variant: str, todo: list[int], skipped: list[int]) -> None:
        if skipped:
            self.echo(f"[{variant_label(variant)}] stored already: " + ", ".join(f"c{c}" for c in skipped))

    def deploying(self, spec: TopologySpec) -> None:
        self.echo(f"deploying {spec.text} ...")

    def deployed(self, spec: TopologySpec, endpoint: Endpoint, seconds: float) -> None:
        self.echo(
            f"deployed {spec.text} in {seconds:.0f}s: {endpoint.base_url} ({endpoint.model})" + deployed_note(endpoint)
        )

    def cell_start(self, variant: str, c: int) -> None:
        pass

    def cell_progress(self, variant: str, c: int, done: int, total: int) -> None:
        pass

    def cell_done(self, variant: str, c: int, result: BenchResult, seconds: float) -> None:
        self.echo(cell_line(variant, c, result, seconds))

    def failed(self, variant: str, c: int | None, message: str) -> None:
        self.echo(f"[{variant_label(variant)}]{f' c{c}' if c else ''}: FAILED: {message}")

    def finish(self, summary: SweepSummary) -> None:
        self.echo(summary.message())


class RichReporter:
    """A live display: topology, concurrency level, requests done, elapsed and ETA. The ETA is the reference
    tables' estimate of what is left, corrected by how long the measured levels took against their estimate."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.progress: Progress | None = None
        self.plan: SweepPlan | None = None
        self.est_left = 0.0
        self.est_done = 0.0
        self.real_done = 0.0
        self.deploys: list[float] = []
        self.cell_est = 0.0
        self.cell_t0 = 0.0
        self.deploys_left = 0
        self.task: TaskID | None = None

    def _factor(self) -> float:
        return self.real_done / self.est_done if self.est_done > 0 else 1.0

    def _eta(self, current_fraction: float = 0.0) -> str:
        left = (self.est_left - self.cell_est * current_fraction) * self._factor()
        deploy = sum(self.deploys) / len(self.deploys) if self.deploys else DEPLOY_ESTIMATE_S
        left += deploy * self.deploys_left
        m, s = divmod(int(max(left, 0)), 60)
        h, m = divmod(m, 60)
        return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"

    def start(self, plan: SweepPlan) -> None:
        self.plan = plan
        self.est_left = sum(plan.estimate_s(s, plan.todo[s]) for s in plan.specs)
        self.deploys_left = sum(1 for s in plan.specs if plan.todo[s])
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}"),
            console=self.console,
            transient=False,
        )
        self.progress.start()
        self.task = self.progress.add_task(
            f"sweep {plan.recipe}", total=plan.total_cells, completed=plan.stored_cells, detail="", eta=self._eta()
        )

    def _update(self, detail: str, fraction: float = 0.0, advance: int = 0) -> None:
        assert self.progress is not None and self.task is not None, "start() makes the bar before any update"
        self.progress.update(self.task, detail=detail, eta=self._eta(fraction), advance=advance)

    def topology(self, spec: TopologySpec, variant: str, todo: list[int], skipped: list[int]) -> None:
        if skipped:
            self.console.print(
                f"[{variant_label(variant)}] stored already: " + ", ".join(f"c{c}" for c in skipped), markup=False
            )

    def deploying(self, spec: TopologySpec) -> None:
        self.dt0 = time.monotonic()
        self._update(f"{spec.text}: deploying")

    def deployed(self, spec: TopologySpec, endpoint: Endpoint, seconds: float) -> None:
        self.deploys.append(seconds)
        self.deploys_left = max(0, self.deploys_left - 1)
        self.console.print(
            f"deployed {spec.text} in {seconds:.0f}s: {endpoint.base_url}{deployed_note(endpoint)}", markup=False
        )
        self._update(f"{spec.text}: deployed")

    def cell_start(self, variant: str, c: int) -> None:
        assert self.plan is not None, "start() sets the plan before any cell runs"
        self.cell_est = estimate_cell_s(variant, c, self.plan.settings)
        self.cell_t0 = time.monotonic()
        self._update(f"{variant_label(variant)} c{c}")

    def cell_progress(self, variant: str, c: int, done: int, total: int) -> None:
        frac = done / total if total else 0.0
        self._update(f"{variant_label(variant)} c{c}: requests {done}/{total}", fraction=frac)

    def cell_done(self, variant: str, c: int, result: BenchResult, seconds: float) -> None:
        self.est_left -= self.cell_est
        self.est_done += self.cell_est
        self.real_done += seconds
        self.cell_est = 0.0
        self.console.print(cell_line(variant, c, result, seconds), markup=False)
        self._update(f"{variant_label(variant)} c{c} done", advance=1)

    def failed(self, variant: str, c: int | None, message: str) -> None:
        self.console.print(
            f"[{variant_label(variant)}]{f' c{c}' if c else ''}: FAILED: {message}", style="red", markup=False
        )

    def finish(self, summary: SweepSummary) -> None:
        if self.progress is not None:
            self.progress.stop()
        self.console.print(summary.message(), markup=False)
