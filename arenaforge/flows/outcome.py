"""What a synthesis run produced and why it refused the rest: the exit rule and the report, in one place.

Every synthesis flow (ingest, graph, sft, envs) ends with `finish(...)`: it logs the run's top
rejection reasons (the UI's log pane shows them) and raises when the run produced nothing and
there is a reason to give:

    NothingProduced      (exit 2)  every input was refused (a missing path, a malformed tool file, ...)
    InfrastructureFailed (exit 3)  refused because what the run depends on failed: the model endpoint
                                   unreachable/overloaded/refusing, the sandbox or an MCP server down
                                   (`is_infrastructure`: the rejections' FailureKind)

The CLI prints the same table (`show_rejections`) after its JSON counts, or before the one-line error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arenaforge.schemas.errors import FailureKind, InputError, RunFailed
from arenaforge.warehouse import Warehouse
from arenaforge.warehouse.reports import ReasonCount, rejection_reasons

TOP_REASONS = 5


def is_infrastructure(reason: ReasonCount) -> bool:
    """True when what the records depended on (endpoint, sandbox, MCP server) failed, not the records."""
    return FailureKind(reason.kind).environment_failure


def _label(r: ReasonCount) -> str:
    """stage/reason, with the failure kind when it is not the data's own (quality) failure."""
    return f"{r.stage}/{r.reason}" + ("" if FailureKind(r.kind) is FailureKind.QUALITY else f" ({r.kind})")


@dataclass
class Outcome:
    flow: str
    run_id: str
    produced: int  # rows of the thing the flow exists to make
    what: str  # its name, plural ("tools", "environments")
    reasons: list[ReasonCount] = field(default_factory=list)  # the top TOP_REASONS groups
    rejections: int = 0  # all of the run's rejections

    def lines(self) -> list[str]:
        """The report as plain lines (for flow logs): one per reason group, with its first example."""
        if not self.rejections:
            return []
        out = [f"{self.flow}: {self.rejections} rejected; top reasons:"]
        for r in self.reasons:
            out.append(f"  {r.count} x {_label(r)}: {r.subject}: {r.detail}")
        return out


class NothingProduced(InputError):
    """A run produced nothing; every input was refused (the report says why)."""

    exit_code = 2

    def __init__(self, message: str, outcome: Outcome) -> None:
        super().__init__(message)
        self.outcome = outcome


class InfrastructureFailed(RunFailed):
    """A run produced nothing because the endpoint, sandbox or another service it needs failed."""

    exit_code = 3

    def __init__(self, message: str, outcome: Outcome) -> None:
        super().__init__(message)
        self.outcome = outcome


def outcome(flow: str, wh: Warehouse, run_id: str, produced: int, what: str) -> Outcome:
    reasons, total = rejection_reasons(wh, run_id, TOP_REASONS)
    return Outcome(flow, run_id, produced, what, reasons, total)


def check(o: Outcome) -> None:
    """Raise when nothing was produced and rejections say why (infrastructure first)."""
    if o.produced or not o.rejections:
        return
    infra = [r for r in o.reasons if is_infrastructure(r)]
    if infra:
        first = infra[0]
        raise InfrastructureFailed(
            f"{o.flow}: no {o.what}: {sum(r.count for r in infra)} of {o.rejections} rejections are failures of what "
            f"it depends on ({_label(first)}: {first.detail})", o)
    first = o.reasons[0]
    raise NothingProduced(f"{o.flow}: no {o.what}: all {o.rejections} inputs refused; most often "
                          f"{first.stage}/{first.reason} ({first.subject}: {first.detail})", o)


def finish(flow: str, wh: Warehouse, run_id: str, produced: int, what: str) -> Outcome:
    """Log the run's top rejection reasons to the flow's log, then apply the exit rule (`check`)."""
    from prefect.logging import get_run_logger

    o = outcome(flow, wh, run_id, produced, what)
    if o.rejections:
        get_run_logger().warning("\n".join(o.lines()))
    check(o)
    return o


def show_rejections(wh: Warehouse, run_id: str, flow: str) -> None:
    """The CLI's table of a run's top rejection reasons (full text, wrapped, at any width)."""
    from arenaforge.flows.display import console, print_rows

    reasons, total = rejection_reasons(wh, run_id, TOP_REASONS)
    if not total:
        return
    rows = [(r.count, _label(r), f"{r.subject}: {r.detail}") for r in reasons]
    print_rows(["n", "reason", "first example"], rows, title=f"{flow}: {total} rejected, top reasons", full=True)
    console.print(f"all: arenaforge db show rejections --run {run_id}", markup=False, highlight=False,
                  soft_wrap=True)


def run_and_report(flow: str, wh: Warehouse, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """CLI shell of a synthesis flow: its counts as JSON, then its top rejection reasons; when it produced
    nothing, the reasons first, then the one-line error (raised on to `arenaforge.flows.cli`)."""
    import json

    from arenaforge.flows.display import console

    try:
        counts = run()
    except (NothingProduced, InfrastructureFailed) as err:
        show_rejections(wh, err.outcome.run_id, flow)
        raise
    console.print(json.dumps(counts, indent=2), markup=False, highlight=False, soft_wrap=True)
    if counts.get("run_id"):
        show_rejections(wh, counts["run_id"], flow)
    return counts
