"""The headless view (``--no-tui``): plain rank-prefixed lines and a final summary.

Nothing here may block the engine: lines go to a writer thread with a bounded buffer, a closed
stdout (``| head``) only stops the printing, and no cursor or colour codes are ever written.
Child text is printed as is (already sanitised by the engine), never through a markup parser.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from forgelm_tui.engine import events as ev
from forgelm_tui.engine.events import RankState
from forgelm_tui.engine.records import RankRecord
from forgelm_tui.signames import signal_name
from forgelm_tui.verdict import Verdict, describe
from forgelm_tui.wording.ending import attempt_text, log_not_kept_text
from forgelm_tui.wording.gpu import GpuStatus, summary_cells

PREFIX = "[forgelm-tui]"
MAX_BUFFER_BYTES = 64 * 1024 * 1024
COUNTDOWN_EVERY = 5  # print the grace countdown every five seconds, and each of the last three
# Beyond this many ranks in the run, and with no --local-ranks-filter, each node prints the
# output of its local rank 0 only: 1,024 ranks' lines interleaved in one job log are read by
# nobody. Every rank's state lines (started, signalled, exited, quiet, stalled) still print,
# and every line is in the rank logs.
ALL_OUTPUT_UP_TO = 64


class OutputSink:
    """Writes text to a file descriptor from a background thread.

    When the reader is slower than the ranks, up to ``max_bytes`` wait in memory; past that,
    whole lines are dropped and a notice says how many (the per-rank log files keep every line).
    """

    def __init__(self, fd: int, max_bytes: int = MAX_BUFFER_BYTES) -> None:
        self.fd = fd
        self.broken = False
        self._max = max_bytes
        self._queue: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._dropped = 0
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="forgelm-tui-output", daemon=True)
        self._thread.start()

    def write(self, text: str, lines: int = 1) -> None:
        data = text.encode("utf-8", "replace")
        with self._cond:
            if self.broken or self._closing:
                return
            if self._size + len(data) > self._max:
                self._dropped += lines
                return
            if self._dropped:
                notice = (
                    f"{PREFIX} {self._dropped} lines not shown here (output too slow); "
                    "the rank log files have every line\n"
                ).encode()
                self._queue.append(notice)
                self._size += len(notice)
                self._dropped = 0
            self._queue.append(data)
            self._size += len(data)
            self._cond.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Flush what is queued, waiting at most ``timeout`` seconds."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue and self._closing:
                    return
                batch = b"".join(self._queue)
                self._queue.clear()
                self._size = 0
            if not self._write(batch):
                with self._cond:
                    self.broken = True
                    self._queue.clear()
                    self._size = 0
                return

    def _write(self, data: bytes) -> bool:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.fd, view)
            except InterruptedError:
                continue
            except OSError:  # EPIPE, EBADF, EIO: the reader is gone; the run goes on
                return False
            view = view[written:]
        return True


class HeadlessView:
    """Turns engine events into plain lines; ``output_ranks``: the local ranks whose output
    lines print (--local-ranks-filter; None: all, up to ALL_OUTPUT_UP_TO ranks in the run)."""

    def __init__(self, sink: OutputSink, output_ranks: frozenset[int] | None = None) -> None:
        self._sink = sink
        self._output_ranks = output_ranks
        self._hidden: set[int] = set()  # ranks whose output lines do not print
        self._filter_told = False
        self._output_age: dict[int, float] = {}
        self._last_countdown: int | None = None
        self._nodes: dict[int, ev.NodeState] = {}
        self._evidence: dict[int, ev.ProgressEvidence | None] = {}
        self._remote: dict[int, RankState] = {}
        self._gpu = GpuStatus()
        self._storage_told = False

    def note(self, message: str) -> None:
        self._sink.write(f"{PREFIX} {message}\n")

    def __call__(self, event: ev.Event) -> None:
        match event:
            case ev.RankOutput(rank=rank, lines=lines) if rank not in self._hidden:
                prefix = f"[rank {rank}] "
                self._sink.write("".join(prefix + line + "\n" for line in lines), len(lines))
            case ev.RunStarted(run_id=run_id, world_size=world, run_dir=run_dir):
                self.note(f"run {run_id}: {world} rank(s); logs in {run_dir}")
                self._filter(world)
            case ev.RankStarted():
                self._started(event)
            case ev.RankExited(rank=rank, exit_code=code, signal=sig):
                self.note(f"rank {rank} {_ending(code, sig)}")
            case ev.RankSignalled(purpose=ev.Purpose.STACKS):
                pass  # the stacks lines follow
            case ev.RankSignalled(rank=rank, signal=sig, purpose=purpose, reason=reason):
                self.note(f"rank {rank} <- {signal_name(sig)} ({purpose.value}: {reason})")
            case ev.RunStopping(reason=reason, grace=grace, live_ranks=live):
                self._last_countdown = None
                if live:
                    self.note(
                        f"stopping: {reason}; SIGTERM sent to rank(s) {_ranks(live)}, "
                        f"SIGKILL in {grace:g} s for any still running"
                    )
                else:
                    self.note(f"stopping: {reason}")
            case ev.StopCountdown(seconds_left=left, live_ranks=live):
                self._countdown(left, live)
            case ev.RankSampled(rank=rank, output_age=age):
                self._output_age[rank] = age
            case ev.RankEvidenceChanged(rank=rank, evidence=evidence):
                self._evidence[rank] = evidence
            case ev.RankStateChanged(rank=rank, state=RankState.QUIET, collective=gap):
                self.note(f"rank {rank} is quiet ({self._quiet_why(rank, gap)})")
            case ev.RunStalled(seconds=seconds, ranks=ranks):
                self.note(f"stalled: no progress from rank(s) {_ranks(ranks)} for {seconds:g} s")
            case ev.RankReportedStop(rank=rank, signal=sig, foreign=True, step=step):
                where = f" (stopped at step {step})" if step is not None else ""
                self.note(f"rank {rank} reported {sig} from outside forgelm-tui{where}: "
                          "the run is not complete, whatever the ranks exit with")
            case ev.SignalForwarded(signal=sig, ranks=ranks):
                self.note(f"{signal_name(sig)} forwarded to rank(s) {_ranks(ranks)}")
            case ev.RunEscalated(reason=reason):
                self.note(f"escalated: {reason}; SIGKILL to every rank still running")
            case ev.GraceExtended(grace=grace, why=why):
                self.note(f"grace now {grace:g} s: {why}")
            case ev.RunNotice(text=text):
                self.note(text)
            case ev.StacksCaptured():
                for line in stacks_lines(event):
                    self.note(line)
            case ev.NodeChanged():
                self._node(event)
            case ev.AttemptStarted(attempt=attempt, reason=reason, backoff=delay) if attempt:
                self.note(f"{attempt_text(event)}: {reason}; "
                          f"starting in {delay:g} s")
            case ev.GpuSampled():
                self._gpu_line(event)
            case ev.LogNotKept() if not self._storage_told:
                self._storage_told = True
                self.note(log_not_kept_text(event))
            case _:
                pass

    def _started(self, event: ev.RankStarted) -> None:
        if self._output_ranks is not None and event.local_rank not in self._output_ranks:
            self._hidden.add(event.rank)
        self.note(f"rank {event.rank} started (pid {event.pid})")

    def _filter(self, world: int) -> None:
        """Say whose output prints, when not every rank's does (once: a restart's attempt
        starts the run again with the same ranks)."""
        if self._filter_told:
            return
        self._filter_told = True
        if self._output_ranks is None and world > ALL_OUTPUT_UP_TO:
            self._output_ranks = frozenset({0})
            why = f"{world} ranks (more than {ALL_OUTPUT_UP_TO})"
        elif self._output_ranks is not None:
            why = "--local-ranks-filter"
        else:
            return
        ranks = ",".join(map(str, sorted(self._output_ranks)))
        self.note(f"output lines of local rank(s) {ranks} only on each node ({why}); every "
                  "rank's state lines print, and its log file has every line")

    def _gpu_line(self, event: ev.GpuSampled) -> None:
        line = self._gpu.line(event)
        if line is not None:
            self.note(line)

    def _quiet_why(self, rank: int, gap: str | None) -> str:
        """What it has not done lately, by the kind of progress that counts for it."""
        if gap == "behind":
            return "its peers wait in a collective it has not entered; no step or heartbeat lately"
        if gap == "waiting":
            return "it waits in a collective a peer has not entered"
        evidence = self._evidence.get(rank)
        if evidence is ev.ProgressEvidence.STEPS:
            return "no new step and no heartbeat lately"
        age = self._output_age.get(rank, 0.0)
        if evidence is ev.ProgressEvidence.OUTPUT:
            return f"no output for {age:.0f} s"
        return f"no output for {age:.0f} s, no CPU use"

    def _node(self, event: ev.NodeChanged) -> None:
        """Another node: a line when it changes state, and when one of its ranks does."""
        node = event.node_rank
        if self._nodes.get(node) is not event.state:
            self._nodes[node] = event.state
            ranks = _ranks(r.rank for r in event.ranks)
            self.note(f"node {node} ({event.host or '?'}): {event.state.value}"
                      + (f", rank(s) {ranks}" if event.ranks else ""))
        for snap in event.ranks:
            if self._remote.get(snap.rank) is snap.state:
                continue
            self._remote[snap.rank] = snap.state
            if snap.state in (RankState.EXITED, RankState.FAILED, RankState.KILLED):
                self.note(f"rank {snap.rank} on node {node} {_ending(snap.exit_code, snap.signal)}")
            elif snap.state is not RankState.STARTING:
                self.note(f"rank {snap.rank} on node {node}: {snap.state.value}")

    def _countdown(self, left: float, live: tuple[int, ...]) -> None:
        whole = round(left)
        if whole == self._last_countdown:
            return
        if whole % COUNTDOWN_EVERY == 0 or whole <= 3:
            self._last_countdown = whole
            self.note(f"waiting for rank(s) {_ranks(live)} to stop: SIGKILL in {whole} s")

    def summary(
        self,
        records: Iterable[RankRecord],
        verdict: Verdict,
        where: str,
        remote: Sequence[dict[str, Any]] = (),
    ) -> None:
        self._sink.write(summary_text(records, verdict, where, remote, self._gpu.index))


def stacks_lines(event: ev.StacksCaptured) -> list[str]:
    """Where each rank was stuck: one line each, its main thread's innermost frame."""
    files = [r.file for r in event.ranks if r.file]
    where = f"; every thread in {os.path.dirname(files[0])}/rank-N.stacks.txt" if files else ""
    lines = [f"stacks of rank(s) {_ranks(r.rank for r in event.ranks)} ({event.reason}, "
             f"{event.seconds:.2f} s){where}"]
    for stacks in event.ranks:
        if stacks.stuck_at is not None:
            lines.append(f"rank {stacks.rank} stuck at {stacks.stuck_at}"
                         + (f" ({stacks.note})" if stacks.note else ""))
        elif stacks.file is not None:
            lines.append(f"rank {stacks.rank}: no Python frame in its main thread "
                         f"(see {stacks.file})")
        else:
            lines.append(f"rank {stacks.rank}: no stacks ({stacks.note})")
    return lines


