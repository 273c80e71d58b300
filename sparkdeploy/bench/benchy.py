"""One benchmark cell: llama-benchy (pinned 0.4.0, from PyPI, its method unchanged) against an OpenAI-compatible
endpoint at one concurrency level, stored as one result file with its metadata.

Offline by construction:
- the tokenizer is a local `tokenizer.json` (or a folder holding one), which llama-benchy loads with
  `tokenizers.Tokenizer.from_file`; the child also gets HF_HUB_OFFLINE=1 / TRANSFORMERS_OFFLINE=1;
- the prompt corpus is a local text file. llama-benchy 0.4.0 reads `--book-url` with `requests.get` (no file://
  support) unless `~/.cache/llama-benchy/<md5(url)>.txt` exists, which it reads instead (corpus.py,
  TokenizedCorpus._load_data). We give it a `file://PATH?sha256=...` URL and place the file's text at that cache
  path first: llama-benchy's own code reads it, nothing is downloaded, and a changed file gets a new URL.
- the API key (the proxy master key) never reaches a command line: see `_benchy_main`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from sparkdeploy import __version__, paths
from sparkdeploy.bench.store import BenchResult, Stat, metrics_from_llama_benchy, save_result, variant_of
from sparkdeploy.daytwo.top import parse_metrics
from sparkdeploy.errors import ConfigError, Problem, StepFailed
from sparkdeploy.recipes.engines.registered import metric_names
from sparkdeploy.recipes.speculative import SpecCounters, read_counters
from sparkdeploy.simulated import is_simulated

LLAMA_BENCHY_VERSION = "0.4.0"
MASK = "********"

ProgressFn = Callable[[int, int], None]  # (requests finished, requests expected)


@dataclass
class Endpoint:
    base_url: str  # OpenAI base URL, ending in /v1
    model: str  # the name clients ask for
    api_key: str | None = field(default=None, repr=False)
    metadata: dict[str, Any] = field(default_factory=dict)  # recipe, topology, backend, routing, image, ...

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"

    @property
    def recipe(self) -> str:
        return str(self.metadata.get("recipe") or self.model.replace("/", "-"))

    @property
    def variant(self) -> str:
        return variant_of(str(self.metadata.get("topology") or "unknown"), self.metadata.get("routing"))


@dataclass
class BenchSettings:
    pp: int = 1024
    tg: int = 128
    runs: int = 3
    tokenizer: Path | None = None
    corpus: Path | None = None
    skip_coherence: bool = False
    latency_mode: str = "api"
    timeout_s: float = 1800.0  # one concurrency level, warmup included


# ---------------------------------------------------------------- local tokenizer and corpus


def sim_data_dir() -> Path:
    """The simulator's offline data (tokenizer and prompt corpus), owned by images/vllm-sim."""
    return paths.data_dir("images") / "vllm-sim" / "vllm_sim" / "data"


def find_tokenizer(given: str | os.PathLike[str] | None) -> Path:
    candidates = [Path(given).expanduser()] if given else []
    if not given and os.environ.get("SPARKDEPLOY_BENCH_TOKENIZER"):
        candidates.append(Path(os.environ["SPARKDEPLOY_BENCH_TOKENIZER"]).expanduser())
    if not candidates:
        data = sim_data_dir()
        candidates += [data / "tokenizer.json", *sorted(data.glob("**/tokenizer.json"))]
    for c in candidates:
        if c.is_file():
            return c.resolve()
        if c.is_dir() and (c / "tokenizer.json").is_file():
            return (c / "tokenizer.json").resolve()
    where = str(candidates[0]) if candidates else str(sim_data_dir())
    raise ConfigError(
        Problem(
            "--tokenizer",
            where,
            "no local tokenizer.json there (llama-benchy would download one from Hugging Face)",
            "pass --tokenizer PATH to a tokenizer.json or a folder holding one, or set SPARKDEPLOY_BENCH_TOKENIZER",
        )
    )


