"""`sparkdeploy up | down | status`: deploying over SSH (not built yet: see the deploy issue)."""

from __future__ import annotations

from sparkdeploy.errors import ConfigError, Problem


def deploy(**kwargs) -> None:
    raise ConfigError(Problem("run-recipe", "", "deploying is not available yet in this version",
                              "use --dry-run to see what it would write and run"))