def after_rank0_lines(verdict: Verdict) -> list[str]:
    """Warnings for the ranks that failed after rank 0's outcome exit (docs/verdict.md)."""
    lines = [f"warning: rank {rank} failed after rank 0 had exited with an outcome code: "
             "collateral (teardown), not a root cause; see its log"
             for rank in verdict.collateral]
    lines += [f"note: rank {rank} failed after rank 0 had exited with an outcome code "
              "(not ForgeLM: still a failure)"
              for rank in verdict.after_rank0_exit if rank not in verdict.collateral]
    return lines


def _ranks(ranks: Iterable[int]) -> str:
    return ",".join(str(r) for r in ranks) or "-"


def _ending(code: int | None, sig: int | None) -> str:
    if sig is not None:
        return f"killed by {signal_name(sig)}"
    assert code is not None
    if code == 1:  # a config error or a crash (a traceback): the verdict tells, once read
        return "exited with 1"
    return f"exited with {code} {describe(code)[0]}"


def _duration(record: RankRecord) -> str:
    if record.started_mono is None:
        return "-"
    end = record.ended_mono if record.ended_mono is not None else time.monotonic()
    return f"{end - record.started_mono:.1f}s"


def _local_row(r: RankRecord) -> tuple[str, ...]:
    sent = r.first_stop
    last = r.signals_sent[-1] if r.signals_sent else None
    return (str(r.rank), str(r.pid or "-"), r.state.value,
            "-" if r.exit_code is None else str(r.exit_code),
            signal_name(r.signal) if r.signal else "-",
            f"{signal_name(last.signal)}: {sent.reason}" if sent and last else "-",
            _step(r), _duration(r))


