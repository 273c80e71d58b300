"""Turn pydantic validation errors into one-line problems that name the file, the field and the fix.

An unknown key gets a "did you mean" from the fields the schema knows at that place.
"""

from __future__ import annotations

import typing
from difflib import get_close_matches

from pydantic import BaseModel, ValidationError

from sparkdeploy.errors import Problem


def dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model class that owns the last element of `loc` (for listing its known fields)."""
    current: typing.Any = model
    for part in loc[:-1]:
        current = _unwrap(current)
        if isinstance(part, int) or current is None:
            continue
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(part)
            current = field.annotation if field else None
        else:
            current = None  # inside a free-form dict
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(tp: typing.Any) -> typing.Any:
    """Optional[X], list[X], dict[str, X] -> X (the model we look for)."""
    for _ in range(4):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        origin = typing.get_origin(tp)
        if origin is None or not args:
            return tp
        tp = args[-1] if origin is dict else args[0]
    return tp


def known_keys(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items() if name != "directory" and not f.exclude]


def problems_from_validation(exc: ValidationError, file: str, model: type[BaseModel]) -> list[Problem]:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        field = dotted(loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            owner = _model_at(model, loc)
            keys = known_keys(owner) if owner else []
            close = get_close_matches(str(loc[-1]), keys, n=1, cutoff=0.5)
            fix = f"did you mean {close[0]!r}?" if close else f"known keys here: {', '.join(keys)}"
            problems.append(Problem(file, field, "unknown key", fix))
        elif kind == "missing":
            problems.append(Problem(file, field, "is required", "add it"))
        else:
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            shown = err.get("input")
            # A model-level validator may report several problems, one per line, as "field: message | fix: ..."
            for line in msg.split("\n"):
                text, _, fix = line.partition(" | fix: ")
                where = field
                if not loc:
                    head, sep, rest = text.partition(": ")
                    if sep and " " not in head:
                        where, text = head, rest
                if kind != "value_error" and not isinstance(shown, (dict, list)):
                    text = f"{text} (got {shown!r})"
                problems.append(Problem(file, where, text, fix))
    return problems
