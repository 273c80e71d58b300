"""`sparkdeploy bench [sweep | report]` and `sparkdeploy advise`.

bench           llama-benchy (pinned) against the deployed endpoint (or --endpoint URL --model NAME),
                one result file per concurrency level
bench sweep     each topology in turn: deploy, bench, then the report; resumes where it stopped
bench report    tables (mean ± stdev, Winner with margin), PNG charts, Markdown with mermaid charts
advise          a topology for N concurrent requests, from measured results or the shipped reference
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from sparkdeploy.cli.common import emit_json, inventory_option, json_option, recipes_dir_option
from sparkdeploy.errors import ConfigError, Problem, SparkdeployError, StepFailed

if TYPE_CHECKING:
    from rich.progress import TaskID

    from sparkdeploy.bench.benchy import BenchSettings, Endpoint
    from sparkdeploy.bench.store import BenchResult

DEFAULT_OUT = "bench-results"
F = TypeVar("F", bound=Callable[..., Any])


class SweepInterrupted(SparkdeployError):
    """Ctrl-C during a sweep: what is stored stays; exit 130 like any interrupted command."""

    exit_code = 130


LEVELS = "1,2,4,8,16,32,64"


def _settings(
    pp: int,
    tg: int,
    runs: int,
    tokenizer: str | None,
    corpus: str | None,
    skip_coherence: bool,
    timeout: float,
) -> BenchSettings:
    from sparkdeploy.bench.benchy import BenchSettings, find_corpus, find_tokenizer, installed_llama_benchy

    if pp < 1 or tg < 1 or runs < 1:
        raise ConfigError(Problem("bench", "", "--pp, --tg and --runs must be >= 1", ""))
    installed_llama_benchy()
    return BenchSettings(
        pp=pp,
        tg=tg,
        runs=runs,
        tokenizer=find_tokenizer(tokenizer),
        corpus=find_corpus(corpus),
        skip_coherence=skip_coherence,
        timeout_s=timeout,
    )


def _common_bench_options(f: F) -> F:
    options = [
        click.option("--pp", type=int, default=1024, show_default=True, help="Prompt tokens per request."),
        click.option("--tg", type=int, default=128, show_default=True, help="Generated tokens per request."),
        click.option(
            "--concurrency",
            "-c",
            default=LEVELS,
            show_default=True,
            metavar="N,N,...",
            help="Concurrency levels, one result file each.",
        ),
        click.option(
            "--runs",
            type=int,
            default=3,
            show_default=True,
            help="Runs per level (llama-benchy --runs; the seeds used 50).",
        ),
        click.option(
            "--tokenizer",
            metavar="PATH",
            help="A local tokenizer.json (or a folder holding one). "
            "Default: the simulator's, images/vllm-sim/vllm_sim/data/ (env SPARKDEPLOY_BENCH_TOKENIZER).",
        ),
        click.option(
            "--corpus",
            metavar="PATH",
            help="A local UTF-8 text file the prompts are cut from (given to "
            "llama-benchy as its --book-url, read offline). Default: the simulator's corpus "
            "(env SPARKDEPLOY_BENCH_CORPUS).",
        ),
        click.option(
            "--skip-coherence",
            is_flag=True,
            help="Skip llama-benchy's 'capital of France' check (always skipped on a simulated engine, which "
            "writes placeholder text).",
        ),
        click.option(
            "--timeout", type=float, default=1800.0, show_default=True, help="Seconds one concurrency level may take."
        ),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


@click.group("bench", invoke_without_command=True)
@_common_bench_options
@click.option(
    "--out",
    "out_dir",
    default=DEFAULT_OUT,
    show_default=True,
    metavar="DIR",
    help="Where result files go (one JSON per level).",
)
@inventory_option
@click.option(
    "--endpoint",
    metavar="URL",
    help="Bench this OpenAI base URL instead of the deployed one "
    "(with --model). The API key comes from SPARKDEPLOY_API_KEY or LITELLM_MASTER_KEY, never a flag. "
    "Whether the engine is simulated is asked of it first (GET /version, else one one-token completion).",
)
@click.option("--model", metavar="NAME", help="With --endpoint: the served model name.")
@click.option(
    "--recipe",
    metavar="NAME",
    help="With --endpoint: the recipe name recorded in the results; with --speculative: the recipe deployed "
    "(default: the inventory's default_recipe).",
)
@click.option(
    "--topology",
    type=click.Choice(["solo", "cluster", "2xsolo", "replicas"]),
    help="With --endpoint: the topology recorded in the results; with --speculative: the topology deployed.",
)
@click.option("--backend", metavar="NAME", help="With --endpoint: the cluster backend recorded (ray, ...).")
@click.option(
    "--routing",
    metavar="NAME",
    help="2xsolo: the proxy's routing strategy, if deployed with a --set other than the recipe's.",
)
@click.option(
    "--simulated",
    "mark_simulated",
    is_flag=True,
    help="With --endpoint: label the figures SIMULATED "
    "even though the engine does not say so itself (vllm-sim does: its X-Simulated-By header is read).",
)
@click.option(
    "--prompts",
    metavar="FILE",
    help="With --speculative: your own prompts, a JSONL of chat requests "
    '({"messages": [...], "max_tokens": N} a line), run at every --concurrency level.',
)
@click.option(
    "--speculative",
    metavar="LIST",
    help="Speculative decoding A/B: off,eagle3:3,ngram:4,... (METHOD[:TOKENS], vLLM's method names). Each "
    "setting is deployed in turn with `up` (the recipe with --set speculative...), your --prompts run against "
    "it; the report gives decode t/s, TTFT, draft acceptance and the ratio to off, and the setting to use per "
    "concurrency band.",
)
@click.option(
    "--write-recipe",
    "write_recipe_dir",
    metavar="DIR",
    help="With --speculative: write the recipe with the winner (at the lowest level) as its topology's "
    "override into DIR (your --recipes-dir).",
)
@recipes_dir_option
@json_option
@click.pass_context
def bench(
    ctx: click.Context,
    pp: int,
    tg: int,
    concurrency: str,
    runs: int,
    tokenizer: str | None,
    corpus: str | None,
    skip_coherence: bool,
    timeout: float,
    out_dir: str,
    inventory: str | None,
    endpoint: str | None,
    model: str | None,
    recipe: str | None,
    topology: str | None,
    backend: str | None,
    routing: str | None,
    mark_simulated: bool,
    prompts: str | None,
    speculative: str | None,
    write_recipe_dir: str | None,
    recipes_dir: str | None,
    as_json: bool,
) -> None:
    """Benchmark the deployed endpoint with llama-benchy (pinned 0.4.0): every --concurrency level in turn,
    one JSON result per level in --out, with metadata (recipe, topology, backend, image ID, the engine and its
    version, nodes, date). Works offline: a local tokenizer and a local prompt corpus.

    \b
    Subcommands:
      sparkdeploy bench sweep --recipe NAME --topologies solo,cluster,2xsolo
      sparkdeploy bench sweep --recipe NAME --topologies cluster,replicas,2xsolo -i FOUR_NODES.yaml
                       (four nodes: cluster TP=4, replicas of TP=2, one engine per node)
      sparkdeploy bench report DIR...

    \b
    Speculative decoding chosen on your own traffic (docs/speculative.md):
      sparkdeploy bench --recipe openai-gpt-oss-120b-eagle3 --prompts mine.jsonl \\
          --speculative off,eagle3:3,eagle3:5,ngram:4 --concurrency 1,4,16 [--write-recipe my-recipes/]
    """
    if ctx.invoked_subcommand:
        _refuse_options_before(ctx)
        return
    if speculative or prompts or write_recipe_dir:
        _speculative_ab(
            endpoint,
            inventory,
            recipe,
            topology,
            recipes_dir,
            prompts,
            speculative,
            concurrency,
            timeout,
            write_recipe_dir,
            as_json,
        )
        return
    from sparkdeploy.bench.deploy_link import bench_endpoint
    from sparkdeploy.bench.sweep import parse_levels
    from sparkdeploy.simulated import is_simulated

    levels = parse_levels(concurrency)
    settings = _settings(pp, tg, runs, tokenizer, corpus, skip_coherence, timeout)
    ep = bench_endpoint(inventory, endpoint, model, recipe, topology, backend, routing, mark_simulated)
    simulated = is_simulated(ep.metadata)
    out = Path(out_dir)
    results = _bench_levels(ep, settings, levels, out, simulated)
    if as_json:
        emit_json(_bench_json(ep, simulated, results))
    failed = sum(r.errors for r in results)
    if failed:
        raise StepFailed(f"{failed} request(s) failed (see the logs in {out / 'logs'})")


def _bench_json(ep: Endpoint, simulated: bool, results: list[BenchResult]) -> dict[str, Any]:
    """`bench --json`: the endpoint and each level's file, metrics, failed requests and draft acceptance."""
    return {
        "endpoint": ep.base_url,
        "model": ep.model,
        "variant": ep.variant,
        "simulated": simulated,
        "simulated_evidence": ep.metadata.get("simulated_evidence"),
        "results": [
            {
                "concurrency": r.concurrency,
                "file": str(r.path),
                "metrics": {k: v.to_json() for k, v in r.metrics.items()},
                "failed_requests": r.errors,
                "speculative": r.metadata.get("speculative"),
            }
            for r in results
        ],
    }


