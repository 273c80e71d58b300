"""Fed to mypy by tests/test_check_context.py (never imported): a preflight check must not need a session."""

from __future__ import annotations

from sparkdeploy.checks import Check, Result, ok
from sparkdeploy.config.inventory import Node
from sparkdeploy.doctor.check_context import CheckContext, SessionContext
from sparkdeploy.doctor.registry import preflight_check


def from_facts(run: CheckContext, node: Node) -> Result:
    return ok(str(run.node_facts(node).docker_ok))


def asks_the_node(run: CheckContext, node: Node) -> Result:
    return ok(run.session(node).run(["true"]).stdout)  # ERROR: a preflight context has no session


def declares_a_session(run: SessionContext, node: Node) -> Result:
    return ok(run.session(node).run(["true"]).stdout)


FINE = preflight_check("x.facts", "from the facts", from_facts, preflight="facts")
DOCTOR_ONLY = Check("x.session", "doctor's, with a session", declares_a_session)
REFUSED = preflight_check("x.session", "needs a session", declares_a_session, preflight="session")  # ERROR
