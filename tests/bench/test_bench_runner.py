"""The runner with the real llama-benchy 0.4.0 against a minimal local OpenAI-compatible server: offline corpus
and tokenizer, the API key off every command line, one result file with metadata per level."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparkdeploy.bench import benchy as runner
from sparkdeploy.bench.benchy import BenchSettings, Endpoint, corpus_book_url, llama_benchy_cache_dir, run_cell
from sparkdeploy.bench.store import read_result
from sparkdeploy.errors import ConfigError, StepFailed
from tests.bench.bench_fakes import FakeOpenAI

KEY = "sk-SECRETbenchKEY789"


def _cmdlines() -> list[bytes]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes())
            except OSError:
                pass
    return out


@pytest.fixture
def home(tmp_path, monkeypatch):
    """llama-benchy's cache (~/.cache/llama-benchy) in a private HOME."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_one_level_offline_with_the_key_off_the_command_line(tmp_path, bench_data, home):
    tok, corpus = bench_data
    seen = {"child": False, "key_in_cmdline": False}

    def on_progress(done, total):
        for cmd in _cmdlines():
            if b"sparkdeploy.bench._benchy_main" in cmd:
                seen["child"] = True
            if KEY.encode() in cmd:
                seen["key_in_cmdline"] = True

    with FakeOpenAI(api_key=KEY, token_delay_s=0.02) as srv:
        ep = Endpoint(
            srv.base_url,
            "test/model",
            KEY,
            {
                "recipe": "r1",
                "topology": "cluster",
                "backend": "ray",
                "image_id": "sha256:" + "cd" * 32,
                "vllm_version": "0.32.0",
                "nodes": [{"name": "spark1"}, {"name": "spark2"}],
            },
        )
        settings = BenchSettings(pp=64, tg=16, runs=2, tokenizer=tok, corpus=corpus)
        result = run_cell(ep, settings, 2, tmp_path / "out", on_progress=on_progress)
        assert set(srv.auth_seen) == {f"Bearer {KEY}"}  # llama-benchy did send it
    assert seen["child"] and not seen["key_in_cmdline"]
    path = tmp_path / "out" / "r1__cluster__pp64-tg16__c2.json"
    assert result.path == path and path.is_file()
    stored = read_result(path)
    assert stored.metrics["decode_tps"].mean > 0 and len(stored.metrics["ttft_ms"].values) == 4  # 2 runs x 2
    md = stored.metadata
    assert md["recipe"] == "r1" and md["topology"] == "cluster" and md["backend"] == "ray"
    assert md["image_id"].startswith("sha256:") and md["vllm_version"] == "0.32.0" and len(md["nodes"]) == 2
    assert md["date"] and md["llama_benchy_version"] == "0.4.0" and md["runs"] == 2 and md["failed_requests"] == 0
    assert stored.llama_benchy["version"] == "0.4.0"  # llama-benchy's own report, unchanged
    text = path.read_text() + Path(md["log"]).read_text()
    assert KEY not in text and "--api-key" not in json.dumps(md["llama_benchy_args"])
    log = Path(md["log"]).read_text()
    assert "Loading text from cache" in log and "Downloading" not in log  # the local corpus, no network
    assert not list((tmp_path / "out" / ".work").iterdir())  # temp files removed


def test_corpus_url_names_the_content(tmp_path, home):
    c = tmp_path / "c.txt"
    c.write_text("one two three")
    url1 = corpus_book_url(c)
    cached = list(llama_benchy_cache_dir().iterdir())
    assert len(cached) == 1 and cached[0].read_text() == "one two three"
    c.write_text("four five six")
    url2 = corpus_book_url(c)
    assert url1 != url2 and url2.startswith("file://")
    assert corpus_book_url(c) == url2


def test_a_wrong_key_fails_the_step_with_the_reason(tmp_path, bench_data, home):
    tok, corpus = bench_data
    with FakeOpenAI(api_key=KEY) as srv:
        ep = Endpoint(srv.base_url, "test/model", "sk-wrong", {"recipe": "r1", "topology": "solo"})
        with pytest.raises(StepFailed) as exc:
            run_cell(ep, BenchSettings(pp=32, tg=4, runs=1, tokenizer=tok, corpus=corpus), 1, tmp_path / "out")
    assert "HTTP 401" in str(exc.value) and "sk-wrong" not in str(exc.value)
    assert not (tmp_path / "out" / "r1__solo__pp32-tg4__c1.json").exists()


def test_a_missing_tokenizer_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARKDEPLOY_BENCH_TOKENIZER", raising=False)
    with pytest.raises(ConfigError) as exc:
        runner.find_tokenizer(tmp_path / "nope")
    assert "tokenizer.json" in str(exc.value)
    d = tmp_path / "tok"
    d.mkdir()
    (d / "tokenizer.json").write_text("{}")
    assert runner.find_tokenizer(d) == (d / "tokenizer.json").resolve()


def test_bench_cli_with_endpoint_and_key_from_env(tmp_path, bench_data, home, cli, monkeypatch):
    tok, corpus = bench_data
    monkeypatch.setenv("SPARKDEPLOY_API_KEY", KEY)
    with FakeOpenAI(api_key=KEY) as srv:
        code, out, err = cli(
            "bench",
            "--endpoint",
            srv.base_url,
            "--model",
            "test/model",
            "--recipe",
            "r2",
            "--topology",
            "solo",
            "--pp",
            "32",
            "--tg",
            "8",
            "--concurrency",
            "1,2",
            "--runs",
            "1",
            "--tokenizer",
            str(tok),
            "--corpus",
            str(corpus),
            "--out",
            str(tmp_path / "o"),
            "--json",
        )
    assert code == 0, err
    data = json.loads(out)
    assert [r["concurrency"] for r in data["results"]] == [1, 2]
    assert (tmp_path / "o" / "r2__solo__pp32-tg8__c1.json").is_file()
    assert (tmp_path / "o" / "r2__solo__pp32-tg8__c2.json").is_file()
    code, out, err = cli(
        "bench", "--endpoint", "http://127.0.0.1:9/v1", "--tokenizer", str(tok), "--corpus", str(corpus)
    )
    assert code == 2 and "--model" in err
    code, out, err = cli("bench", "--pp", "5", "report", str(tmp_path / "o"))
    assert code == 2 and "go after `report`" in err