def _refuse_options_before(ctx: click.Context) -> None:
    """`bench`'s own options given before a subcommand (`bench --pp 2 sweep`) are refused: they go after it."""
    given = [
        p.name
        for p in ctx.command.params
        if p.name is not None
        and ctx.get_parameter_source(p.name)
        not in (click.core.ParameterSource.DEFAULT, click.core.ParameterSource.DEFAULT_MAP, None)
        and p.name != "inventory"
    ]
    if given:
        raise click.UsageError(
            f"options {', '.join('--' + g.replace('_', '-') for g in given)} go after "
            f"`{ctx.invoked_subcommand}`, not before it"
        )


def _bench_levels(
    ep: Endpoint, settings: BenchSettings, levels: list[int], out: Path, simulated: bool
) -> list[BenchResult]:
    """Every level in turn under a live bar on stderr, a line per level when it is stored."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sparkdeploy.bench.benchy import run_cell
    from sparkdeploy.bench.report import figures_line
    from sparkdeploy.recipes.speculative import SpecCounters, describe_acceptance
    from sparkdeploy.simulated import LABEL, NOTE, is_simulated

    console = Console(stderr=True)
    if simulated:
        console.print(
            f"{LABEL}: {NOTE} ({ep.metadata.get('simulated_evidence')})",
            style="bold red",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    results = []
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        for c in levels:
            task = progress.add_task(f"{ep.variant} c{c} requests", total=c * settings.runs)

            def on_progress(done: int, total: int, task: TaskID = task) -> None:
                progress.update(task, completed=done, total=total)

            r = run_cell(ep, settings, c, out, on_progress=on_progress)
            results.append(r)
            drafted = r.metadata.get("speculative")
            draft = f", draft {describe_acceptance(SpecCounters.of(drafted))}" if drafted else ""
            console.print(
                f"c{c}: {figures_line(r.metrics, is_simulated(r.metadata))}{draft} -> {r.path}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
    return results


def _speculative_ab(
    endpoint: str | None,
    inventory: str | None,
    recipe: str | None,
    topology: str | None,
    recipes_dir: str | None,
    prompts_file: str | None,
    speculative: str | None,
    concurrency: str,
    timeout: float,
    write_dir: str | None,
    as_json: bool,
) -> None:
    """`bench --speculative`: deploy each setting, run the owner's prompts, report and recommend."""
    if endpoint or not (speculative and prompts_file):
        raise ConfigError(
            Problem(
                "bench",
                "--speculative",
                "the A/B needs --speculative LIST and --prompts FILE, and deploys each setting itself (no --endpoint)",
                "e.g. sparkdeploy bench --prompts mine.jsonl --speculative off,ngram:4 --concurrency 1,8",
            )
        )
    from rich.console import Console

    from sparkdeploy.bench import speculative_ab as ab
    from sparkdeploy.bench.deploy_link import Deployer
    from sparkdeploy.bench.sweep import parse_levels
    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.recipes.recipe import recipe_path, resolve
    from sparkdeploy.simulated import LABEL, NOTE
    from sparkdeploy.topologies.context import recipe_name_for

    settings = ab.parse_settings(speculative)
    levels = parse_levels(concurrency)
    prompts = ab.load_prompts(prompts_file)
    name = recipe_name_for(load_inventory(inventory), recipe)
    resolved = resolve(name, topology, recipes_dir=recipes_dir)
    topo = resolved.topology
    base = resolved.recipe.speculative.model_dump() if resolved.recipe.speculative else None
    console = Console(stderr=True, highlight=False)

    def say(msg: str) -> None:
        console.print(msg, markup=False, soft_wrap=True)

    def deploy(s: ab.Setting) -> Endpoint:
        say(f"{s.text}: up {name} -t {topo} " + " ".join(f"--set {x}" for x in s.sets(base)))
        return Deployer(inventory, name, recipes_dir, None, s.sets(base))(topo, None)

    result = ab.run_ab(name, topo, settings, levels, prompts, deploy, float(timeout), say)
    if result.simulated:
        say(f"{LABEL}: {NOTE}")
    written = None
    bands = result.recommend()
    if write_dir and bands:
        winner = next(s for s in settings if s.text == bands[0].setting)
        spec = ab.winner_spec(name, topo, winner, recipes_dir)
        note = (
            f"{name} with speculative decoding chosen by `sparkdeploy bench --speculative {speculative}` on "
            f"{prompts_file} ({'SIMULATED engine' if result.simulated else 'measured'}): {winner.text} at "
            f"c{bands[0].text.removeprefix('c')}, x{bands[0].ratio:.2f} of off (overrides.{topo}.speculative)"
        )
        written = ab.write_recipe(recipe_path(name, recipes_dir), topo, spec, Path(write_dir), note)
    if as_json:
        emit_json({**result.to_json(), "written": str(written) if written else None})
    else:
        for s in settings:
            if s.text in result.failed:
                click.echo(f"{s.text}: not run: {result.failed[s.text]}")
                continue
            for c, level in result.rows.get(s.text, {}).items():
                click.echo(f"{s.text:>12} c{c}: {ab.describe_level(level, result.ratio(s.text, c))}")
        for b in bands:
            click.echo(
                f"use {b.setting} at {b.text} (x{b.ratio:.2f} of off)" + (f" {LABEL}" if result.simulated else "")
            )
        if written:
            click.echo(f"wrote {written} (its overrides.{topo}.speculative is the winner at {bands[0].text})")
    if any(level.failed for row in result.rows.values() for level in row.values()) or result.failed:
        raise StepFailed("a setting or requests failed: see the lines above")


