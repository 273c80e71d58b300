"""Which topology to serve a recipe with, for a load of N concurrent requests of P prompt and G generated tokens.

The figures are always the recipe's own model's, never another's under its name:
- measured results of the recipe when there are any (at least two topologies, or the one `up` accepts);
- else, for gpt-oss-120b (or no recipe), the reference tables shipped with sparkdeploy: the seeds' measurements
  of that model on two DGX Sparks;
- else the calibrated simulator's prediction for the recipe's model (bench/predicted.py), labelled SIMULATED;
- else none: `advise` says so and how to measure them (`sparkdeploy bench sweep --recipe NAME`).

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

from sparkdeploy.bench.predicted import SOURCE as PREDICTOR
from sparkdeploy.bench.predicted import predict_recipe
from sparkdeploy.bench.seeds import Reference, seed_reference
from sparkdeploy.bench.speculative_ab import advice_note
from sparkdeploy.bench.store import METRICS, BenchResult, load_results, routing_of, variant_label
from sparkdeploy.config.inventory import load_inventory
from sparkdeploy.errors import ConfigError, Problem
from sparkdeploy.recipes.backend_features import refused_flags, serving_backends
from sparkdeploy.recipes.engines.registered import engine_version
from sparkdeploy.recipes.recipe import TOPOLOGIES, load_recipe, resolve
from sparkdeploy.simulated import LABEL, any_simulated, tag
from sparkdeploy.topologies import REGISTRY

OBJECTIVES = {
    "latency": "shortest request: TTFT + (G-1) / per-request decode rate at N concurrent "
    "(= most requests finished per second)",
    "decode": "highest total decode throughput (t/s)",
    "ttft": "lowest time to first token",
    "prefill": "highest total prefill throughput (t/s)",
}
DEFAULT_MAX_BATCHED_TOKENS = 32768  # vLLM's value in the reference recipe (and the seeds)
# vLLM 0.32.0's own default for the API server on a device of >= 70 GiB (a GB10 has 119.7 GiB): what a recipe that
# sets no max_num_batched_tokens runs with (vllm/engine/arg_utils.py, the `device_memory >= 70 * GiB_bytes` branch).
VLLM_DEFAULT_MAX_BATCHED_TOKENS = 8192
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

    def to_json(self) -> dict[str, Any]:
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

    @property
    def simulated(self) -> bool:
        """The figures come from a simulated engine (measured in the lab) or from the simulator's prediction."""
        return self.source.get("simulated") is True

    def to_json(self) -> dict[str, Any]:
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
            "simulated": self.simulated,
            "label": LABEL if self.simulated else None,
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
) -> tuple[list[BenchResult] | None, dict[str, Any] | str]:
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
    """The recipe's max_num_batched_tokens (vLLM's default when it sets none), or the reference recipe's."""
    if recipe:
        r, _path, _ = load_recipe(recipe, recipes_dir)  # advise refused an unreadable recipe before this
        if r.engine == "sglang" and r.sglang and r.sglang.chunked_prefill_size:  # SGLang's tokens per prefill step
            return int(r.sglang.chunked_prefill_size), f"recipe {recipe}'s sglang.chunked_prefill_size"
        if r.engine != "vllm":
            return VLLM_DEFAULT_MAX_BATCHED_TOKENS, (
                f"vLLM's default: recipe {recipe} serves with {engine_version(r).text}, which batches prefills "
                "its own way"
            )
        value = r.vllm.max_num_batched_tokens
        if value:
            return int(value), f"recipe {recipe}"
        return VLLM_DEFAULT_MAX_BATCHED_TOKENS, f"vLLM's default: recipe {recipe} sets none"
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
    accepted, refused = accepted_topologies(recipe, recipes_dir, inventory)
    ref = seed_reference()
    model = load_recipe(recipe, recipes_dir)[0].model if recipe else None
    if measured is not None:
        results, source = measured, cast("dict[str, Any]", source_or_why)  # a dict when measured
    elif recipe is None or model == ref.model:  # the seeds measured this model
        results, source = ref.results, _reference_source(ref, recipe, recipes_dir, str(source_or_why), notes)
    else:  # another model: the simulator's prediction for it, or no figures at all
        results, source = _predicted(
            recipe,
            model,
            accepted,
            concurrency,
            prompt_tokens,
            gen_tokens,
            recipes_dir,
            inventory,
            str(source_or_why),
            notes,
        )
    ests = estimates(results, concurrency, prompt_tokens, gen_tokens)
    if not ests:
        raise ConfigError(Problem("advise", "", "no topology measured", "run a sweep first"))
    if accepted is not None:
        ests = _accepted_only(ests, accepted, refused, source, recipe, inventory, notes)
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
    spec = load_recipe(recipe, recipes_dir)[0].speculative if recipe else None
    speculation = advice_note(concurrency, recipe, spec.model_dump() if spec else None)
    if speculation:
        notes.append(speculation)
    if ranking[0].level_note and source["kind"] != "predicted":  # predictions are made at the level asked
        notes.append(ranking[0].level_note)
    if (prompt_tokens, gen_tokens) != (source["pp"], source["tg"]):
        notes.append(
            f"measured at pp{source['pp']}/tg{source['tg']}: TTFT scaled by {prompt_tokens}/{source['pp']}, "
            f"decode rates as measured; a sweep with --pp {prompt_tokens} --tg {gen_tokens} would be exact"
        )
    return advice


