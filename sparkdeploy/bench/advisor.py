"""Which topology to serve a recipe with, for a load of N concurrent requests of P prompt and G generated tokens.

The numbers come from measured results when there are any for the recipe (at least two topologies), else from
the reference tables shipped with sparkdeploy (the seeds' gpt-oss-120b measurements on two DGX Sparks).

Objective (explicit, `--objective`):
- latency (default): the shortest request, i.e. the time one request of P prompt and G generated tokens takes
  at N concurrent: TTFT + (G - 1) / (decode t/s total / N). At a fixed N that is also the most requests
  finished per second (N / request time), so it weighs prefill and decode the way the workload does.
- decode: the highest total decode t/s (generation-heavy work: chat, code, long answers).
- ttft: the lowest time to first token (interactive feel, short answers).
- prefill: the highest total prefill t/s (prompt-heavy batch work: RAG, summaries).
Between measured concurrency levels values are interpolated on a log2 scale; beyond them the nearest level is
used and said so. TTFT is scaled by P / the measured prompt length when they differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sparkdeploy.backend_features import refused_flags, serving_backends
from sparkdeploy.bench.reference import seed_reference
from sparkdeploy.bench.store import METRICS, BenchResult, load_results, routing_of, variant_label
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.inventory import load_inventory
from sparkdeploy.recipes import TOPOLOGIES, load_recipe, resolve
from sparkdeploy.simulated import LABEL, any_simulated
from sparkdeploy.topologies import REGISTRY

OBJECTIVES = {
    "latency": "shortest request: TTFT + (G-1) / per-request decode rate at N concurrent "
    "(= most requests finished per second)",
    "decode": "highest total decode throughput (t/s)",
    "ttft": "lowest time to first token",
    "prefill": "highest total prefill throughput (t/s)",
}
DEFAULT_MAX_BATCHED_TOKENS = 32768  # vLLM's value in the reference recipe (and the seeds)
ENGINES = {"solo": 1, "cluster": 1}  # 2xsolo variants: 2 (on two nodes; results' metadata says how many)


@dataclass
class Estimate:
    variant: str
    ttft_ms: float
    decode_tps: float
    prefill_tps: float
    request_s: float
    level_note: str = ""

    def score(self, objective: str) -> float:
        """Higher is better."""
        return {
            "latency": -self.request_s,
            "decode": self.decode_tps,
            "ttft": -self.ttft_ms,
            "prefill": self.prefill_tps,
        }[objective]

    def to_json(self) -> dict:
        return {
            "variant": self.variant,
            "label": variant_label(self.variant),
            "ttft_ms": round(self.ttft_ms, 1),
            "decode_tps": round(self.decode_tps, 1),
            "prefill_tps": round(self.prefill_tps, 0),
            "request_s": round(self.request_s, 2),
        }


@dataclass
class TopologyAdvice:
    concurrency: int
    prompt_tokens: int
    gen_tokens: int
    objective: str
    recipe: str | None
    source: dict[str, Any]
    ranking: list[Estimate]
    by_objective: dict[str, str]
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    backend: str | None = None  # a cluster backend other than the recipe's, when only it serves the recipe's flags
    inventory: str | None = None  # the inventory the ranking was checked against (named in the command)

    @property
    def best(self) -> Estimate:
        return self.ranking[0]

    engines: dict[str, int] = field(default_factory=dict)  # variant -> engines behind the endpoint
    nodes: int = 2

    def label(self, variant: str) -> str:
        """The seeds' column names on two nodes; on more, the layout: Cluster TP=4, Replicas 2xTP=2, 4xSolo."""
        if self.nodes <= 2:
            return variant_label(variant)
        engines = self.engines.get(variant, 1)
        if variant == "cluster":
            return f"Cluster TP={self.nodes}"
        if variant == "replicas":
            return f"Replicas {engines}xTP={max(self.nodes // engines, 1)}"
        if variant.startswith("2xsolo-"):
            return f"{engines}xSolo {variant[len('2xsolo-') :]}"
        return variant_label(variant)

    @property
    def topology(self) -> str:
        return topology_of(self.best.variant)

    def to_json(self) -> dict:
        b = self.best
        routing = routing_of(b.variant)
        cmd = f"sparkdeploy up --recipe {self.recipe or '<recipe>'} --topology {self.topology}"
        if routing and routing != "simple-shuffle":
            cmd += f" --set litellm.routing_strategy={routing}"
        backend = self.backend if self.topology == "cluster" else None
        if backend:
            cmd += f" --backend {backend}"
        if b.variant == "replicas":
            tp = max(self.nodes // self.engines.get("replicas", 2), 1)
            cmd += f" --tp {tp}" if tp != 2 else ""
        if self.inventory:
            cmd += f" --inventory {self.inventory}"
        return {
            "recommendation": {
                "topology": self.topology,
                "routing": routing,
                "variant": b.variant,
                "label": self.label(b.variant),
                "backend": backend,
            },
            "objective": self.objective,
            "objective_text": OBJECTIVES[self.objective],
            "concurrency": self.concurrency,
            "prompt_tokens": self.prompt_tokens,
            "gen_tokens": self.gen_tokens,
            "recipe": self.recipe,
            "source": self.source,
            "ranking": [dict(e.to_json(), label=self.label(e.variant)) for e in self.ranking],
            "by_objective": self.by_objective,
            "reasons": self.reasons,
            "notes": self.notes,
            "command": cmd,
        }


def _interp(points: dict[int, float], n: int) -> tuple[float, str]:
    levels = sorted(points)
    if n in points:
        return points[n], ""
    if n < levels[0]:
        return points[levels[0]], f"below the measured range: values of c{levels[0]}"
    if n > levels[-1]:
        return points[levels[-1]], f"beyond the measured range: values of c{levels[-1]} (expect worse)"
    lo = max(c for c in levels if c < n)
    hi = min(c for c in levels if c > n)
    t = (math.log2(n) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return points[lo] + t * (points[hi] - points[lo]), f"interpolated between c{lo} and c{hi}"


def estimates(results: list[BenchResult], n: int, prompt_tokens: int, gen_tokens: int) -> list[Estimate]:
    out = []
    for variant in sorted({r.variant for r in results}):
        rs = [r for r in results if r.variant == variant and all(m in r.metrics for m in METRICS)]
        if not rs:
            continue
        pts = {m: {r.concurrency: r.metrics[m].mean for r in rs} for m in METRICS}
        pp = rs[0].pp
        ttft, note = _interp(pts["ttft_ms"], n)
        decode, _ = _interp(pts["decode_tps"], n)
        prefill, _ = _interp(pts["prefill_tps"], n)
        ttft *= prompt_tokens / pp
        per_request = decode / n if n else decode
        request_s = ttft / 1000.0 + max(gen_tokens - 1, 0) / max(per_request, 1e-9)
        out.append(Estimate(variant, ttft, decode, prefill, request_s, note))
    return out


def engines_of(results: list[BenchResult]) -> dict[str, int]:
    """Engines behind each variant's endpoint, from the results' metadata (the proxy's backends), else the
    two-node seeds' (2xsolo: 2)."""
    out: dict[str, int] = {}
    for r in results:
        backends = r.metadata.get("backends") or []
        out[r.variant] = max(
            out.get(r.variant, 1),
            len(backends),
            2 if r.variant.startswith("2xsolo") and not r.metadata.get("nodes") else 1,
        )
    return out


def nodes_of(results: list[BenchResult]) -> int:
    return max([len(r.metadata.get("nodes") or []) for r in results] + [2])


def _measured(
    results_dirs: list[str] | None, recipe: str | None, prompt_tokens: int, gen_tokens: int
) -> tuple[list[BenchResult] | None, dict | str]:
    """(results, source) of the user's own measurements closest to the shape asked about, or (None, why they
    cannot answer), so the fallback to the seeds can say why."""
    asked = [str(d) for d in results_dirs or []]
    dirs = [d for d in asked if Path(d).exists()]
    if not dirs:
        return None, (f"no results folder at {', '.join(asked)}" if asked else "no results folder given")
    results, _ = load_results(dirs)
    where = ", ".join(str(d) for d in dirs)
    if recipe:
        others = sorted({r.recipe for r in results if r.recipe != recipe})
        results = [r for r in results if r.recipe == recipe]
        if not results:
            return None, (
                f"{where} holds no results of {recipe}" + (f" (it holds {', '.join(others)})" if others else "")
            )
    if not results:
        return None, f"{where} holds no results"
    # the measured shape closest to the one asked about
    shapes = sorted(
        {(r.recipe, r.pp, r.tg) for r in results},
        key=lambda s: abs(math.log(s[1] / prompt_tokens)) + abs(math.log(s[2] / gen_tokens)),
    )
    recipe_, pp, tg = shapes[0]
    chosen = [r for r in results if (r.recipe, r.pp, r.tg) == (recipe_, pp, tg)]
    variants = sorted({r.variant for r in chosen})
    if len(variants) < 2:
        return None, (
            f"{where} holds {recipe_} (pp{pp}/tg{tg}) measured on one topology only "
            f"({variant_label(variants[0])}): a comparison needs two"
        )
    dates = sorted(str(r.metadata.get("date", ""))[:10] for r in chosen if r.metadata.get("date"))
    simulated = any_simulated(r.metadata for r in chosen)
    return chosen, {
        "kind": "measured",
        "recipe": recipe_,
        "pp": pp,
        "tg": tg,
        "files": len(chosen),
        "dirs": [str(d) for d in dirs],
        "dates": [dates[0], dates[-1]] if dates else [],
        "simulated": simulated,
        "description": f"your measurements of {recipe_} (pp{pp}/tg{tg}, {len(chosen)} files in "
        f"{where})" + (f" — {LABEL} engine" if simulated else ""),
    }


def accepted_topologies(
    recipe: str | None, recipes_dir: str | None = None, inventory: str | None = None
) -> tuple[set[str] | None, list[str]]:
    """The topologies `up` accepts for the recipe (recipes.resolve is the judge, as in `up`) and, with an
    inventory, for its node count (each topology's min_nodes); one line per topology refused, with its reason.
    (None, []) with neither."""
    if not recipe and not inventory:
        return None, []
    if recipe:
        load_recipe(recipe, recipes_dir)  # an unknown recipe is refused as `up` refuses it, not as "no topology"
    nodes = len(load_inventory(inventory).nodes) if inventory else None
    accepted, refused = set(), []
    for topology in TOPOLOGIES:
        try:
            if recipe:
                resolve(recipe, topology, recipes_dir=recipes_dir)
            if nodes is not None and nodes < REGISTRY[topology].min_nodes:
                refused.append(
                    f"{topology}: needs at least {REGISTRY[topology].min_nodes} nodes, the inventory has {nodes}"
                )
                continue
            accepted.add(topology)
        except ConfigError as exc:
            refused.append(f"{topology}: {exc.problems[0].message}")
    return accepted, refused


def topology_of(variant: str) -> str:
    """2xsolo-<routing> -> 2xsolo; the others are their topology."""
    return "2xsolo" if variant.startswith("2xsolo") else variant


def max_batched_tokens(recipe: str | None, recipes_dir: str | None = None) -> tuple[int, str]:
    if recipe:
        try:
            r, _path, _ = load_recipe(recipe, recipes_dir)
            value = getattr(r.vllm, "max_num_batched_tokens", None)
            if value:
                return int(value), f"recipe {recipe}"
        except Exception:  # noqa: BLE001 - an unreadable recipe falls back to the reference value
            pass
    return DEFAULT_MAX_BATCHED_TOKENS, "the reference recipe"


def serving_backend(recipe: str | None, recipes_dir: str | None = None) -> tuple[str | None, str]:
    """The cluster backend to name when the recipe's own cannot serve every flag it passes (issue 18)."""
    if not recipe:
        return None, ""

    try:
        resolved = resolve(recipe, "cluster", recipes_dir=recipes_dir)  # the recipe's cluster values
    except ConfigError:
        return None, ""
    r = resolved.recipe
    extra = list(r.vllm.extra_args)
    refused = refused_flags(extra, resolved.backend)
    if not refused:
        return None, ""
    capable = serving_backends(extra)
    if not capable:
        return None, f"no cluster backend serves {recipe}'s flags {' '.join(refused)}"
    return capable[0], (
        f"the recipe's cluster backend {resolved.backend} does not honour {' '.join(refused)}: "
        f"use --backend {capable[0]}"
    )


def advise(
    concurrency: int,
    prompt_tokens: int = 1024,
    gen_tokens: int = 128,
    recipe: str | None = None,
    objective: str = "latency",
    results_dirs: list[str] | None = None,
    recipes_dir: str | None = None,
    inventory: str | None = None,
) -> TopologyAdvice:
    if concurrency < 1 or prompt_tokens < 1 or gen_tokens < 1:
        raise ConfigError(Problem("advise", "", "concurrency, prompt and generated tokens must be >= 1", ""))
    if objective not in OBJECTIVES:
        raise ConfigError(Problem("--objective", objective, "unknown", f"use {', '.join(OBJECTIVES)}"))
    notes: list[str] = []
    measured, source_or_why = _measured(results_dirs, recipe, prompt_tokens, gen_tokens)
    if measured is not None:
        results, source = measured, cast("dict[str, Any]", source_or_why)  # a dict when measured
    else:
        ref = seed_reference()
        results = ref.results
        source = {
            "kind": "reference",
            "recipe": ref.recipe,
            "pp": ref.pp,
            "tg": ref.tg,
            "description": ref.describe(),
            "source": ref.source["files"],
            "why": source_or_why,
        }
        notes.append(f"using the seeds' measurements of {ref.recipe}: {source_or_why}")
        if recipe and recipe != ref.recipe:
            notes.append(
                f"the seeds measured {ref.recipe} (a sparse MoE that fits one node), not {recipe}; run "
                f"`sparkdeploy bench sweep --recipe {recipe}` for its own numbers"
            )
    ests = estimates(results, concurrency, prompt_tokens, gen_tokens)
    if len(ests) < 2:
        raise ConfigError(Problem("advise", "", "fewer than two topologies measured", "run a sweep first"))
    accepted, refused = accepted_topologies(recipe, recipes_dir, inventory)
    if accepted is not None:
        measured_topologies = {topology_of(e.variant) for e in ests}
        ests = [e for e in ests if topology_of(e.variant) in accepted]
        left_out = [r for r in refused if r.split(":")[0] in measured_topologies]
        if left_out:
            notes.append(
                f"not ranked, `up` refuses them{f' for {recipe}' if recipe else ''}"
                f"{' on this inventory' if inventory else ''}: " + "; ".join(left_out)
            )
        if not ests:
            raise ConfigError(
                Problem(
                    "advise",
                    recipe or "",
                    "none of the measured topologies is one `up` accepts "
                    f"for this recipe ({', '.join(sorted(accepted))})",
                    f"run `sparkdeploy bench sweep --recipe {recipe}`",
                )
            )
    ranking = sorted(ests, key=lambda e: e.score(objective), reverse=True)
    by_obj = {o: max(ests, key=lambda e: e.score(o)).variant for o in OBJECTIVES}
    advice = TopologyAdvice(
        concurrency,
        prompt_tokens,
        gen_tokens,
        objective,
        recipe or source.get("recipe"),
        source,
        ranking,
        by_obj,
        notes=notes,
    )
    advice.inventory = inventory
    ranked = {e.variant for e in ranking}
    advice.engines = {v: e for v, e in engines_of(results).items() if v in ranked}
    advice.nodes = nodes_of(results)
    advice.reasons = explain(advice, recipe, recipes_dir)
    advice.backend, note = serving_backend(recipe, recipes_dir)
    if note and advice.topology == "cluster":
        notes.append(note)
    if ranking[0].level_note:
        notes.append(ranking[0].level_note)
    if (prompt_tokens, gen_tokens) != (source["pp"], source["tg"]):
        notes.append(
            f"measured at pp{source['pp']}/tg{source['tg']}: TTFT scaled by {prompt_tokens}/{source['pp']}, "
            f"decode rates as measured; a sweep with --pp {prompt_tokens} --tg {gen_tokens} would be exact"
        )
    return advice


def _pct(a: float, b: float) -> str:
    return f"{(a - b) / b * 100:+.0f}%" if b else "n/a"


def explain(a: TopologyAdvice, recipe: str | None, recipes_dir: str | None) -> list[str]:
    best, ranking, n, p = a.best, a.ranking, a.concurrency, a.prompt_tokens
    second = ranking[1] if len(ranking) > 1 else None
    lb = a.label
    reasons = []
    if second is None:  # the recipe leaves one topology: nothing to weigh it against
        reasons.append(
            f"{lb(best.variant)} is the only measured topology `up` accepts for {recipe}. At c{n}: "
            f"{best.request_s:.2f} s per request (TTFT {best.ttft_ms:.0f} ms, decode "
            f"{best.decode_tps:.1f} t/s in total)."
        )
    elif a.objective == "latency":
        reasons.append(
            f"objective: {OBJECTIVES['latency']}. At c{n}: {lb(best.variant)} {best.request_s:.2f} s per request "
            f"(TTFT {best.ttft_ms:.0f} ms + {a.gen_tokens - 1} tokens at {best.decode_tps / n:.1f} t/s each) vs "
            f"{lb(second.variant)} {second.request_s:.2f} s ({_pct(best.request_s, second.request_s)})."
        )
    else:
        unit = {"decode": ("decode_tps", "t/s"), "ttft": ("ttft_ms", "ms"), "prefill": ("prefill_tps", "t/s")}
        f, u = unit[a.objective]
        reasons.append(
            f"objective: {OBJECTIVES[a.objective]}. At c{n}: {lb(best.variant)} "
            f"{getattr(best, f):.1f} {u} vs {lb(second.variant)} {getattr(second, f):.1f} {u} "
            f"({_pct(getattr(best, f), getattr(second, f))})."
        )
    by = a.by_objective
    split = {o: v for o, v in by.items() if v != best.variant}
    if split:
        reasons.append(
            "other objectives choose differently at this load: "
            + "; ".join(f"{o} -> {lb(v)}" for o, v in split.items())
            + f" (objective used: {a.objective}; pass --objective)."
        )
    est = {e.variant: e for e in ranking}
    mnbt, where = max_batched_tokens(recipe, recipes_dir)
    k = max(mnbt // p, 1)
    shared = sorted({e for e in a.engines.values() if e > 1})
    if n > k:
        parts = []
        for e in shared:
            per = math.ceil(n / e)
            who = " and ".join(lb(v) for v, x in sorted(a.engines.items()) if x == e)
            parts.append(
                f"{who} ({e} engines) gives each ~{per}"
                + (", which fits one step" if per <= k else f" ({math.ceil(per / k)} steps)")
            )
        reasons.append(
            f"batching: max_num_batched_tokens {mnbt} ({where}) / {p} prompt tokens = {k} prefills per "
            f"engine step. c{n} is more than {k}: one engine (solo, cluster) needs {math.ceil(n / k)} "
            f"steps, the rest queue and TTFT grows" + ("; " + "; ".join(parts) if parts else "") + "."
        )
    else:
        reasons.append(
            f"batching: max_num_batched_tokens {mnbt} ({where}) / {p} prompt tokens = {k} prefills per "
            f"engine step, so all {n} prompts fit one engine's step: no prefill queueing on any topology."
        )
    if "cluster" in est and "replicas" in est:
        c, r = est["cluster"], est["replicas"]
        engines = a.engines.get("replicas", 2)
        tp = max(a.nodes // engines, 1)
        reasons.append(
            f"cluster TP={a.nodes} vs {engines} replicas of TP={tp}: the wider engine reads 1/{a.nodes} "
            f"of the weights per token but pays {2 * (a.nodes - 1)} ring steps per all-reduce (vs "
            f"{2 * (tp - 1)}) twice per layer; the replicas batch independently. At c{n}: decode "
            f"{c.decode_tps:.0f} vs {r.decode_tps:.0f} t/s, TTFT {c.ttft_ms:.0f} vs {r.ttft_ms:.0f} ms."
        )
    if "cluster" in est and "solo" in est:
        c, s = est["cluster"], est["solo"]
        reasons.append(
            f"TP=2: cluster splits the weights over both GPUs, so each reads half the weights per "
            f"decoded token; decode on a Spark is bound by memory bandwidth (273 GB/s), hence "
            f"{c.decode_tps:.0f} vs {s.decode_tps:.0f} t/s for solo at c{n} "
            f"({_pct(c.decode_tps, s.decode_tps)}), paid for with an all-reduce per layer over CX7 "
            "that weighs more as the batch grows."
        )
    shuffle = next((e for v, e in est.items() if v == "2xsolo-shuffle"), None)
    if "2xsolo-least-busy" in est:
        lbz = est["2xsolo-least-busy"]
        cmp_ = (
            f" ({lbz.decode_tps:.0f} vs {shuffle.decode_tps:.0f} t/s decode for simple-shuffle here)" if shuffle else ""
        )
        reasons.append(
            "least-busy routing starves a backend with identical engines: one drains, every new request "
            f"rushes to it, the other idles{cmp_}; use simple-shuffle."
        )
    if best.variant.startswith("2xsolo"):
        e = a.engines.get(best.variant, 2)
        reasons.append(
            f"2xsolo runs {'two' if e == 2 else e} independent engines behind LiteLLM: {e} times the batch "
            "budget and no cross-node synchronisation, at the price of per-request speed at low load."
        )
    if best.variant == "replicas":
        e = a.engines.get("replicas", 2)
        reasons.append(
            f"replicas runs {e} TP engines behind LiteLLM: each decodes faster than one node alone "
            f"and the {e} batch independently (sparkdeploy up --topology replicas --tp K)."
        )
    return reasons


def render_text(a: TopologyAdvice) -> str:
    j = a.to_json()
    rec = j["recommendation"]
    lines = [
        f"recommended: {rec['topology']}"
        + (f" ({rec['routing']})" if rec["routing"] else "")
        + f" for c{a.concurrency}, {a.prompt_tokens} prompt / {a.gen_tokens} generated tokens"
        + f" [objective: {a.objective}]",
        f"from: {a.source['description']}",
        "",
        "why:",
    ]
    lines += [f"  - {r}" for r in a.reasons]
    lines += [
        "",
        "estimates at this load:",
        f"  {'topology':<16} {'request s':>9} {'TTFT ms':>9} {'decode t/s':>10} {'prefill t/s':>11}",
    ]
    for e in a.ranking:
        lines.append(
            f"  {a.label(e.variant):<16} {e.request_s:>9.2f} {e.ttft_ms:>9.0f} {e.decode_tps:>10.1f} "
            f"{e.prefill_tps:>11.0f}"
        )
    if a.notes:
        lines += ["", "notes:"] + [f"  - {n}" for n in a.notes]
    lines += ["", f"deploy it: {j['command']}"]
    return "\n".join(lines)