def find_corpus(given: str | os.PathLike[str] | None) -> Path:
    candidates = [Path(given).expanduser()] if given else []
    if not given and os.environ.get("SPARKDEPLOY_BENCH_CORPUS"):
        candidates.append(Path(os.environ["SPARKDEPLOY_BENCH_CORPUS"]).expanduser())
    if not candidates:
        data = sim_data_dir()
        candidates += sorted(p for p in data.glob("**/*.txt") if p.is_file())
    for c in candidates:
        if c.is_file() and c.stat().st_size > 0:
            return c.resolve()
    where = str(candidates[0]) if candidates else str(sim_data_dir())
    raise ConfigError(
        Problem(
            "--corpus",
            where,
            "no local prompt corpus (a text file) there: llama-benchy would download its default book",
            "pass --corpus PATH to a UTF-8 text file, or set SPARKDEPLOY_BENCH_CORPUS",
        )
    )


def llama_benchy_cache_dir() -> Path:
    # what llama-benchy 0.4.0 computes: os.path.join(os.path.expanduser("~"), ".cache", "llama-benchy")
    return Path(os.path.expanduser("~")) / ".cache" / "llama-benchy"


def corpus_book_url(corpus: Path) -> str:
    """Place the corpus where llama-benchy looks before downloading; return the --book-url that names it."""
    data = corpus.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    url = f"file://{urllib.parse.quote(str(corpus.resolve()))}?sha256={digest}"
    cache = llama_benchy_cache_dir() / (hashlib.md5(url.encode()).hexdigest() + ".txt")
    text = data.decode("utf-8", errors="replace")
    if not cache.is_file() or cache.read_text(encoding="utf-8", errors="replace") != text:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, cache)
    return url


def installed_llama_benchy() -> str:
    try:
        version = metadata.version("llama-benchy")
    except metadata.PackageNotFoundError:
        raise ConfigError(
            Problem(
                "llama-benchy", "", "is not installed", "bash scripts/setup.sh (the test set carries the bench tools)"
            )
        ) from None
    if version != LLAMA_BENCHY_VERSION:
        raise ConfigError(
            Problem(
                "llama-benchy",
                version,
                f"sparkdeploy is pinned to {LLAMA_BENCHY_VERSION} "
                "(its offline corpus handling depends on that version)",
                "bash scripts/setup.sh (the test set carries the bench tools)",
            )
        )
    return version


# ---------------------------------------------------------------- one run of llama-benchy


def llama_benchy_args(
    endpoint: Endpoint,
    settings: BenchSettings,
    concurrency: int,
    book_url: str,
    tokenizer: Path,
    raw_path: Path,
    progress_path: Path,
) -> list[str]:
    """llama-benchy's flags for one cell; the API key is not among them."""
    args = [
        "--base-url",
        endpoint.base_url,
        "--model",
        endpoint.model,
        "--served-model-name",
        endpoint.model,
        "--tokenizer",
        str(tokenizer),
        "--book-url",
        book_url,
        "--pp",
        str(settings.pp),
        "--tg",
        str(settings.tg),
        "--concurrency",
        str(concurrency),
        "--runs",
        str(settings.runs),
        "--latency-mode",
        settings.latency_mode,
        "--save-result",
        str(raw_path),
        "--format",
        "json",
        "--emit-progress",
        str(progress_path),
    ]
    if skips_coherence(endpoint, settings):
        args.append("--skip-coherence")
    return args


def skips_coherence(endpoint: Endpoint, settings: BenchSettings) -> bool:
    """llama-benchy's coherence check asks for the capital of France: a simulated engine (vllm-sim) writes
    placeholder text, so the check is skipped there (and recorded as skipped)."""
    return settings.skip_coherence or is_simulated(endpoint.metadata)


class _ProgressTail:
    """Counts request_end events in llama-benchy's --emit-progress JSONL as it grows."""

    def __init__(self, path: Path):
        self.path, self.offset, self.buf = path, 0, b""
        self.done = self.failed = 0
        self.errors: list[str] = []

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        self.offset += len(chunk)
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            if b'"request_end"' not in line:
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("type") != "request_end":
                continue
            self.done += 1
            if event.get("error"):
                self.failed += 1
                if len(self.errors) < 3:
                    self.errors.append(str(event["error"])[:200])


