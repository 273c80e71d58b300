"""The calibrated simulator's prediction for a recipe nobody has measured (`advise`): SIMULATED figures.

vllm-sim (images/vllm-sim) is the lab's timing model of vLLM on a GB10; its virtual-time predictor
(vllm_sim/predict.py) replays llama-benchy's method against it in milliseconds instead of minutes. For a recipe
whose model the simulator has a profile of (vllm_sim/data/models.yaml: the model's config.json figures), this runs
the predictor for each topology `up` accepts, with the `vllm serve` arguments sparkdeploy renders for the recipe
(vllm_args.serve_args), as the lab starts the simulator, at the load asked about. Solo and cluster take requests
straight, 2xsolo and replicas behind the proxy (the spacing the calibration fitted), the proxy's shuffle drawn
RUNS times. Every figure is SIMULATED: the timing parameters were fitted to the seeds' gpt-oss-120b tables
(docs/calibration.md), so another model's figures are that model's arithmetic on the fitted GB10, not measurements.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from sparkdeploy import paths
from sparkdeploy.bench.store import BenchResult, Stat
from sparkdeploy.errors import ConfigError
from sparkdeploy.images.definitions import load_definition
from sparkdeploy.images.image_ref import is_reference
from sparkdeploy.recipes.engines.registered import engine_version
from sparkdeploy.recipes.recipe import resolve
from sparkdeploy.recipes.vllm_args import serve_args
from sparkdeploy.simulated import LABEL

MAX_LEVEL = 256  # the highest concurrency predicted (a larger one is answered with this level, and said so)
RUNS = 20  # draws of the proxy's simple-shuffle for the topologies behind it
ORDER = ("solo", "cluster", "2xsolo", "replicas")
SOURCE = "vllm-sim's virtual-time predictor (images/vllm-sim/vllm_sim/predict.py)"


@dataclass
class Prediction:
    model: str
    level: int  # the concurrency predicted
    results: list[BenchResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _simulator() -> Any:
    """vllm_sim (with sparklaunch, its engine protocol) from the image definitions, imported on first use: about
    0.3 s and the tokenizers package (the bench extras), which only `advise` without measurements needs."""
    for sub in ("launcher", "vllm-sim"):
        path = str(paths.images_dir() / sub)
        if path not in sys.path:
            sys.path.insert(0, path)
    return SimpleNamespace(
        **{name: importlib.import_module(f"vllm_sim.{name}") for name in ("catalog", "config", "flags", "predict")}
    )


def predict_recipe(
    recipe: str,
    topologies: list[str],
    concurrency: int,
    prompt_tokens: int,
    gen_tokens: int,
    recipes_dir: str | None = None,
    nodes: int = 2,
) -> Prediction | str:
    """The simulator's figures for `recipe` on each of `topologies` at `concurrency`, or why there are none."""
    try:
        sim = _simulator()
    except ImportError as exc:
        return f"the simulator cannot run here ({exc}; install the bench extras: requirements-bench.in)"
    r = resolve(recipe, recipes_dir=recipes_dir).recipe
    model = r.model
    if r.engine != "vllm":  # vllm-sim is a timing model of vLLM: another engine's figures would be invented
        return f"the simulator models vLLM's timing, not {engine_version(r).text}'s ({recipe}'s engine)"
    catalog = sim.catalog.default_catalog()
    if not catalog.model(model).known:
        return f"the simulator has no profile of {model} (images/vllm-sim/vllm_sim/data/models.yaml)"
    level = min(concurrency, MAX_LEVEL)
    out = Prediction(model, level)
    if level != concurrency:
        out.notes.append(
            f"{LABEL} predictions go to c{MAX_LEVEL}: these are its figures (expect worse at c{concurrency})"
        )
    names = [{"name": f"spark{i + 1}", "role": "head" if i == 0 else "worker"} for i in range(nodes)]
    for topology in sorted(topologies, key=lambda t: ORDER.index(t) if t in ORDER else len(ORDER)):
        if topology == "replicas" and nodes < 4:
            continue
        try:
            resolved = resolve(recipe, topology, recipes_dir=recipes_dir)
            if is_reference(resolved.recipe.image):
                out.notes.append(f"{topology}: a registry image's vLLM is not one the simulator models")
                continue
            argv = serve_args(resolved, load_definition(resolved.recipe.image), 8000)
            cfg = sim.config.from_namespace(sim.flags.parse_serve_args(argv), env={})
            direct, proxied = sim.predict.DIRECT_SPACING_S, sim.predict.PROXY_SPACING_S
            common = {"pp": prompt_tokens, "tg": gen_tokens, "catalog": catalog}
            if topology == "solo":
                variant, engines = "solo", 1
                (point,) = sim.predict.predict(cfg, [level], spacing_s=direct, **common)
            elif topology == "cluster":
                variant, engines = "cluster", 1
                (point,) = sim.predict.predict(sim.predict.with_tp(cfg, nodes), [level], spacing_s=direct, **common)
            elif topology == "2xsolo":
                variant, engines = "2xsolo-shuffle", nodes
                (point,) = sim.predict.predict(cfg, [level], engines=nodes, runs=RUNS, spacing_s=proxied, **common)
            else:
                variant, engines = "replicas", nodes // 2
                tp2 = sim.predict.with_tp(cfg, 2)
                (point,) = sim.predict.predict(tp2, [level], engines=engines, runs=RUNS, spacing_s=proxied, **common)
        except ConfigError as exc:  # the recipe refuses this topology after all: say why, predict the others
            out.notes.append(f"{topology}: {exc.problems[0].message}")
            continue
        except SystemExit:  # the simulator's vLLM parser refused the rendered line (it printed why)
            out.notes.append(f"{topology}: the simulator's vLLM 0.32.0 parser refuses the rendered line")
            continue
        except ValueError as exc:  # vllm_sim's ConfigError: what vLLM refuses at start (weights or KV do not fit)
            out.notes.append(f"{topology}: the simulated engine would not start: {exc}")
            continue
        metrics = {
            "decode_tps": Stat(point.decode_tps),
            "prefill_tps": Stat(point.prefill_tps),
            "ttft_ms": Stat(point.ttft_ms),
        }
        metadata = {
            "simulated": True,
            "source": SOURCE,
            "topology": topology,
            "nodes": names,
            "backends": [f"engine{i + 1}" for i in range(engines)] if engines > 1 else [],
        }
        out.results.append(BenchResult(recipe, variant, prompt_tokens, gen_tokens, level, metrics, metadata))
    return out
