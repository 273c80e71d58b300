"""CI's lab suite split in two (tests/support/lab_shards.py, scripts/test.sh): balanced by the modules' seconds,
deterministic, every lab module in exactly one shard, a module not in the figures placed in the lighter shard, and
the second shard's lab (instance, subnets, its four-node lab's subnets, state, throw-away labs' subnets) apart from
the first's."""

from __future__ import annotations

import ipaddress
import random
import re
from pathlib import Path

import pytest

from sparkdeploy.errors import ConfigError
from sparkdeploy.lab import network
from sparkdeploy.lab.spec import INSTANCE_ENV, SIDE_OCTETS_ENV, SUBNETS_ENV, LabSpec, side_octets
from tests.support import lab_shards
from tests.support.lab_shards import Shard, load_figures, pytest_args, shard_env, split

REPO = Path(__file__).resolve().parent.parent
LAB_MARK = re.compile(r"pytest\.mark\.lab\b")


def lab_modules() -> set[str]:
    """Every test module with a test marked `lab` (the marker, on the module or on a test)."""
    return {
        str(p.relative_to(REPO))
        for p in (REPO / "tests").rglob("test_*.py")
        if LAB_MARK.search(p.read_text(encoding="utf-8"))
    }


def coverage(shards: list[Shard], modules: set[str]) -> dict[str, list[int]]:
    """module -> the shards (0-based) that run it, read off the pytest arguments each shard gets."""
    runs: dict[str, list[int]] = {m: [] for m in modules}
    for i in range(len(shards)):
        args = pytest_args(shards, i)
        if args[:1] == ["tests"]:
            ignored = {a.removeprefix("--ignore=") for a in args[1:]}
            chosen = {m for m in modules if m not in ignored}
        else:
            chosen = set(args) & modules
        for m in chosen:
            runs[m].append(i)
    return runs


def test_the_figures_name_lab_modules_and_split_them_evenly():
    figures = load_figures()
    assert figures and set(figures) <= lab_modules(), set(figures) - lab_modules()
    shards = split(figures)
    total = sum(figures.values())
    assert abs(shards[0].seconds - shards[1].seconds) <= 0.05 * total, shards
    assert abs(shards[0].seconds - shards[1].seconds) <= max(figures.values())
    assert sum(s.seconds for s in shards) == pytest.approx(total, abs=0.5)
    assert sorted(m for s in shards for m in s.modules) == sorted(figures)


def test_every_lab_module_runs_in_exactly_one_shard():
    modules = lab_modules()
    shards = split(load_figures())
    assert [s.rest for s in shards].count(True) == 1
    assert {m: ran for m, ran in coverage(shards, modules).items() if len(ran) != 1} == {}


def test_the_split_is_deterministic_whatever_the_figures_order():
    figures = load_figures()
    items = list(figures.items())
    random.Random(7).shuffle(items)
    assert split(dict(items)) == split(figures)
    tie = {"tests/b_lab.py": 10.0, "tests/a_lab.py": 10.0, "tests/c_lab.py": 10.0}
    pair = Shard(["tests/a_lab.py", "tests/c_lab.py"], 20.0, False)
    assert split(tie) == [pair, Shard(["tests/b_lab.py"], 10.0, True)]


def test_a_module_not_in_the_figures_runs_in_the_lighter_shard_only():
    figures = {"tests/x/test_big_lab.py": 300.0, "tests/x/test_mid_lab.py": 200.0, "tests/x/test_small_lab.py": 50.0}
    shards = split(figures)
    lighter = min(range(2), key=lambda i: shards[i].seconds)
    assert shards[lighter].rest and shards[lighter].seconds == 250.0
    new = "tests/y/test_new_lab.py"
    runs = coverage(shards, {*figures, new})
    assert runs[new] == [lighter]
    assert all(len(ran) == 1 for ran in runs.values()), runs


def test_one_shard_runs_everything():
    shards = split({"tests/a_lab.py": 5.0, "tests/b_lab.py": 7.0}, 1)
    assert shards == [Shard(["tests/a_lab.py", "tests/b_lab.py"], 12.0, True)]
    with pytest.raises(ValueError):
        split({}, 0)