def _reference_source(
    ref: Reference, recipe: str | None, recipes_dir: str | None, why: str, notes: list[str]
) -> dict[str, Any]:
    """The seeds' measurements as the figures' source (they measured this model); what that means, in `notes`."""
    notes.append(f"using the seeds' measurements of {ref.model}: {why}")
    if recipe and recipe != ref.recipe:
        r = load_recipe(recipe, recipes_dir)[0]
        serves = (
            f"with {engine_version(r).text} and its own settings" if r.engine != "vllm" else "with its own settings"
        )
        notes.append(
            f"the seeds measured {ref.model} on vLLM as {ref.recipe} configures it; {recipe} serves the same "
            f"model {serves}: `sparkdeploy bench sweep --recipe {recipe}` measures it as it is"
        )
    return {
        "kind": "reference",
        "recipe": ref.recipe,
        "model": ref.model,
        "pp": ref.pp,
        "tg": ref.tg,
        "simulated": False,
        "description": ref.describe(),
        "source": ref.source["files"],
        "why": why,
    }


def _predicted(
    recipe: str,
    model: str | None,
    accepted: set[str] | None,
    concurrency: int,
    prompt_tokens: int,
    gen_tokens: int,
    recipes_dir: str | None,
    inventory: str | None,
    why_unmeasured: str,
    notes: list[str],
) -> tuple[list[BenchResult], dict[str, Any]]:
    """The simulator's prediction for a model nobody measured: (results, source); refused (ConfigError) when
    it predicts nothing."""
    nodes = len(load_inventory(inventory).nodes) if inventory else 2
    wanted = sorted(accepted if accepted is not None else TOPOLOGIES)
    pred = predict_recipe(recipe, wanted, concurrency, prompt_tokens, gen_tokens, recipes_dir, nodes)
    if isinstance(pred, str) or not pred.results:
        why = pred if isinstance(pred, str) else "; ".join(pred.notes) or "the simulator predicted nothing"
        raise ConfigError(
            Problem(
                "advise",
                recipe,
                f"no figures for {recipe} ({model}): no measurements ({why_unmeasured}), and no prediction: {why}",
                f"measure it: sparkdeploy bench sweep --recipe {recipe} (in the lab its figures are {LABEL})",
            )
        )
    notes.append(
        f"no measurements of {recipe} ({why_unmeasured}): `sparkdeploy bench sweep --recipe {recipe}` makes them"
    )
    notes += pred.notes
    return pred.results, {
        "kind": "predicted",
        "recipe": recipe,
        "model": model,
        "pp": prompt_tokens,
        "tg": gen_tokens,
        "simulated": True,
        "description": f"{LABEL}: {PREDICTOR} for {model} as {recipe} configures it on {nodes} DGX Sparks "
        "(calibrated on the seeds' gpt-oss-120b tables: a model's arithmetic, not measurements)",
        "why": why_unmeasured,
    }


def _accepted_only(
    ests: list[Estimate],
    accepted: set[str],
    refused: list[str],
    source: dict[str, Any],
    recipe: str | None,
    inventory: str | None,
    notes: list[str],
) -> list[Estimate]:
    """The estimates of the topologies `up` accepts; the measured ones it refuses are named in `notes`."""
    measured_topologies = {topology_of(e.variant) for e in ests}
    if source["kind"] == "predicted":  # only what `up` accepts was predicted: name what it refuses
        measured_topologies |= {r.split(":")[0] for r in refused}
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
                f"none of the measured topologies is one `up` accepts for this recipe ({', '.join(sorted(accepted))})",
                f"run `sparkdeploy bench sweep --recipe {recipe}`",
            )
        )
    return ests


