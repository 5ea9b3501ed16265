"""The run's envelope as the run goes: provisional at the start of a stop, each attempt's entry,
final at the end (SPEC §6); the verdict from the records (SPEC §5)."""

from __future__ import annotations

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
from forgelm_tui.session.attempts import attempt_entry, attempt_facts
from forgelm_tui.session.ending import RunEnding
from forgelm_tui.signames import signal_name
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
        self.attempts: list[dict[str, Any]] = []  # the envelope's entries of ended attempts
        self.started_at: float | None = None  # the first attempt's start: the run's
        self.backoff_cancel: CancelRequest | None = None  # a cancel between two attempts
        self.lost_cause: LostCause | None = None  # a node lost before the failure (multi-node)

    def on_event(self, event: ev.Event) -> None:
        if isinstance(event, ev.RunStopping):
            self._write(self.build_envelope(provisional=True))

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
        note_crashes(sup.records.values())  # exit 1: a traceback (a crash) or a deliberate 1
        endings = [r.ending() for r in sup.records.values() if r.pid is not None]
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

    def build_envelope(self, *, provisional: bool,
                       agreement: dict[str, Any] | None = None) -> dict[str, Any]:
        """The envelope: the attempt under way (the last one), with every attempt's entry."""
        sup = self.supervisor
        index = sup.spec.restart_count
        verdict = self._shown_verdict(provisional)
        current = [] if len(self.attempts) > index else [
            attempt_entry(index, self._attempt_envelope(verdict, provisional), None, None)]
        cancelled = None if self.backoff_cancel is None else backoff_cancelled(
            self.backoff_cancel)
        return self._envelope(verdict, provisional, env_mod.RunFrame(
            started_at=self.started_at or sup.started_at,
            ended_at=None if provisional else sup.ended_at,
            run_dir=self.plan.info.run_dir,  # the run's; each attempt's in attempts
            error=sup.launch_error, cancelled_between=cancelled,
            supervisor_error=self._supervisor_error(),
            restarts=env_mod.Restarts(self.plan.spec.max_restarts, index,
                                      (*self.attempts, *current)),
            agreement=agreement))

    def _attempt_envelope(self, verdict: Verdict, provisional: bool) -> dict[str, Any]:
        """The attempt's own envelope (what its entry in ``attempts`` keeps)."""
        sup = self.supervisor
        return self._envelope(verdict, provisional, env_mod.RunFrame(
            started_at=sup.started_at, ended_at=None if provisional else sup.ended_at,
            run_dir=str(sup.spec.run_dir),  # an attempt's own files (attempt-K/)
            error=sup.launch_error, supervisor_error=self._supervisor_error()))

    def _shown_verdict(self, provisional: bool) -> Verdict:
        verdict = self.verdict()
        if provisional and self.supervisor.launch_error is None:
            return _provisional_verdict(verdict)
        return verdict

    def _supervisor_error(self) -> dict[str, Any] | None:
        error = self.supervisor.faults.error
        return error.to_dict(iso(error.at)) if error else None

    def _envelope(self, verdict: Verdict, provisional: bool,
                  frame: env_mod.RunFrame) -> dict[str, Any]:
        sup = self.supervisor
        return env_mod.build(
            self.plan.info,
            verdict,
            sup.records.values(),
            frame=frame,
            stop=sup.stop,
            cancels=sup.cancels,
            forwards=sup.forwards,
            descendants=sup.descendants.entries(),
            results={} if provisional else self._results(),
            provisional=provisional,
        )

    def close_attempt(self) -> tuple[RestartDecision, float]:
        """The attempt under way ended: its entry in ``attempts``, and whether it restarts
        (engine/restart_policy.py) after how long."""
        sup = self.supervisor
        index = sup.spec.restart_count
        self.started_at = self.started_at or sup.started_at
        verdict = self.verdict()
        facts = attempt_facts(sup, verdict)
        decision = decide_restart(facts, index, self.plan.spec.max_restarts)
        delay = backoff(self.plan.info.restart_backoff, index + 1) if decision.restart else 0.0
        entry = attempt_entry(index, self._attempt_envelope(verdict, provisional=False),
                              decision, delay if decision.restart else None)
        self.attempts.append(entry)
        if decision.restart:  # on disk while it waits: a scheduler's SIGKILL finds it
            self._write(self.build_envelope(provisional=True))
        return decision, delay

    def no_restart(self, why: str, cancel: CancelRequest | None = None) -> None:
        """The restart the last attempt's entry announced did not happen (a cancel during the
        backoff, an attempt dir that could not be made): the run ends with its verdict."""
        last = self.attempts[-1]
        self.attempts[-1] = {**last, "restart": {**last["restart"], "restarted": False,
                                                 "why": why}}
        self.backoff_cancel = cancel

    def _write(self, envelope: dict[str, Any]) -> list[str]:
        return write_all(self.plan.envelope_paths, envelope)

    def final(self) -> RunEnding:
        faults = self.supervisor.faults
        errors_before = faults.count
        envelope = self.build_envelope(provisional=False)
        envelope, written, errors = write_each(self.plan.envelope_paths, envelope)
        path = written[0] if written else None
        self.ending = RunEnding(self.verdict(), envelope, path, tuple(errors), tuple(written))
        self.supervisor.emit(ev.VerdictReached(self.ending.verdict, path))
        if faults.count != errors_before:  # a view failed on the verdict: the envelope says so
            envelope, _, errors = write_each(self.plan.envelope_paths,
                                                     self.build_envelope(provisional=False))
            self.ending = replace(self.ending, envelope=envelope, write_errors=tuple(errors))
        return self.ending


def backoff_cancelled(cancel: CancelRequest) -> dict[str, Any]:
    """The envelope's ``cancelled`` for a cancel between two attempts (no rank was running)."""
    return {"by": cancel.origin, "signal": signal_name(cancel.signal), "at": iso(cancel.at),
            "requests": 1, "source": cancel.source.value}


def _provisional_verdict(verdict: Verdict) -> Verdict:
    """While ranks are still stopping, the envelope says so; codes may still change."""
    return replace(verdict, rule_text=f"provisional (run still stopping): {verdict.rule_text}")
