"""`sparkdeploy bench --prompts FILE --speculative off,eagle3:3,ngram:4`: speculative decoding chosen against the
owner's own traffic (issue 39).

Each setting is deployed in turn through the normal `up` pipeline (the recipe with `--set speculative...`: the same
checks, the same refusals), then the owner's prompts (a JSONL of chat requests) run against it at every
concurrency given: streamed chat completions, timed here (TTFT: to the first streamed token; decode tokens/s: the
completion tokens of the level over its wall time), with the engine's own acceptance counters
(`vllm:spec_decode_*`, read before and after each level). The report gives, per setting and level, decode
tokens/s, TTFT, the acceptance rate, tokens per step and the ratio to `off`, and recommends one setting per
concurrency band (consecutive levels with the same winner). `--write-recipe DIR` writes the recipe with the
winner of the lowest level as its topology's override (a YAML serializer, never text pasted together).

The A/B's own cost beyond the deploys and the runs it makes is measured (`own_s`): benchmarks/speculative_ab.py.
"""

from __future__ import annotations

import json
import re
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sparkdeploy.bench.benchy import Endpoint, spec_counters
from sparkdeploy.config.userfile import parse_json, read_text
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.recipes.recipe import read_recipe_data, resolve
from sparkdeploy.recipes.speculative import SpecCounters, describe_acceptance
from sparkdeploy.runtime.interrupts import in_threads

SETTING = re.compile(r"(off)|([a-z][a-z0-9_]{0,40})(?::([1-9][0-9]?))?")
MAX_PROMPTS = 10_000
DEFAULT_MAX_TOKENS = 256
MAX_TOKENS = 32_768
ALIKE = 0.03  # within 3% of off: off wins (no draft to pull, budget or break)


@dataclass(frozen=True)
class Setting:
    text: str  # as the owner wrote it: off, eagle3:3, ngram
    method: str | None  # None: off
    tokens: int | None  # None: the recipe's num_speculative_tokens (or 4 where the recipe has none)

    def sets(self, recipe_spec: dict[str, Any] | None) -> tuple[str, ...]:
        """The --set values that turn the recipe into this setting: off drops speculative; the recipe's own
        method keeps its draft and options; another method replaces them."""
        if self.method is None:
            return ("speculative=null",)
        if recipe_spec and recipe_spec.get("method") == self.method:
            return (f"speculative.num_speculative_tokens={self.tokens}",) if self.tokens else ()
        value = {"method": self.method, "num_speculative_tokens": self.tokens or 4}
        return ("speculative=" + json.dumps(value, separators=(",", ":")),)


def parse_settings(text: str) -> list[Setting]:
    """`off,eagle3:3,ngram:4` -> settings, `off` first (added when absent: every ratio is to it)."""
    out: list[Setting] = []
    problems = []
    for item in (x.strip() for x in text.split(",")):
        m = SETTING.fullmatch(item)
        if not m:
            problems.append(
                Problem("--speculative", item[:40], "is not off or METHOD[:TOKENS]", "e.g. off,eagle3:3,ngram:4")
            )
            continue
        s = Setting(item, None, None) if m.group(1) else Setting(item, m.group(2), int(m.group(3) or 0) or None)
        if s in out:
            problems.append(Problem("--speculative", item, "is given twice", "list each setting once"))
        out.append(s)
    if problems:
        raise ConfigError(problems)
    offs = [s for s in out if s.method is None]
    return offs[:1] + [s for s in out if s.method is not None] if offs else [Setting("off", None, None), *out]


