"""History and rollback without the lab: the record file, `history`, and bad input (the lab test runs up A, up B,
rollback to A, and a rollback whose image is gone: tests/deploy/test_history_lab.py)."""

from __future__ import annotations

import json

import pytest

from sparkdeploy.deploy import history
from sparkdeploy.errors import ConfigError, StepFailed


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKDEPLOY_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


def _write(records):
    path = history.history_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "{cut line\n")


def _rec(i, **kw):
    return dict(
        {
            "id": i,
            "time": f"2026-11-25T16:0{i}:00+00:00",
            "recipe": "r",
            "recipe_hash": f"{i:064x}",
            "recipe_text": "name: r\n",
            "sets": [],
            "topology": "solo",
            "backend": None,
            "image": "vllm-sim",
            "image_tag": "sparkdeploy/vllm-sim:0123",
            "image_id": "sha256:" + "ab" * 32,
            "nodes": ["spark1"],
        },
        **kw,
    )


def test_records_read_back_in_order_and_a_cut_line_is_skipped(state):
    _write([_rec(1), _rec(2), _rec(3)])
    assert [r["id"] for r in history.read_records()] == [1, 2, 3]
    assert history.find(None)["id"] == 2  # no ID: the one before the newest
    assert history.find("1")["id"] == 1


def test_history_lists_newest_first(cli, state):
    _write([_rec(1), _rec(2, sets=["vllm.max_num_seqs=64"])])
    code, out, err = cli("history", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [r["id"] for r in data] == [2, 1] and "recipe_text" not in data[0]
    code, out, err = cli("history")
    assert code == 0 and "--set" in out and out.index("16:02") < out.index("16:01")


def test_an_unknown_id_is_exit_2_and_nothing_to_roll_back_is_exit_1(cli, state):
    _write([_rec(1)])
    with pytest.raises(ConfigError):
        history.find("7")
    code, _out, err = cli("rollback", "7")
    assert code == 2 and "no deployment '7' in the history" in err and "one of 1" in err
    with pytest.raises(StepFailed):
        history.find(None)
    code, _out, err = cli("rollback")
    assert code == 1 and "nothing to roll back to" in err and "Traceback" not in err


def test_the_recipe_hash_covers_the_text_and_the_sets():
    a = history.recipe_hash("name: r\n", [])
    assert a != history.recipe_hash("name: r\n", ["vllm.max_num_seqs=64"]) and a != history.recipe_hash("name: s\n", [])
    assert a == history.recipe_hash("name: r\n", [])
