"""The README's day-zero commands ("From two new Sparks"), as it prints them: for the docs test and the bare
lab's test that runs them."""

from __future__ import annotations

import re

from tests.conftest import REPO

README_HOSTS = ["192.168.1.101", "192.168.1.102"]  # the example hosts the README's init names


def dayzero_commands_in_readme(hosts: list[str] | None = None) -> list[str]:
    """The commands of the README's "From two new Sparks" block, comments stripped; with `hosts`, the README's
    example hosts replaced by these."""
    text = (REPO / "README.md").read_text()
    section = text.split("## From two new Sparks", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "README: no bash block under 'From two new Sparks'"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]
    if hosts is not None:
        commands = [c.replace(",".join(README_HOSTS), ",".join(hosts)) for c in commands]
    return commands