# How llama-benchy is stopped, and how long each signal may take: after its timeout, SIGINT first (it saves partial
# results and exits); when the run itself was stopped (Ctrl-C, SIGTERM), nothing of it is kept, and the run must
# end within a second (sparkdeploy/runtime/interrupts.py): SIGTERM, then SIGKILL.
STOP_LADDER = ((signal.SIGINT, 5.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0))
STOP_LADDER_STOPPED = ((signal.SIGTERM, 0.3), (signal.SIGKILL, 5.0))


def _stop(proc: subprocess.Popen[bytes], ladder: tuple[tuple[signal.Signals, float], ...] = STOP_LADDER) -> None:
    """Stop llama-benchy and anything it started (its own session), one signal of the ladder after another."""
    for sig, wait in ladder:
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def spec_counters(endpoint: Endpoint, timeout: float = 3.0) -> SpecCounters | None:
    """The engine's speculative-decoding counters from its /metrics (beside /v1), None where it reports none: an
    engine without speculation, or a proxy (LiteLLM's /metrics has no vLLM counters)."""
    req = urllib.request.Request(endpoint.base_url.removesuffix("/v1") + "/metrics")
    if endpoint.api_key:  # the endpoint's own key (a proxy guards /metrics with it; vLLM's is open)
        req.add_header("Authorization", f"Bearer {endpoint.api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            m = parse_metrics(resp.read().decode(errors="replace"))
        names = metric_names(set(m))  # the engine's own names: SGLang reports acceptance as gauges
        return read_counters(m, names.spec_accept_rate, names.spec_accept_length)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _mask(text: str, secret: str | None) -> str:
    return text.replace(secret, MASK) if secret else text


def run_cell(
    endpoint: Endpoint,
    settings: BenchSettings,
    concurrency: int,
    out_dir: Path,
    on_progress: ProgressFn | None = None,
    extra_metadata: dict[str, Any] | None = None,
) -> BenchResult:
    """Run llama-benchy for one concurrency level and store the result in out_dir; return it."""
    version = installed_llama_benchy()
    tokenizer = find_tokenizer(settings.tokenizer)
    corpus = find_corpus(settings.corpus)
    book_url = corpus_book_url(corpus)
    out_dir = Path(out_dir)
    work = out_dir / ".work"
    logs = out_dir / "logs"
    work.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    stem = f"{endpoint.recipe}__{endpoint.variant}__pp{settings.pp}-tg{settings.tg}__c{concurrency}".replace("/", "_")
    raw_path, progress_path, log_path = work / f"{stem}.raw.json", work / f"{stem}.progress.jsonl", logs / f"{stem}.log"
    for p in (raw_path, progress_path):
        p.unlink(missing_ok=True)
    args = llama_benchy_args(endpoint, settings, concurrency, book_url, tokenizer, raw_path, progress_path)
    spec_before = spec_counters(endpoint)
    started = datetime.now(UTC)
    t0 = time.monotonic()
    tail = _ProgressTail(progress_path)
    returncode = _run_llama_benchy(args, endpoint, settings, concurrency, log_path, tail, on_progress, t0)
    raw, metrics = _read_cell(endpoint, settings, concurrency, returncode, raw_path, log_path, tail)
    spec_after = spec_counters(endpoint)
    md = dict(endpoint.metadata)
    md.update(extra_metadata or {})
    if spec_after is not None:  # the draft's acceptance over this cell's requests (vllm:spec_decode_* counters)
        md["speculative"] = spec_after.since(spec_before).as_dict()
    md.update(
        {
            "recipe": endpoint.recipe,
            "model": endpoint.model,
            "variant": endpoint.variant,
            "endpoint": endpoint.base_url,
            "date": started.isoformat(timespec="seconds"),
            "duration_s": round(time.monotonic() - t0, 1),
            "runs": settings.runs,
            "pp": settings.pp,
            "tg": settings.tg,
            "concurrency": concurrency,
            "requests": tail.done,
            "failed_requests": tail.failed,
            "request_errors": tail.errors,
            "llama_benchy_version": version,
            "llama_benchy_args": args,
            "tokenizer": str(tokenizer),
            "coherence_checked": not skips_coherence(endpoint, settings),
            "corpus": {"path": str(corpus), "sha256": hashlib.sha256(corpus.read_bytes()).hexdigest()},
            "log": str(log_path),
        }
    )

    md["sparkdeploy_version"] = __version__
    result = BenchResult(
        recipe=endpoint.recipe,
        variant=endpoint.variant,
        pp=settings.pp,
        tg=settings.tg,
        concurrency=concurrency,
        metrics=metrics,
        metadata=md,
        llama_benchy=raw,
    )
    save_result(result, out_dir)
    raw_path.unlink(missing_ok=True)
    progress_path.unlink(missing_ok=True)
    return result


def _child_env(endpoint: Endpoint) -> dict[str, str]:
    """llama-benchy's environment: offline hub, unbuffered output, no proxy for the endpoint."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    host = urllib.parse.urlparse(endpoint.base_url).hostname or ""
    for name in ("NO_PROXY", "no_proxy"):  # aiohttp honours HTTP(S)_PROXY (trust_env=True): not for our endpoint
        env[name] = ",".join(x for x in (env.get(name, ""), host) if x)
    return env


def _run_llama_benchy(
    args: list[str],
    endpoint: Endpoint,
    settings: BenchSettings,
    concurrency: int,
    log_path: Path,
    tail: _ProgressTail,
    on_progress: ProgressFn | None,
    t0: float,
) -> int:
    """llama-benchy as a child (its own session, the API key on stdin, output to log_path), followed to its
    end with progress from `tail`; stopped past the timeout or on any exception (an interrupt: at once).
    Returns its exit code."""
    expected = concurrency * settings.runs
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sparkdeploy.bench._benchy_main", *args],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_child_env(endpoint),
            start_new_session=True,
        )
        assert proc.stdin is not None, "stdin=PIPE"
        try:
            proc.stdin.write(((endpoint.api_key or "") + "\n").encode())
            proc.stdin.close()
            while True:
                try:
                    proc.wait(1.0)
                    break
                except subprocess.TimeoutExpired:
                    pass
                tail.poll()
                if on_progress:
                    on_progress(tail.done, expected)
                if time.monotonic() - t0 > settings.timeout_s:
                    _stop(proc)
                    raise StepFailed(
                        f"llama-benchy at c{concurrency} on {endpoint.base_url} took more than "
                        f"{settings.timeout_s:.0f}s: stopped (log: {log_path})"
                    )
        except BaseException as exc:
            _stop(proc, STOP_LADDER_STOPPED if isinstance(exc, KeyboardInterrupt) else STOP_LADDER)
            raise
    tail.poll()
    if on_progress:
        on_progress(tail.done, expected)
    return proc.returncode


def _read_cell(
    endpoint: Endpoint,
    settings: BenchSettings,
    concurrency: int,
    returncode: int,
    raw_path: Path,
    log_path: Path,
    tail: _ProgressTail,
) -> tuple[dict[str, Any], dict[str, Stat]]:
    """The finished run's report and metrics (the log masked first); StepFailed naming the log when it failed."""
    log_text = _mask(log_path.read_text(errors="replace"), endpoint.api_key)
    log_path.write_text(log_text)
    if returncode != 0 or not raw_path.is_file():
        last = " | ".join(line.strip() for line in log_text.strip().splitlines()[-4:])
        raise StepFailed(f"llama-benchy failed at c{concurrency} (exit {returncode}): {last} (log: {log_path})")
    raw: dict[str, Any] = json.loads(raw_path.read_text())
    try:
        metrics = metrics_from_llama_benchy(raw, settings.pp, settings.tg, concurrency)
    except ValueError as exc:
        raise StepFailed(f"{exc} (log: {log_path})") from None
    if not metrics or (tail.done and tail.failed == tail.done):
        raise StepFailed(
            f"every request failed at c{concurrency}: {'; '.join(tail.errors) or 'no tokens'} (log: {log_path})"
        )
    return raw, metrics


def run_levels(
    endpoint: Endpoint,
    settings: BenchSettings,
    levels: list[int],
    out_dir: Path,
    on_cell: Callable[[int, BenchResult], None] | None = None,
    on_progress: Callable[[int, int, int], None] | None = None,
) -> list[BenchResult]:
    """Every concurrency level in turn, one result file each."""
    results = []
    for c in levels:
        r = run_cell(
            endpoint,
            settings,
            c,
            out_dir,
            on_progress=functools.partial(on_progress, c) if on_progress else None,
        )
        results.append(r)
        if on_cell:
            on_cell(c, r)
    return results