def _remote_row(rank: dict[str, Any]) -> tuple[str, ...]:
    """A rank of another node, from its entry in the envelope (docs/envelope.md)."""
    stop = next((s for s in rank["signals_sent"] if ev.Purpose(s["purpose"]).stops), None)
    last = rank["signals_sent"][-1] if rank["signals_sent"] else None
    progress = rank.get("progress") or {}
    step = progress.get("step")
    total = progress.get("total")
    duration = rank.get("duration_s")
    return (str(rank["rank"]), str(rank["pid"] or "-"), rank["state"],
            "-" if rank["exit_code"] is None else str(rank["exit_code"]),
            rank["signal"] or "-",
            f"{last['signal']}: {stop['reason']}" if stop and last else "-",
            "-" if step is None else (f"{step}/{total}" if total else str(step)),
            "-" if duration is None else f"{duration:.1f}s")


def _step(record: RankRecord) -> str:
    if record.step is None:
        return "-"
    return f"{record.step}/{record.total}" if record.total else str(record.step)


def summary_text(
    records: Iterable[RankRecord], verdict: Verdict, where: str,
    remote: Sequence[dict[str, Any]] = (), gpu_index: dict[str, int] | None = None,
) -> str:
    """The table every rank ends with; ``remote``: other nodes' ranks from the agreed envelope
    (a multi-node run adds a node column); ``where``: ``; envelope: ...`` (every file written,
    ``RunEnding.where_line``); with GPU samples, each rank's GPUs and peak."""
    header: tuple[str, ...] = ("rank", "pid", "state", "exit", "signal", "sent by supervisor",
                               "step", "time")
    local = sorted(records, key=lambda r: r.rank)
    body = [_local_row(r) for r in local]
    if remote:
        nodes = {r.rank: r.node_rank for r in local}
        nodes.update({d["rank"]: d["node_rank"] for d in remote})
        body = sorted(body + [_remote_row(d) for d in remote], key=lambda row: int(row[0]))
        header = (header[0], "node", *header[1:])
        body = [(row[0], str(nodes[int(row[0])]), *row[1:]) for row in body]
    gpu = summary_cells(local, remote, gpu_index or {})
    if gpu:
        header = (*header, "gpu", "gpu peak")
        body = [(*row, *gpu.get(int(row[0]), ("-", "-"))) for row in body]
    rows: list[tuple[str, ...]] = [header, *body]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    out = [f"{PREFIX} summary", *lines]
    for rank, code in verdict.disagreements:
        out.append(f"{PREFIX} note: rank {rank} exited {code}, unlike rank 0")
    out.extend(f"{PREFIX} {line}" for line in after_rank0_lines(verdict))
    out.append(f"{PREFIX} exit {verdict.code} {verdict.name} ({verdict.rule_text}){where}")
    return "\n".join(out) + "\n"