def load_prompts(path: str | Path) -> list[dict[str, Any]]:
    """The owner's prompts: one chat request a line ({"messages": [...], "max_tokens": N optional}), read through
    the one door; one problem a bad line, naming the file and the line."""
    text = read_text(path, "prompts file", 'give a JSONL file: one {"messages": [...]} a line')
    out, problems = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            data = parse_json(line, where)
        except ConfigError as exc:
            problems += exc.problems
            continue
        messages = data.get("messages") if isinstance(data, dict) else None
        if (
            not isinstance(messages, list)
            or not messages
            or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            problems.append(
                Problem(
                    where,
                    "messages",
                    "is not a list of {role, content}",
                    'write {"messages": [{"role": "user", "content": "..."}]}',
                )
            )
            continue
        max_tokens = data.get("max_tokens", DEFAULT_MAX_TOKENS)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_TOKENS:
            problems.append(Problem(where, "max_tokens", f"must be a whole number from 1 to {MAX_TOKENS}", "fix it"))
            continue
        out.append({"messages": messages, "max_tokens": max_tokens})
    if not out and not problems:
        problems.append(Problem(str(path), "", "holds no prompt", "one chat request a line"))
    if len(out) > MAX_PROMPTS:
        problems.append(Problem(str(path), "", f"holds {len(out)} prompts, more than {MAX_PROMPTS}", "sample them"))
    if problems:
        raise ConfigError(problems)
    return out


# -- one level: the prompts at one concurrency ----------------------------------------------------------------


@dataclass
class RequestResult:
    ttft_s: float | None = None
    tokens: int = 0
    seconds: float = 0.0
    error: str = ""


def stream_chat(endpoint: Endpoint, prompt: dict[str, Any], timeout_s: float) -> RequestResult:
    """One streamed chat completion: when its first token came, how many it wrote (the usage the server reports,
    else the content chunks counted), how long it took."""
    body = {
        "model": endpoint.model,
        "messages": prompt["messages"],
        "max_tokens": prompt["max_tokens"],
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        endpoint.base_url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            **({"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}),
        },
    )
    t0 = time.monotonic()
    out = RequestResult()
    chunks = 0
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            for raw in resp:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                try:
                    data = json.loads(line[5:])
                except ValueError:
                    continue
                for choice in data.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if (
                        delta.get("content")
                        or delta.get("reasoning_content")
                        or delta.get("reasoning")
                        or delta.get("tool_calls")
                    ):
                        chunks += 1
                        if out.ttft_s is None:
                            out.ttft_s = time.monotonic() - t0
                usage = data.get("usage") or {}
                if usage.get("completion_tokens"):
                    out.tokens = int(usage["completion_tokens"])
    except urllib.error.HTTPError as exc:
        out.error = f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        out.error = f"{exc.__class__.__name__}: {getattr(exc, 'reason', exc)}"
    out.seconds = time.monotonic() - t0
    out.tokens = out.tokens or chunks
    return out


@dataclass
class LevelResult:
    concurrency: int
    requests: int
    failed: int
    decode_tps: float  # completion tokens of the level / its wall time
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    wall_s: float
    spec: SpecCounters | None = None
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "failed": self.failed,
            "decode_tps": round(self.decode_tps, 2),
            "ttft_p50_s": self.ttft_p50_s,
            "ttft_p95_s": self.ttft_p95_s,
            "wall_s": round(self.wall_s, 3),
            "speculative": self.spec.as_dict() if self.spec is not None else None,
            "errors": self.errors[:5],
        }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


RequestFn = Callable[[Endpoint, dict[str, Any], float], RequestResult]


def run_level(
    endpoint: Endpoint,
    prompts: list[dict[str, Any]],
    concurrency: int,
    timeout_s: float,
    request: RequestFn = stream_chat,
) -> LevelResult:
    """Every prompt once (cycled up to `concurrency` requests), `concurrency` at a time."""
    todo = [prompts[i % len(prompts)] for i in range(max(len(prompts), concurrency))]
    before = spec_counters(endpoint)
    t0 = time.monotonic()
    results = in_threads(todo, lambda p: request(endpoint, p, timeout_s), max_workers=concurrency)
    wall = time.monotonic() - t0
    after = spec_counters(endpoint)
    good = [r for r in results if not r.error]
    ttfts = [r.ttft_s for r in good if r.ttft_s is not None]
    return LevelResult(
        concurrency=concurrency,
        requests=len(results),
        failed=len(results) - len(good),
        decode_tps=sum(r.tokens for r in good) / wall if wall > 0 else 0.0,
        ttft_p50_s=statistics.median(ttfts) if ttfts else None,
        ttft_p95_s=_quantile(ttfts, 0.95),
        wall_s=wall,
        spec=after.since(before) if after is not None else None,
        errors=sorted({r.error for r in results if r.error}),
    )


# -- the A/B ----------------------------------------------------------------------------------------------------


@dataclass
class Band:
    levels: list[int]
    setting: str
    ratio: float  # its decode tokens/s over off's at these levels (the mean)

    @property
    def text(self) -> str:
        lo, hi = self.levels[0], self.levels[-1]
        return f"c{lo}" if lo == hi else f"c{lo}-c{hi}"


@dataclass
class ABResult:
    recipe: str
    topology: str
    settings: list[Setting]
    levels: list[int]
    rows: dict[str, dict[int, LevelResult]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # setting -> why it could not run
    deploy_s: float = 0.0
    runs_s: float = 0.0
    total_s: float = 0.0
    simulated: bool = False

    @property
    def own_s(self) -> float:
        """The A/B's own time: everything but the deploys (restarts) and the runs."""
        return max(0.0, self.total_s - self.deploy_s - self.runs_s)

    def ratio(self, setting: str, c: int) -> float | None:
        off, row = self.rows.get("off", {}).get(c), self.rows.get(setting, {}).get(c)
        if off is None or row is None or off.decode_tps <= 0:
            return None
        return row.decode_tps / off.decode_tps

    def recommend(self) -> list[Band]:
        """Per level the setting with the most decode tokens/s and no failed request (off unless one beats it by
        more than ALIKE), then consecutive levels with the same winner as one band."""
        bands: list[Band] = []
        for c in self.levels:
            best, best_ratio = "off", 1.0
            for s in self.settings:
                row = self.rows.get(s.text, {}).get(c)
                r = self.ratio(s.text, c)
                if s.method is None or row is None or row.failed or r is None:
                    continue
                if r > max(best_ratio, 1.0 + ALIKE):
                    best, best_ratio = s.text, r
            if bands and bands[-1].setting == best:
                band = bands[-1]
                band.ratio = (band.ratio * len(band.levels) + best_ratio) / (len(band.levels) + 1)
                band.levels.append(c)
            else:
                bands.append(Band([c], best, best_ratio))
        return bands

    def to_json(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "topology": self.topology,
            "simulated": self.simulated,
            "settings": [s.text for s in self.settings],
            "levels": self.levels,
            "results": {
                s: {str(c): {**r.to_json(), "ratio_to_off": self.ratio(s, c)} for c, r in row.items()}
                for s, row in self.rows.items()
            },
            "failed": self.failed,
            "recommendation": [
                {"levels": b.levels, "setting": b.setting, "ratio_to_off": round(b.ratio, 3)} for b in self.recommend()
            ],
            "timing": {
                "total_s": round(self.total_s, 2),
                "deploy_s": round(self.deploy_s, 2),
                "runs_s": round(self.runs_s, 2),
                "own_s": round(self.own_s, 3),
            },
        }


DeployFn = Callable[[Setting], Endpoint]


def run_ab(
    recipe: str,
    topology: str,
    settings: list[Setting],
    levels: list[int],
    prompts: list[dict[str, Any]],
    deploy: DeployFn,
    timeout_s: float = 600.0,
    say: Callable[[str], None] = lambda _m: None,
    request: RequestFn = stream_chat,
) -> ABResult:
    """Each setting deployed in turn, then every level run; a setting that cannot deploy (refused, failed) is
    reported and the others still run."""
    result = ABResult(recipe, topology, settings, levels)
    t_start = time.monotonic()
    for s in settings:
        t0 = time.monotonic()
        try:
            endpoint = deploy(s)
        except (ConfigError, StepFailed) as exc:
            result.deploy_s += time.monotonic() - t0
            result.failed[s.text] = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
            say(f"{s.text}: not run: {result.failed[s.text]}")
            continue
        result.deploy_s += time.monotonic() - t0
        result.simulated = result.simulated or bool(endpoint.metadata.get("simulated"))
        row = result.rows.setdefault(s.text, {})
        for c in levels:
            level = run_level(endpoint, prompts, c, timeout_s, request)
            result.runs_s += level.wall_s
            row[c] = level
            say(f"{s.text} c{c}: {describe_level(level, result.ratio(s.text, c))}")
    result.total_s = time.monotonic() - t_start
    return result


def describe_level(level: LevelResult, ratio: float | None) -> str:
    ttft = f"{level.ttft_p50_s * 1000:.0f} ms" if level.ttft_p50_s is not None else "-"
    parts = [f"decode {level.decode_tps:.1f} t/s", f"TTFT p50 {ttft}"]
    if level.spec is not None:
        parts.append(f"draft {describe_acceptance(level.spec)}")
    if ratio is not None:
        parts.append(f"x{ratio:.2f} of off")
    if level.failed:
        parts.append(f"{level.failed} of {level.requests} failed")
    return ", ".join(parts)


# -- the winner as the recipe's override --------------------------------------------------------------------------


def winner_spec(recipe: str, topology: str, setting: Setting, recipes_dir: str | None = None) -> dict[str, Any] | None:
    """The `speculative:` mapping the setting resolves to (None: off), with the recipe's draft and options."""
    base = resolve(recipe, topology, recipes_dir=recipes_dir).recipe.speculative
    sets = setting.sets(base.model_dump() if base else None)
    spec = resolve(recipe, topology, sets=sets, recipes_dir=recipes_dir).recipe.speculative
    return (
        None
        if spec is None
        else spec.model_dump(exclude_none=True, exclude_defaults=True)
        | {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
    )


def write_recipe(recipe_path: Path, topology: str, spec: dict[str, Any] | None, out_dir: Path, note: str) -> Path:
    """The recipe with `overrides.<topology>.speculative` set to the winner, written to out_dir/<name>.yaml by a
    YAML serializer (the recipe's comments do not survive it: the header says where it came from)."""
    data = read_recipe_data(recipe_path)
    overrides = data.setdefault("overrides", {}) or {}
    data["overrides"] = overrides
    overrides.setdefault(topology, {})
    if not isinstance(overrides[topology], dict):
        raise ConfigError(Problem(str(recipe_path), f"overrides.{topology}", "is not a mapping", "fix the recipe"))
    overrides[topology]["speculative"] = spec
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / recipe_path.name
    if path.resolve() == recipe_path.resolve():
        raise ConfigError(
            Problem(
                "--write-recipe", str(out_dir), "is the recipe's own folder", "give another folder (your --recipes-dir)"
            )
        )
    header = "".join(f"# {line}\n" for line in note.splitlines())
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


# -- what advise says about speculation ----------------------------------------------------------------------------

LOW_CONCURRENCY = 4  # up to here a decode step has spare compute: verifying drafts is nearly free
HIGH_CONCURRENCY = 32  # from here the batch fills the step: drafting and rejected tokens cost


def advice_note(concurrency: int, recipe: str | None, spec: dict[str, Any] | None) -> str:
    """advise's note on speculative decoding at this concurrency: it helps at low concurrency (decode is bound by
    memory bandwidth; the verify step's extra tokens ride on the same weight reads) and can hurt at high (the
    batch already fills each step: drafting and rejected tokens cost); the owner's prompts decide."""
    name = recipe or "RECIPE"
    measure = f"sparkdeploy bench --recipe {name} --prompts FILE --speculative off,{{}} --concurrency {concurrency}"
    if spec:
        setting = f"{spec.get('method')}:{spec.get('num_speculative_tokens')}"
        if concurrency <= LOW_CONCURRENCY:
            verdict = f"at c{concurrency} it should help (a step has spare compute to verify drafts)"
        elif concurrency >= HIGH_CONCURRENCY:
            verdict = (
                f"at c{concurrency} it can hurt (the batch already fills each step: drafts and rejected tokens "
                "cost); --set speculative=null turns it off"
            )
        else:
            verdict = f"at c{concurrency} the gain depends on the acceptance of your traffic"
        return f"{name} decodes speculatively ({setting}): {verdict}; measure it: " + measure.format(setting)
    if concurrency <= LOW_CONCURRENCY:
        return (
            f"at c{concurrency} speculative decoding could speed each user up (docs/speculative.md): try "
            + measure.format("ngram:4")
        )
    return ""
