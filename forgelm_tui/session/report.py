"""The run's envelope as the run goes: provisional at the start of a stop, each attempt's entry,
final at the end (SPEC §6); the verdict from the records (SPEC §5)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.crash import note_crashes
from forgelm_tui.engine.faults import fault_verdict
from forgelm_tui.engine.records import CancelRequest
from forgelm_tui.engine.restart_policy import RestartDecision, backoff, decide_restart
from forgelm_tui.engine.supervisor import Supervisor
from forgelm_tui.envelope import build as env_mod
from forgelm_tui.envelope.write import write_all, write_each
from forgelm_tui.isotime import iso
from forgelm_tui.plan.forgelm import extract_result
from forgelm_tui.plan.planner import Plan
from forgelm_tui.session.attempts import attempt_facts
from forgelm_tui.session.ending import RunEnding
from forgelm_tui.session.outcome import (
    ATTEMPT_FIELDS,
    Agreement,
    Attempt,
    NodeOutcome,
    Restarts,
    RunFrame,
    RunOutcome,
    node_outcome,
)
from forgelm_tui.verdict import (
    LostCause,
    RankEnding,
    StopFacts,
    Verdict,
    decide,
    lost_first,
    prelaunch_failure,
)


class RunReport:
    """Builds and writes the envelope; provisional at the start of a stop, final at the end."""

    def __init__(self, plan: Plan, supervisor: Supervisor) -> None:
        self.plan = plan
        self.supervisor = supervisor  # the attempt under way (one unless --max-restarts)
        self.ending: RunEnding | None = None
        self.attempts: list[Attempt] = []  # the ended attempts (the envelope's ``attempts``)
        self.started_at: float | None = None  # the first attempt's start: the run's
        self.backoff_cancel: CancelRequest | None = None  # a cancel between two attempts
        self.lost_cause: LostCause | None = None  # a node lost before the failure (multi-node)
        self.scheduler: dict[str, Any] | None = None  # why it stopped the job, once settled

    def on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.RunStopping):
            self._write(provisional=True)

    def endings(self) -> list[RankEnding]:
        """How each started rank ended, as the verdict reads it (here and on node 0)."""
        records = self.supervisor.records.values()
        note_crashes(records)  # exit 1: a traceback (a crash) or a deliberate 1
        return [r.ending() for r in records if r.pid is not None]

    def verdict(self) -> Verdict:
        sup = self.supervisor
        if sup.launch_error is not None:
            return prelaunch_failure()
        error = sup.faults.error
        if error is not None and error.ranks_running:
            return fault_verdict(error)  # forgelm-tui itself failed while ranks ran: 2
        stop = sup.stop
        facts = lost_first(StopFacts(stop.kind, stop.signal, stop.origin_rank, stop.lost_node)
                           if stop else None, self.lost_cause)
        endings = self.endings()
        if not endings and stop is not None:  # cancelled before any rank started
            endings = [RankEnding(0, None, stop.signal, 0.0, signalled_first=True)]
        return decide(endings, facts, self.plan.contract, rank0_decides=self.plan.forgelm_mode)

    def _results(self) -> dict[int, dict[str, Any]]:
        if not self.plan.forgelm_mode:
            return {}
        results = {}
        for record in self.supervisor.records.values():
            if record.pid is None:
                continue
            found = extract_result(record.stdout_log)
            if found is not None:
                results[record.rank] = found
        return results

    def node_outcome(self, *, provisional: bool,
                     where: tuple[str | None, int | None, str | None] = (None, None, None),
                     ) -> NodeOutcome:
        """This node's part of the attempt under way, from its records."""
        sup = self.supervisor
        return node_outcome(
            sup.spec.node_rank, sup.records.values(), cancels=sup.cancels,
            cancel_between=self.backoff_cancel, forwards=sup.forwards,
            descendants=sup.descendants.entries(),
            results={} if provisional else self._results(), launch_error=sup.launch_error,
            where=where)

    def outcome(self, *, provisional: bool, agreement: Agreement | None = None) -> RunOutcome:
        """The run's outcome as this node knows it: the attempt under way (the last one),
        with every attempt's entry."""
        sup = self.supervisor
        index = sup.spec.restart_count
        verdict = self._shown_verdict(provisional)
        current = () if len(self.attempts) > index else (
            Attempt(index, self._attempt_fields(verdict, provisional)),)
        return self._outcome(verdict, provisional, RunFrame(
            started_at=self.started_at or sup.started_at,
            ended_at=None if provisional else sup.ended_at,
            error=sup.launch_error, supervisor_error=self._supervisor_error(),
            restarts=Restarts(self.plan.spec.max_restarts, index,
                              (*self.attempts, *current)),
            provisional=provisional, settings=env_mod.settings_entry(self.plan.info)), agreement)

    def build_envelope(self, *, provisional: bool, not_written: Sequence[dict[str, str]] = (),
                       ) -> dict[str, Any]:
        """The run's envelope on this node (its run dir: each attempt's in ``attempts``)."""
        return env_mod.build(self.plan.info, self.outcome(provisional=provisional),
                             run_dir=self.plan.info.run_dir, not_written=not_written)

    def _attempt_fields(self, verdict: Verdict, provisional: bool) -> dict[str, Any]:
        """What the attempt's own envelope says that its entry in ``attempts`` keeps."""
        sup = self.supervisor
        outcome = self._outcome(verdict, provisional, RunFrame(
            started_at=sup.started_at, ended_at=None if provisional else sup.ended_at,
            error=sup.launch_error, supervisor_error=self._supervisor_error(),
            provisional=provisional), None)
        own = env_mod.build(self.plan.info, outcome, run_dir=str(sup.spec.run_dir))
        return {name: own.get(name) for name in ATTEMPT_FIELDS}

    def _outcome(self, verdict: Verdict, provisional: bool, frame: RunFrame,
                 agreement: Agreement | None) -> RunOutcome:
        return RunOutcome(verdict, frame, (self.node_outcome(provisional=provisional),),
                          stop=self.supervisor.stop, scheduler=self.scheduler,
                          agreement=agreement)

    def _shown_verdict(self, provisional: bool) -> Verdict:
        verdict = self.verdict()
        if provisional and self.supervisor.launch_error is None:
            return _provisional_verdict(verdict)
        return verdict

    def _supervisor_error(self) -> dict[str, Any] | None:
        error = self.supervisor.faults.error
        return error.to_dict(iso(error.at)) if error else None

    def close_attempt(self) -> tuple[RestartDecision, float]:
        """The attempt under way ended: its entry in ``attempts``, and whether it restarts
        (engine/restart_policy.py) after how long."""
        sup = self.supervisor
        index = sup.spec.restart_count
        self.started_at = self.started_at or sup.started_at
        verdict = self.verdict()
        facts = attempt_facts(sup, verdict)
        decision = decide_restart(facts, sup.spec.restarts_used, self.plan.spec.max_restarts)
        delay = backoff(self.plan.info.restart_backoff, index + 1) if decision.restart else 0.0
        self.attempts.append(Attempt(index, self._attempt_fields(verdict, provisional=False),
                                     decision, delay if decision.restart else None))
        if decision.restart:  # on disk while it waits: a scheduler's SIGKILL finds it
            self._write(provisional=True)
        return decision, delay

    def no_restart(self, why: str, cancel: CancelRequest | None = None) -> None:
        """The restart the last attempt's entry announced did not happen (a cancel during the
        backoff, an attempt dir that could not be made): the run ends with its verdict."""
        last = self.attempts[-1]
        self.attempts[-1] = replace(last, restart=RestartDecision(False, why))
        self.backoff_cancel = cancel

    def _write(self, *, provisional: bool) -> list[str]:
        return write_all(self.plan.envelope_paths, lambda failed: self.build_envelope(
            provisional=provisional, not_written=failed))

    def final(self) -> RunEnding:
        faults = self.supervisor.faults
        errors_before = faults.count
        envelope, written, errors = self._write_final()
        path = written[0] if written else None
        self.ending = RunEnding(self.verdict(), envelope, path, tuple(errors), tuple(written))
        self.supervisor.emit(ev.VerdictReached(self.ending.verdict, path))
        if faults.count != errors_before:  # a view failed on the verdict: the envelope says so
            envelope, _, errors = self._write_final()
            self.ending = replace(self.ending, envelope=envelope, write_errors=tuple(errors))
        return self.ending

    def _write_final(self) -> tuple[dict[str, Any], list[str], list[str]]:
        return write_each(self.plan.envelope_paths, lambda failed: self.build_envelope(
            provisional=False, not_written=failed))


def _provisional_verdict(verdict: Verdict) -> Verdict:
    """While ranks are still stopping, the envelope says so; codes may still change."""
    return replace(verdict, rule_text=f"provisional (run still stopping): {verdict.rule_text}")
