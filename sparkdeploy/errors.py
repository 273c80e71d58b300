"""User-facing errors.

A `ConfigError` carries one `Problem` per line of output: the file, the field, what is wrong and how to fix
it. The CLI prints them without a traceback and exits 2. A validator raises `Invalid` (or `Invalids`: several),
its fix a field too; config/schema.py turns each into a Problem. A `StepFailed` is a check or step that ran and
failed (exit 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from difflib import get_close_matches

# C0 controls (newline, ESC, CR, ...), DEL and the C1 controls (0x9b is a CSI on some terminals).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_controls(text: str) -> str:
    """`text` as one terminal line: every control character written as an escape (\\n, \\x1b), so a value
    from a file or a node can neither add a line to the output nor move the cursor or change colours."""
    return _CONTROL.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def has_controls(text: str) -> bool:
    """Whether `text` holds a control character (what escape_controls escapes): a value that must be one line."""
    return _CONTROL.search(text) is not None


@dataclass(frozen=True)
class Problem:
    file: str
    field: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        """One line: every part's control characters escaped (a value quoted in a message cannot forge a line)."""
        where = f"{self.file}: {self.field}" if self.field else self.file
        text = f"{where}: {self.message}"
        return escape_controls(f"{text} (fix: {self.fix})" if self.fix else text)


class Invalid(ValueError):
    """A validator's refusal (pydantic validators raise it as their ValueError): what is wrong and its fix as
    fields, never one string to split again. config/schema.py makes each a Problem of the file being read;
    `field`: the field it names, for a check over a whole model (Invalid.at), "" for the field validated."""

    def __init__(self, message: str, fix: str = "", field: str = ""):
        self.message = message
        self.fix = fix
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)

    @classmethod
    def at(cls, field: str, message: str, fix: str = "") -> Invalid:
        return cls(message, fix, field)


class Invalids(ValueError):
    """Several refusals at once (a model-level validator): one Problem each."""

    def __init__(self, problems: list[Invalid]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class SparkdeployError(Exception):
    """Base class for errors the CLI reports without a traceback."""

    exit_code = 1


class ConfigError(SparkdeployError):
    """Bad usage or configuration: one or more problems, each reported on its own line."""

    exit_code = 2

    def __init__(self, problems: list[Problem] | Problem):
        self.problems = [problems] if isinstance(problems, Problem) else list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class StepFailed(SparkdeployError):
    """A step or check ran and failed."""

    exit_code = 1


class NothingDeployed(StepFailed):
    """A command that watches or measures a deployment found none: the same line and exit code (1) in every
    command (top, logs, bench); `status` reports the same state and exits 0."""

    def __init__(self, where: str, fix: str = "run `sparkdeploy up` first"):
        super().__init__(f"nothing of sparkdeploy's runs on {where}: {fix}")


def no_such(kind: str, name: str, known: list[str]) -> ConfigError:
    """A name that is not among the known ones: one line with the closest names, or all of them."""
    close = get_close_matches(name, known, n=3)
    return ConfigError(
        Problem(kind, name, "not found", f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(known)}")
    )
