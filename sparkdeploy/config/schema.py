"""Turn pydantic validation errors into one-line problems that name the file, the field and the fix.

An unknown key gets a "did you mean" from the fields the schema knows at that place.
"""

from __future__ import annotations

import typing
from difflib import get_close_matches

from pydantic import AllowInfNan, BaseModel, Strict, ValidationError

from sparkdeploy.errors import Invalid, Invalids, Problem

# A count, size or port: a whole number as written. pydantic's lax mode would take `true` as 1, 4.0 as 4 and "12" as
# 12; strict refuses them, and the problem says what to write.
Whole = typing.Annotated[int, Strict()]
# A fraction or a number of seconds/GB: an int is fine, `true`, "0.7", nan and inf are not.
Number = typing.Annotated[float, Strict(), AllowInfNan(False)]


def dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
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


# The fix for each kind of pydantic error: every problem says what to write, like the project's own checks.
_FIXES = {
    "int_type": "give a whole number without quotes or a decimal point, e.g. 4096",
    "int_parsing": "give a whole number without quotes or a decimal point, e.g. 4096",
    "int_from_float": "give a whole number without quotes or a decimal point, e.g. 4096",
    "float_type": "give a number without quotes, e.g. 0.7",
    "float_parsing": "give a number without quotes, e.g. 0.7",
    "finite_number": "give a finite number, e.g. 600",
    "bool_type": "give true or false",
    "bool_parsing": "give true or false",
    "string_type": 'give text; quote it if YAML would read it as a number or true/false, e.g. "1.0"',
    "list_type": "give a list, e.g. [a, b]",
    "dict_type": "give a mapping (key: value)",
    "model_type": "give a mapping (key: value)",
    "model_attributes_type": "give a mapping (key: value)",
    "literal_error": "use one of {expected}",
    "enum": "use one of {expected}",
    "greater_than": "give a value above {gt}",
    "greater_than_equal": "give {ge} or more",
    "less_than": "give a value below {lt}",
    "less_than_equal": "give at most {le}",
    "too_short": "give at least {min_length} item(s)",
    "too_long": "give at most {max_length} item(s)",
    "string_too_short": "give at least {min_length} character(s)",
    "string_too_long": "shorten it to at most {max_length} characters",
}
GENERIC_FIX = "check the value against the format in the README (Inventory format, Recipes)"
SHOWN_MAX = 60  # characters of a refused value quoted back (the rest is elided)


def fix_for(kind: str, ctx: dict[str, typing.Any] | None) -> str:
    """The fix for a pydantic error of this kind (its ctx fills in bounds and choices)."""
    template = _FIXES.get(kind)
    if template is None:
        return GENERIC_FIX
    try:
        return template.format(**(ctx or {}))
    except (KeyError, IndexError):
        return GENERIC_FIX


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_MAX else text[: SHOWN_MAX - 3] + "..."


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
        elif invalid := _invalid((err.get("ctx") or {}).get("error")):
            # a validator's refusal: its message and fix are fields (errors.Invalid); a model-level one names its field
            for one in invalid:
                text = one.message if not one.field or not loc else f"{one.field}: {one.message}"
                where = one.field if one.field and not loc else field
                problems.append(Problem(file, where, text, one.fix or fix_for(kind, err.get("ctx"))))
        else:
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            if kind in ("model_type", "model_attributes_type"):  # not "... or instance of VllmSettings"
                msg = "Input should be a mapping"
            shown = err.get("input")
            if kind != "value_error" and not isinstance(shown, (dict, list)):
                msg = f"{msg} (got {_shown(shown)})"
            problems.append(Problem(file, field, msg, fix_for(kind, err.get("ctx"))))
    return problems


def _invalid(error: object) -> list[Invalid]:
    """The refusals a validator raised (errors.Invalid, Invalids); [] for any other error."""
    if isinstance(error, Invalids):
        return error.problems
    return [error] if isinstance(error, Invalid) else []