@bench.command("sweep")
@click.option("--recipe", "-r", metavar="NAME", help="Recipe (default: the inventory's default_recipe).")
@click.option(
    "--topologies",
    default="solo,cluster,2xsolo",
    show_default=True,
    metavar="T,T,...",
    help="In this order; 2xsolo uses the recipe's routing, 2xsolo:least-busy another one; replicas: "
    "TP=2 engines behind the proxy (four nodes: cluster,replicas,2xsolo).",
)
@_common_bench_options
@click.option("--out", "out_dir", metavar="DIR", help=f"Results and report (default {DEFAULT_OUT}/<recipe>).")
@inventory_option
@recipes_dir_option
@click.option(
    "--deploy-timeout", type=float, default=None, help="Seconds deploy's health gate waits (its default otherwise)."
)
@click.option("--down-after", is_flag=True, help="Remove the deployment when the sweep ends.")
@click.option("--plain", is_flag=True, help="One line per event instead of the live display.")
@json_option
def sweep_cmd(
    recipe: str | None,
    topologies: str,
    pp: int,
    tg: int,
    concurrency: str,
    runs: int,
    tokenizer: str | None,
    corpus: str | None,
    skip_coherence: bool,
    timeout: float,
    out_dir: str | None,
    inventory: str | None,
    recipes_dir: str | None,
    deploy_timeout: float | None,
    down_after: bool,
    plain: bool,
    as_json: bool,
) -> None:
    """Bring each topology of a recipe up in turn (via deploy), bench it at every level, write the report.
    Levels already stored in --out are skipped: run the same command again to resume an interrupted sweep."""
    from sparkdeploy.bench.sweep import PlainReporter, RichReporter, SweepReporter, sweep_recipe, sweep_request

    recipe, specs, levels, routing = sweep_request(inventory, recipe, topologies, concurrency, recipes_dir)
    settings = _settings(pp, tg, runs, tokenizer, corpus, skip_coherence, timeout)
    out = Path(out_dir or Path(DEFAULT_OUT) / recipe)
    use_rich = not plain and not as_json and sys.stderr.isatty()
    reporter: SweepReporter = RichReporter() if use_rich else PlainReporter(lambda s: click.echo(s, err=True))
    summary = sweep_recipe(
        inventory, recipe, specs, levels, routing, settings, out, recipes_dir, deploy_timeout, down_after, reporter
    )
    if as_json:
        data = summary.to_json()
        if summary.report:
            data["agreement"] = [g.get("agreement") for g in summary.report.get("groups", [])]
        emit_json(data)
    elif summary.report:
        for g in summary.report.get("groups", []):
            a = (g.get("agreement") or {}).get("decode_and_ttft")
            if a and a.get("cells"):
                click.echo(
                    f"winners agree with the reference in {a['agree']}/{a['cells']} decode+TTFT cells "
                    f"({a['pct']:.0f}%)",
                    err=True,
                )
        click.echo(f"report: {summary.report['files']['markdown']}", err=True)
    if summary.status == "interrupted":
        raise SweepInterrupted("interrupted: the levels stored so far are kept; the same command resumes")
    if summary.status == "failed":
        raise StepFailed(summary.message())