def _pct(a: float, b: float) -> str:
    return f"{(a - b) / b * 100:+.0f}%" if b else "n/a"


def _prompts(n: int) -> str:
    """`all N prompts fit` in words that read right for one and two."""
    return {1: "the one prompt fits", 2: "both prompts fit"}.get(n, f"all {n} prompts fit")


def _names(labels: list[str]) -> tuple[str, str]:
    """'A and B' and the verb's number: ('Shuffle', 'gives') / ('Least-busy and Shuffle', 'give')."""
    return " and ".join(labels), ("gives" if len(labels) == 1 else "give")


ALIKE = 0.05  # two rates within 5 % of each other are called alike, not a win


def explain(a: TopologyAdvice, recipe: str | None, recipes_dir: str | None) -> list[str]:
    """Why the best topology wins at this load, one sentence per reason; each sentence's claim is read off the
    figures it quotes (a comparison says which is higher only when it is, by more than ALIKE)."""
    best, ranking = a.best, a.ranking
    reasons = [_objective_reason(a, recipe)]
    lb = a.label
    split = {o: v for o, v in a.by_objective.items() if v != best.variant}
    if split:
        reasons.append(
            "other objectives choose differently at this load: "
            + "; ".join(f"{o} -> {lb(v)}" for o, v in split.items())
            + f" (objective used: {a.objective}; pass --objective)."
        )
    est = {e.variant: e for e in ranking}
    reasons.append(_batching_reason(a, est, recipe, recipes_dir))
    reasons += _width_reasons(a, est)
    reasons += _routing_reasons(a, est)
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


def _objective_reason(a: TopologyAdvice, recipe: str | None) -> str:
    """The best against the runner-up on the objective asked (or, alone, what it does at this load)."""
    best, ranking, n = a.best, a.ranking, a.concurrency
    second = ranking[1] if len(ranking) > 1 else None
    lb = a.label
    kind = "predicted" if a.source.get("kind") == "predicted" else "measured"
    if a.gen_tokens > 1:
        request = f"(TTFT {{ttft:.0f}} ms + {a.gen_tokens - 1} tokens at {{rate:.1f}} t/s each)"
    else:
        request = "(TTFT {ttft:.0f} ms: one token, no decode)"
    if second is None:  # the recipe leaves one topology: nothing to weigh it against
        return (
            f"{lb(best.variant)} is the only {kind} topology `up` accepts for {recipe}. At c{n}: "
            f"{best.request_s:.2f} s per request "
            + request.format(ttft=best.ttft_ms, rate=best.decode_tps / n)
            + f", decode {best.decode_tps:.1f} t/s in total."
        )
    if a.objective == "latency":
        return (
            f"objective: {OBJECTIVES['latency']}. At c{n}: {lb(best.variant)} {best.request_s:.2f} s per request "
            + request.format(ttft=best.ttft_ms, rate=best.decode_tps / n)
            + f" vs {lb(second.variant)} {second.request_s:.2f} s ({_pct(best.request_s, second.request_s)})."
        )
    unit = {"decode": ("decode_tps", "t/s"), "ttft": ("ttft_ms", "ms"), "prefill": ("prefill_tps", "t/s")}
    f, u = unit[a.objective]
    return (
        f"objective: {OBJECTIVES[a.objective]}. At c{n}: {lb(best.variant)} "
        f"{getattr(best, f):.1f} {u} vs {lb(second.variant)} {getattr(second, f):.1f} {u} "
        f"({_pct(getattr(best, f), getattr(second, f))})."
    )


