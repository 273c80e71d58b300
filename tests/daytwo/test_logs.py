"""sparkdeploy.daytwo.logs: parsing the node script's output, merging nodes by time, masking secrets in print."""

from __future__ import annotations

import subprocess

from sparkdeploy.cli.logs_cmd import Printer
from sparkdeploy.config.secrets import Secrets
from sparkdeploy.daytwo import logs

SPARK1 = """@@sparkdeploy-logs@@ sparkdeploy-litellm
@@sparkdeploy-logs@@ sparkdeploy-vllm
sparkdeploy-litellm 2026-11-23T09:00:00.5Z INFO proxy up
sparkdeploy-vllm 2026-11-23T09:00:00.123456789Z INFO engine up
sparkdeploy-vllm 2026-11-23T09:00:02Z INFO token hf_CANARYtoken
"""
SPARK2 = """@@sparkdeploy-logs@@ sparkdeploy-vllm
sparkdeploy-vllm 2026-11-23T09:00:01.000000001Z INFO worker up
sparkdeploy-vllm Error response from daemon: something
"""


def test_parse_and_merge_by_time():
    a, shown_a = logs.parse("spark1", SPARK1)
    b, shown_b = logs.parse("spark2", SPARK2)
    assert shown_a == ["sparkdeploy-litellm", "sparkdeploy-vllm"] and shown_b == ["sparkdeploy-vllm"]
    merged = logs.merge([a, b])
    assert [(line.node, line.text) for line in merged] == [
        ("spark2", "Error response from daemon: something"),  # no timestamp: first, kept whole
        ("spark1", "INFO engine up"),
        ("spark1", "INFO proxy up"),
        ("spark2", "INFO worker up"),
        ("spark1", "INFO token hf_CANARYtoken"),
    ]
    assert merged[1].short_time() == "09:00:00.123"


def test_printer_masks_secrets_and_colours_only_on_request(capsys):
    secrets = Secrets({"HF_TOKEN": "hf_CANARYtoken", "LITELLM_MASTER_KEY": "sk-CANARY"})
    lines, _ = logs.parse("spark1", SPARK1 + "sparkdeploy-vllm 2026-11-23T09:00:03Z key=sk-CANARY\n")
    plain = Printer(secrets.mask, timestamps=True, colour=False)
    for line in lines:
        plain.line(line)
    plain.line(logs.Notice("spark2", "lost (sk-CANARY)"))
    out = capsys.readouterr()
    assert "hf_CANARYtoken" not in out.out + out.err and "sk-CANARY" not in out.out + out.err
    assert "09:00:02.000 spark1/vllm | INFO token ********" in out.out
    assert "\x1b[" not in out.out
    assert "== spark2: lost (********)" in out.err
    coloured = Printer(secrets.mask, timestamps=False, colour=True)
    coloured.line(lines[0])
    assert "\x1b[" in capsys.readouterr().out


def test_script_is_valid_bash():
    subprocess.run(["bash", "-n", "-c", logs.SCRIPT], check=True)
