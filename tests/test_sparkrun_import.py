"""`recipes import` of sparkrun v2 recipes whose runtime is sglang or llama-cpp (issue 38 item 6): the command
template filled from defaults, mapped onto the engine's fields, the rest kept as extra_args and checked by the
engine's own parser; the written recipe renders."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from sparkdeploy.errors import ConfigError
from sparkdeploy.recipes.importing import import_recipe
from tests.test_render import deployment

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sparkrun"


def test_an_sglang_cluster_recipe_becomes_an_sglang_recipe_that_renders(tmp_path):
    out = import_recipe(str(FIXTURES / "qwen3-coder-next-sglang.yaml"), out_dir=str(tmp_path))
    data = yaml.safe_load(Path(out["file"]).read_text())
    assert (data["engine"], data["topologies"], data["cluster_backend"], data["tensor_parallel"]) == (
        "sglang",
        ["cluster"],
        "native",
        2,
    )
    assert data["sglang"] == {
        "context_length": 200000,
        "mem_fraction_static": 0.8,
        "attention_backend": "triton",
        "tool_call_parser": "qwen3_coder",
        "extra_args": ["--fp8-gemm-backend", "cutlass"],
    }
    assert data["env"] == {"NCCL_CUMEM_ENABLE": "0"}  # HF_TOKEN came from sparkrun's machine: not carried
    assert any("HF_TOKEN" in n for n in out["not_carried"]) and any(n.startswith("--tp 2") for n in out["not_carried"])
    dep = deployment("cluster", "native", recipe=out["file"])
    line = next(f.content for nd in dep.nodes for f in nd.files if f.name == "sglang.entry.sh")
    argv = shlex.split(next(x for x in line.splitlines() if x.startswith("exec ")))
    assert argv[argv.index("--tp-size") + 1] == "2" and "--fp8-gemm-backend" in argv


def test_a_llama_cpp_gguf_recipe_needs_its_file_named_and_never_downloads_at_start(tmp_path):
    src = str(FIXTURES / "qwen3-gguf.yaml")
    with pytest.raises(ConfigError) as exc:
        import_recipe(src, out_dir=str(tmp_path))
    assert len(str(exc.value).splitlines()) == 1 and "--set llamacpp.gguf=FILE" in str(exc.value)
    out = import_recipe(src, ["llamacpp.gguf=Qwen3-1.7B-Q8_0.gguf"], out_dir=str(tmp_path))
    data = yaml.safe_load(Path(out["file"]).read_text())
    assert data["model"] == "Qwen/Qwen3-1.7B-GGUF" and data["llamacpp"]["include"] == ["*Q8_0*"]
    assert data["llamacpp"]["extra_args"] == ["--no-webui"]
    dep = deployment("solo", recipe=out["file"])
    line = next(f.content for nd in dep.nodes for f in nd.files if f.name == "llamacpp.entry.sh")
    assert "-hf" not in shlex.split(line.splitlines()[-1]) and "-m Qwen3-1.7B-Q8_0.gguf" in line


def test_an_unknown_sglang_flag_is_refused_naming_the_engine(tmp_path):
    text = (FIXTURES / "qwen3-coder-next-sglang.yaml").read_text().replace("--fp8-gemm-backend cutlass", "--no-such 1")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as exc:
        import_recipe(str(bad), out_dir=str(tmp_path))
    assert "--no-such is not a flag of SGLang 0.5.23" in str(exc.value)
