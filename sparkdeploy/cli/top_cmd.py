"""`sparkdeploy top`: a live table of each engine's load, from vLLM's and LiteLLM's own /metrics."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

import click

from sparkdeploy.cli.common import emit_json, inventory_option, json_option
from sparkdeploy.guard import state as guard_state

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from sparkdeploy.daytwo.top import Monitor


def _num(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, fmt)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def render_table(snapshot: dict[str, Any], title: str) -> Table:
    from rich.table import Table
    from rich.text import Text

    from sparkdeploy.simulated import LABEL, NOTE, is_simulated

    shown: str | Text = title
    if snapshot.get("simulated"):
        shown = Text.assemble((f"{LABEL}: {NOTE}", "bold red"), "\n", title)
    table = Table(title=shown, title_justify="left", caption=_caption(snapshot), caption_justify="left")
    columns = ["node", "engine", "running", "waiting", "KV cache", "prompt tok/s", "gen tok/s", "TTFT p50", "TTFT p95"]
    share = bool(snapshot.get("request_share"))
    if share:
        columns.append("proxy share")
    drafting = any(e.get("spec_decode") for e in snapshot["engines"])
    if drafting:  # speculative decoding: the engine's own acceptance counters (recipes/speculative.py)
        columns += ["draft accepted", "tokens/step"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("node", "engine") else "right")
    for e in snapshot["engines"]:
        if e.get("error") and e.get("running") is None:
            table.add_row(
                e["node"], e["container"], Text(f"unreachable: {e['error']}", style="red"), *["" for _ in columns[3:]]
            )
            continue
        engine = Text(e["container"])
        if is_simulated(e):  # a line of its own: a narrow terminal cuts the name, never the label
            engine.append(f"\n{LABEL}", style="bold red")
        row = [
            e["node"],
            engine,
            _num(e.get("running"), ".0f"),
            _num(e.get("waiting"), ".0f"),
            _num(e.get("kv_cache_usage"), ".1f", 100) + ("%" if e.get("kv_cache_usage") is not None else ""),
            _num(e.get("prompt_tokens_per_s"), ".1f"),
            _num(e.get("generation_tokens_per_s"), ".1f"),
            _seconds(e.get("ttft_p50_s")),
            _seconds(e.get("ttft_p95_s")),
        ]
        if share:
            row.append(f"{e.get('request_share', 0.0) * 100:.0f}%")
        if drafting:
            spec = e.get("spec_decode") or {}
            rate = spec.get("acceptance_rate")
            row += [
                _num(rate, ".0f", 100) + ("%" if rate is not None else ""),
                _num(spec.get("accepted_tokens_per_step"), ".2f"),
            ]
        table.add_row(*row, style="yellow" if e.get("error") else "")
    if not snapshot["engines"]:
        table.add_row("-", "(no running engine)", *["" for _ in columns[2:]])
    return table


def _caption(snapshot: dict[str, Any]) -> str:
    bases = {e.get("ttft_basis") for e in snapshot["engines"]} - {None}
    over = "since the engine started" if bases == {"since the engine started"} else f"over {snapshot['window_s']:g} s"
    parts = [f"tokens/s over the last interval; TTFT {over}"]
    specs = [e["spec_decode"] for e in snapshot["engines"] if e.get("spec_decode")]
    if any(not s.get("gauges") for s in specs):
        parts.append(f"draft acceptance {over}")
    if any(s.get("gauges") for s in specs):  # SGLang reports its latest verify step, not counters
        parts.append("SGLang's draft acceptance: its latest verify step")
    basis = snapshot.get("request_share_basis")
    if basis:
        parts.append(f"proxy share over {snapshot['window_s']:g} s" if basis == "window" else f"proxy share {basis}")
    for p in snapshot.get("proxies", []):
        if p.get("error"):
            parts.append(f"proxy {p['url']}: {p['error']}")
    return "; ".join(parts)


def _plain_console() -> Console:
    from rich.console import Console

    return Console(highlight=False, width=120, force_terminal=False, no_color=True)


def _console() -> Console:
    from rich.console import Console

    return Console(highlight=False, width=max(120, Console().width))  # never squeeze the columns


def _print_guards(guards: dict[str, dict[str, Any] | None], when: str = "") -> None:
    from rich.text import Text

    for text, style in guard_state.lines(guards):
        _console().print(Text(text + when, style=style or ""))


@click.command("top")
@inventory_option
@click.option(
    "--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True, help="Seconds between refreshes."
)
@click.option(
    "--window",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds of history for the TTFT quantiles and the proxy's request shares.",
)
@click.option(
    "--once",
    is_flag=True,
    help="Print one sample and exit: rates over --sample-gap, TTFT and shares since each engine started.",
)
@click.option(
    "--sample-gap",
    type=click.FloatRange(min=0.1),
    default=0.5,
    show_default=True,
    help="With --once: seconds between the two scrapes the token rates come from.",
)
@click.option("--deployment", metavar="NAME", help="Only this deployment of a stack (`up --stack`), e.g. coder.")
@json_option
def top(
    inventory: str | None,
    interval: float,
    window: float,
    once: bool,
    sample_gap: float,
    deployment: str | None,
    as_json: bool,
) -> None:
    """Live load of every engine: requests running and waiting, KV-cache usage, prompt and generation
    tokens/s, time to first token (p50/p95), and for 2xsolo each backend's share of the proxy's requests.

    \b
    Read from the engines' own Prometheus /metrics (vLLM's metric names) and LiteLLM's, scraped from this
    machine at the endpoints `status` reports; the nodes are asked over SSH only once, for those endpoints.
    Examples:
      sparkdeploy top --inventory lab                 # refreshes every 2 s until Ctrl-C
      sparkdeploy top --once --json                   # one sample for scripts
      sparkdeploy top --deployment coder              # one deployment of a stack (up --stack)
    Exit codes: 0 ok, 1 nothing of sparkdeploy's runs or a node is unreachable, 2 bad usage, 130 Ctrl-C,
    143 SIGTERM (the live view stops within a second, wherever it waits).
    """
    from sparkdeploy.config.inventory import load_inventory
    from sparkdeploy.config.secrets import load_secrets
    from sparkdeploy.daytwo import top as monitor_mod
    from sparkdeploy.deploy.stack import members as stack_members
    from sparkdeploy.errors import NothingDeployed
    from sparkdeploy.runtime.remote import NodeConnection

    inv = load_inventory(inventory)
    secrets = load_secrets(inv.local_path(inv.cluster.secrets_file))
    conns = {n.name: NodeConnection(n, inv) for n in inv.nodes}
    try:
        targets, errors = monitor_mod.read_targets(inv, conns, deployment)
        guards = guard_state.read_nodes(inv, conns)  # the memory guard's state when top starts (sparkdeploy/guard)
    finally:
        for conn in conns.values():
            conn.close()
    unreachable = list(errors)
    monitor = monitor_mod.Monitor(targets, secrets.get("LITELLM_MASTER_KEY"), window, since_start=once)
    title = f"sparkdeploy top ({inv.source})"
    for name, error in errors.items():
        click.secho(f"{name}: unreachable over SSH: {secrets.mask(str(error))}", fg="red", err=True)
    if not targets:
        fix = stack_members.cold_fix(inv, deployment) if deployment else None
        raise NothingDeployed(inv.source, fix) if fix else NothingDeployed(inv.source)

    if once:
        _top_once(monitor, unreachable, guards, sample_gap, as_json, title)
    else:
        _top_watch(monitor, guards, interval, as_json, title)


def _top_once(
    monitor: Monitor,
    unreachable: list[str],
    guards: dict[str, dict[str, Any] | None],
    sample_gap: float,
    as_json: bool,
    title: str,
) -> None:
    """`top --once`: two samples `sample_gap` apart, printed once (a table, or JSON)."""
    from sparkdeploy.errors import StepFailed

    monitor.sample()
    time.sleep(sample_gap)
    monitor.sample()
    snap = monitor.snapshot()
    snap["unreachable"] = unreachable
    snap["guards"] = guards
    if as_json:
        emit_json(snap)
    else:
        _console().print(render_table(snap, title))
        _print_guards(guards)
    if unreachable:
        raise StepFailed(f"unreachable: {', '.join(unreachable)}")


def _top_watch(
    monitor: Monitor, guards: dict[str, dict[str, Any] | None], interval: float, as_json: bool, title: str
) -> None:
    """A sample every `interval` until stopped: JSON lines, plain tables when piped, else a live screen."""
    # Until Ctrl-C or SIGTERM: the stop raises wherever the loop waits (a scrape, the sleep) and exits 130 or 143
    # (sparkdeploy/runtime/interrupts.py); the live display gives the terminal back on its way out.
    if as_json:  # one JSON object per line, every interval, for scripts that keep watching
        import json

        while True:
            monitor.sample()
            click.echo(json.dumps(monitor.snapshot(), default=str), nl=True)
            time.sleep(interval)

    if not sys.stdout.isatty():  # piped or redirected: a live screen would print nothing; one table each interval
        while True:
            monitor.sample()
            _plain_console().print(render_table(monitor.snapshot(), f"{title}  {time.strftime('%H:%M:%S')}"))
            sys.stdout.flush()
            time.sleep(interval)

    from rich.live import Live

    _print_guards(guards, f" (at {time.strftime('%H:%M:%S')}; `sparkdeploy status` for now)")
    monitor.sample()
    with Live(render_table(monitor.snapshot(), title), console=_console(), auto_refresh=False) as live:
        while True:
            time.sleep(interval)
            monitor.sample()
            live.update(render_table(monitor.snapshot(), f"{title}  {time.strftime('%H:%M:%S')}"), refresh=True)
