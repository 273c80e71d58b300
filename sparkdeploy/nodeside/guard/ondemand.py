"""On-demand stack members (issue 40, docs/stack.md): the two decisions the node-side activator makes, pure and
standard library only (the guard's container runs them): which idle members stop, and what a start must stop
first to fit the one memory budget.

A member, as the activator knows it (from its manifest, written by `up --stack`, and the gateway's demand):
    {"name": str, "on_demand": bool, "shares": {node: fraction of the node's total its engine reserves},
     "last_request": epoch seconds or None, "in_flight": int, "idle_timeout": seconds or None}
`room`: node -> the most the shares of the engines running there may sum to (the one budget's shared_room,
computed by `up --stack` on this machine and recorded in the manifest: the formula lives in one place,
sparkdeploy/recipes/budget.py).

Rules: never stop an always-on member, never one with requests in flight; stop the least recently used idle
on-demand member(s) first, only those holding memory on a node that lacks it; when only on-demand members busy now
(requests in flight, or held for their own start) hold the memory still lacking, wait for them to finish (the held
request waits, up to its hold); when nothing can make room, refuse with the reason and the figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from collections.abc import Iterable
    from typing import TypedDict

    class Member(TypedDict, total=False):
        """A member as the activator knows it (the module's docstring)."""

        name: str
        on_demand: bool
        shares: dict[str, float]
        last_request: float | None
        in_flight: int
        idle_timeout: float | None
        starting: bool  # not running here yet, but its held requests start it (its room is taken: activate.py)


EPSILON = 1e-9


def idle_due(member: Member, now: float) -> bool:
    """Whether a running on-demand member has been idle for its timeout with nothing in flight."""
    timeout = member.get("idle_timeout")
    if not member.get("on_demand") or timeout is None or member.get("in_flight"):
        return False
    last = member.get("last_request")
    return last is not None and now - last >= timeout


def _used(running: Iterable[Member], node: str) -> float:
    return sum(m["shares"].get(node, 0.0) for m in running)


def _why_kept(m: Member) -> str:
    if not m.get("on_demand"):
        return "always on"
    if m.get("starting"):
        return f"starting for {m.get('in_flight')} held request(s)"
    if m.get("in_flight"):
        return f"{m['in_flight']} request(s) in flight"
    return "idle"


def _figures(want: Member, running: Iterable[Member], room: dict[str, float], node: str) -> str:
    """`spark1: room 0.94, running chat 0.45 (always on), coder 0.45 (idle); small needs 0.45`."""
    listed = ", ".join(f"{m['name']} {m['shares'][node]:g} ({_why_kept(m)})" for m in running if node in m["shares"])
    return f"{node}: room {room[node]:g}, running {listed or 'nothing'}; {want['name']} needs {want['shares'][node]:g}"


class NoRoom(Exception):
    """Nothing can make room: the reason, with the figures of each node that lacks memory."""


class NotYet(Exception):
    """Room only once on-demand members busy now are idle (never evicted with requests in flight or held): the
    reason, with the figures; `busy`, their names. A moment's state (a request answered a few milliseconds before
    the gateway's count of it is written), so the start waits rather than refuses."""

    def __init__(self, why: str, busy: list[str]) -> None:
        super().__init__(why)
        self.busy = busy


def make_room(want: Member, running: list[Member], room: dict[str, float]) -> tuple[list[Member], str]:
    """The members to stop, least recently used first, so that `want` fits on each of its nodes beside what
    stays; (stop, figures). NotYet when that needs on-demand members busy now stopped too (nothing is stopped
    meanwhile); NoRoom when stopping every on-demand member on those nodes is not enough."""
    running = [m for m in running if m["name"] != want["name"]]
    short = {
        n: _used(running, n) + share - room[n] for n, share in want["shares"].items() if n in room
    }  # > 0: what is missing there
    if all(v <= EPSILON for v in short.values()):
        return [], "; ".join(_figures(want, running, room, n) for n in sorted(short)) + ": fits"
    candidates = sorted(
        (m for m in running if m.get("on_demand") and not m.get("in_flight")),
        key=lambda m: (m.get("last_request") or 0.0, m["name"]),
    )
    stop = []
    for m in candidates:
        if all(v <= EPSILON for v in short.values()):
            break
        if not any(short.get(n, 0.0) > EPSILON and share > 0 for n, share in m["shares"].items()):
            continue  # it holds no memory where memory is missing: stopping it would not help
        stop.append(m)
        for n, share in m["shares"].items():
            if n in short:
                short[n] -= share
    lacking = sorted(n for n, v in short.items() if v > EPSILON)
    if lacking:
        busy = [m for m in running if m.get("on_demand") and m.get("in_flight")]
        after = dict(short)
        for m in busy:
            for n, share in m["shares"].items():
                if n in after:
                    after[n] -= share
        figures = "; ".join(_figures(want, running, room, n) for n in lacking)
        if all(after[n] <= EPSILON for n in lacking):
            holding = sorted(m["name"] for m in busy if any(m["shares"].get(n, 0.0) > 0 for n in lacking))
            raise NotYet(
                f"{want['name']} waits for {', '.join(holding)} to go idle (never stopped while busy): {figures}",
                holding,
            )
        raise NoRoom(f"{want['name']} does not fit even with every idle on-demand member stopped: {figures}")
    names = ", ".join(m["name"] for m in stop)
    return stop, f"stop {names} (least recently used first) to start {want['name']}: " + "; ".join(
        _figures(want, running, room, n) for n in sorted(want["shares"]) if n in room
    )