def lab4(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> list[ipaddress.IPv4Network]:
    """The subnets of the default lab and of its four-node lab (tests/multinode/conftest.py) under `env`."""
    from tests.multinode.conftest import lab4_subnets

    for name in (INSTANCE_ENV, SUBNETS_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = LabSpec()
    return [ipaddress.IPv4Network(s) for s in (spec.mgmt_subnet, spec.fabric_subnet, *lab4_subnets())]


@pytest.mark.parametrize(
    "caller",
    [
        {},  # CI: the default lab `lab`, its state in the XDG state folder
        {INSTANCE_ENV: "ci6", SUBNETS_ENV: "172.30.210.0/24,172.30.211.0/24", "SPARKDEPLOY_STATE": "/work/state/ci6"},
    ],
)
def test_the_second_shard_gets_a_lab_of_its_own(caller, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.delenv("SPARKDEPLOY_STATE", raising=False)  # a developer's own (shard_env falls back to paths)
    first, second = (shard_env(i, 2, caller) for i in range(2))
    for key in (INSTANCE_ENV, SUBNETS_ENV, "SPARKDEPLOY_STATE"):
        assert first.get(key) == caller.get(key)  # shard 1 is the caller's own lab: CI's kept `lab`
    assert second[INSTANCE_ENV] == (f"{caller[INSTANCE_ENV]}-b" if caller else "b")
    state = caller.get("SPARKDEPLOY_STATE", str(tmp_path / "sparkdeploy"))
    assert second["SPARKDEPLOY_STATE"] == f"{state}-b"
    keep = {k: v for k, v in first.items() if k in (INSTANCE_ENV, SUBNETS_ENV)}
    ones = lab4(keep, monkeypatch)
    twos = lab4({k: second[k] for k in (INSTANCE_ENV, SUBNETS_ENV)}, monkeypatch)
    assert not [(a, b) for a in ones for b in twos if a.overlaps(b)], (ones, twos)
    assert len({*ones, *twos}) == 8
    if not caller:
        assert [str(n) for n in twos] == [f"172.30.{x}.0/24" for x in (81, 82, 83, 84)]
    # the throw-away labs' free subnets: disjoint ranges, inside the default one
    ranges = []
    for env in (first, second):
        monkeypatch.setenv(SIDE_OCTETS_ENV, env[SIDE_OCTETS_ENV])
        ranges.append(set(side_octets()))
    assert not ranges[0] & ranges[1] and ranges[0] | ranges[1] == set(range(100, 250))
    assert SIDE_OCTETS_ENV not in shard_env(0, 1, caller)


class _NoNetworks:
    class networks:  # the docker SDK's attribute
        @staticmethod
        def list() -> list[object]:
            return []


def test_free_subnets_keep_to_the_side_range(monkeypatch):
    monkeypatch.setenv(SIDE_OCTETS_ENV, "175-249")
    assert network.free_subnets(_NoNetworks()) == ["172.30.175.0/24", "172.30.176.0/24"]
    monkeypatch.delenv(SIDE_OCTETS_ENV)
    assert network.free_subnets(_NoNetworks()) == ["172.30.100.0/24", "172.30.101.0/24"]
    for bad in ("175", "90-120", "200-150", "a-b"):
        monkeypatch.setenv(SIDE_OCTETS_ENV, bad)
        with pytest.raises(ConfigError) as err:
            side_octets()
        assert SIDE_OCTETS_ENV in str(err.value) and "100 to 249" in str(err.value)


def test_show_and_bad_use(capsys):
    assert lab_shards.main(["show"]) == 0
    out = capsys.readouterr().out
    assert out.count("shard ") == 2 and "(+ modules not in the figures)" in out
    assert lab_shards.main(["run", "3", "2"]) == 2
    assert lab_shards.main(["nonsense"]) == 2
    assert "usage:" in capsys.readouterr().err