@bench.command("report")
@click.argument("dirs", nargs=-1, required=True, metavar="DIR...")
@click.option(
    "--out",
    "out_dir",
    metavar="DIR",
    help="Where report.md, report.json, report.csv and the charts go (default: DIR when there is one; required "
    "with several).",
)
@click.option("--no-charts", is_flag=True, help="Tables and Markdown only.")
@json_option
def report_cmd(dirs: tuple[str, ...], out_dir: str | None, no_charts: bool, as_json: bool) -> None:
    """Tables of decode t/s, prefill t/s and TTFT by concurrency x topology (mean ± stdev, Winner with margin),
    PNG line charts and a Markdown report with mermaid charts, from the result files under DIR..."""
    from sparkdeploy.bench.report import write_report
    from sparkdeploy.bench.store import load_results

    if len(dirs) > 1 and not out_dir:  # writing into one of them would mix a joint report into one's results
        raise ConfigError(
            Problem(
                " ".join(dirs),
                "--out",
                "several result folders: where does the joint report go?",
                "name a folder with --out DIR",
            )
        )
    results, skipped = load_results(dirs)
    if not results:
        raise ConfigError(
            Problem(
                ", ".join(dirs),
                "",
                "no benchmark results there",
                "run `sparkdeploy bench` or `sparkdeploy bench sweep` first",
            )
        )
    out = Path(out_dir or dirs[0])
    data = write_report(results, out, skipped, charts=not no_charts)
    if as_json:
        emit_json(data)
        return
    from sparkdeploy.bench.report import group_results, markdown_table
    from sparkdeploy.simulated import LABEL, NOTE, tag

    for g in group_results(results):
        click.echo(f"{g.recipe} pp{g.pp}/tg{g.tg}" + (f" — {LABEL}: {NOTE}" if g.simulated else ""))
        for _m, t in g.tables.items():
            if t.cells:
                click.echo(f"\n{t.metric.title} ({t.metric.unit}){tag(g.simulated)}\n{markdown_table(t, g.simulated)}")
        if g.agreement:
            a = g.agreement["decode_and_ttft"]
            click.echo(
                f"\nwinners agree with the reference in {a['agree']}/{a['cells']} decode+TTFT cells"
                + (f" ({a['pct']:.0f}%)" if a["pct"] is not None else "")
            )
    for s in skipped:
        click.echo(f"skipped: {s}", err=True)
    click.echo(
        f"\nreport: {data['files']['markdown']}"
        + (f"; charts: {', '.join(data['files']['charts'])}" if data["files"]["charts"] else "")
    )