def _batching_reason(a: TopologyAdvice, est: dict[str, Estimate], recipe: str | None, recipes_dir: str | None) -> str:
    """How many prefills fit one engine step (max_num_batched_tokens / prompt tokens), and who queues."""
    n, p, lb = a.concurrency, a.prompt_tokens, a.label
    mnbt, where = max_batched_tokens(recipe, recipes_dir)
    if a.source.get("kind") == "reference" and mnbt != DEFAULT_MAX_BATCHED_TOKENS:
        where += f"; the seeds measured with {DEFAULT_MAX_BATCHED_TOKENS}"
    k = max(mnbt // p, 1)
    if n <= k:
        return (
            f"batching: max_num_batched_tokens {mnbt} ({where}) / {p} prompt tokens = {k} prefills per "
            f"engine step, so {_prompts(n)} one engine's step: no prefill queueing on any topology."
        )
    single = [lb(v) for v in est if a.engines.get(v, 1) == 1]
    shared = sorted({e for v, e in a.engines.items() if e > 1 and v in est})
    parts = []
    for e in shared:
        per = math.ceil(n / e)
        who, verb = _names([lb(v) for v, x in sorted(a.engines.items()) if x == e and v in est])
        parts.append(
            f"{who} ({e} engines) {verb} each ~{per}"
            + (", which fits one step" if per <= k else f" ({math.ceil(per / k)} steps)")
        )
    one = f"one engine ({', '.join(single)}) needs" if single else "one engine would need"
    return (
        f"batching: max_num_batched_tokens {mnbt} ({where}) / {p} prompt tokens = {k} prefills per "
        f"engine step. c{n} is more than {k}: {one} {math.ceil(n / k)} "
        f"steps, the rest queue and TTFT grows" + ("; " + "; ".join(parts) if parts else "") + "."
    )


def _width_reasons(a: TopologyAdvice, est: dict[str, Estimate]) -> list[str]:
    """One wide engine against replicas, and against a node alone: weights read per token vs all-reduces."""
    n = a.concurrency
    reasons = []
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
        width = f"TP={a.nodes}"
        share = "half the weights" if a.nodes == 2 else f"1/{a.nodes} of the weights"
        if c.decode_tps > s.decode_tps * (1 + ALIKE):
            reasons.append(
                f"{width}: cluster splits the weights over {a.nodes} GPUs, so each reads {share} per "
                f"decoded token; decode on a Spark is bound by memory bandwidth (273 GB/s), hence "
                f"{c.decode_tps:.0f} vs {s.decode_tps:.0f} t/s for solo at c{n} "
                f"({_pct(c.decode_tps, s.decode_tps)}), paid for with an all-reduce per layer over CX7 "
                "that weighs more as the batch grows."
            )
        else:
            reasons.append(
                f"{width}: cluster splits the weights over {a.nodes} GPUs, but at c{n} the all-reduce per layer over "
                f"CX7 costs what reading {share} saves: {c.decode_tps:.0f} vs {s.decode_tps:.0f} "
                f"t/s decode for solo ({_pct(c.decode_tps, s.decode_tps)})."
            )
    return reasons


def _routing_reasons(a: TopologyAdvice, est: dict[str, Estimate]) -> list[str]:
    """least-busy against simple-shuffle in front of identical engines."""
    n = a.concurrency
    shuffle = est.get("2xsolo-shuffle")
    lbz = est.get("2xsolo-least-busy")
    if lbz is None or shuffle is None:
        return []
    if lbz.decode_tps < shuffle.decode_tps * (1 - ALIKE):
        return [
            (
                "least-busy routing starves a backend with identical engines: one drains, every new request "
                f"rushes to it, the other idles ({lbz.decode_tps:.0f} vs {shuffle.decode_tps:.0f} t/s decode for "
                f"simple-shuffle at c{n}, {_pct(lbz.decode_tps, shuffle.decode_tps)}); use simple-shuffle."
            )
        ]
    return [
        (
            f"routing: at c{n} least-busy and simple-shuffle decode alike ({lbz.decode_tps:.0f} vs "
            f"{shuffle.decode_tps:.0f} t/s); least-busy's starvation of one of two identical engines shows under "
            "load (the seeds measured -68% decode at 64 concurrent requests), so simple-shuffle is the default."
        )
    ]


def render_text(a: TopologyAdvice) -> str:
    j = a.to_json()
    rec = j["recommendation"]
    lines = [
        f"recommended: {rec['topology']}"
        + (f" ({rec['routing']})" if rec["routing"] else "")
        + f" for c{a.concurrency}, {a.prompt_tokens} prompt / {a.gen_tokens} generated tokens"
        + f" [objective: {a.objective}]{tag(a.simulated)}",
        f"from: {a.source['description']}",
        "",
        "why:",
    ]
    lines += [f"  - {r}" for r in a.reasons]
    lines += [
        "",
        f"estimates at this load{tag(a.simulated)}:",
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