@click.command("advise")
@click.option("--concurrency", "-c", type=click.IntRange(min=1), required=True, help="Concurrent requests.")
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option("--gen-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option(
    "--recipe",
    "-r",
    metavar="NAME",
    help="Advise for this recipe, from its own figures: its measured results, else the seeds' (gpt-oss-120b), else "
    "the calibrated simulator's prediction for its model (SIMULATED); none: it says how to measure them.",
)
@click.option(
    "--objective",
    type=click.Choice(["latency", "decode", "ttft", "prefill"]),
    default="latency",
    show_default=True,
    help="latency: shortest request (TTFT + generation at N concurrent); decode: most "
    "t/s generated; ttft: first token soonest; prefill: most prompt t/s.",
)
@click.option(
    "--results",
    "results_dirs",
    multiple=True,
    metavar="DIR",
    help=f"Measured results to use (repeatable; default ./{DEFAULT_OUT} when it exists). Without any: "
    "the shipped reference tables.",
)
@click.option(
    "--inventory",
    "-i",
    "inventory",
    metavar="PATH|lab",
    default=None,
    help="Also leave out topologies this inventory cannot run (too few nodes), and name it in the command.",
)
@recipes_dir_option
@json_option
def advise(
    concurrency: int,
    prompt_tokens: int,
    gen_tokens: int,
    recipe: str | None,
    objective: str,
    results_dirs: tuple[str, ...],
    inventory: str | None,
    recipes_dir: str | None,
    as_json: bool,
) -> None:
    """Recommend a topology (solo, cluster, 2xsolo, replicas) for N concurrent requests and say why."""
    from sparkdeploy.bench.advisor import advise as advise_fn
    from sparkdeploy.bench.advisor import render_text

    dirs = list(results_dirs) or ([DEFAULT_OUT] if Path(DEFAULT_OUT).is_dir() else [])
    a = advise_fn(concurrency, prompt_tokens, gen_tokens, recipe, objective, dirs, recipes_dir, inventory)
    if as_json:
        emit_json(a.to_json())
    else:
        click.echo(render_text(a))


__all__ = ["advise", "bench"]
