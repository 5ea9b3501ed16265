"""The verdict: the true code, why, what CI should do, and where the envelope is.

Drawn from the envelope alone (``show_verdict(envelope, envelope_path)``). The summary (code
and name, meaning, CI action, the deciding rule, the root cause's exception line, the envelope
path) is docked at the top of the panel and always shows; the details (a cancel, disagreements,
the traceback, kills, staging paths) scroll under it, with the mouse or the keys once focused.
Everything from a rank (traceback, stderr, paths) is untrusted text: sanitised, never markup.
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from forgelm_tui.engine import hang
from forgelm_tui.engine.sanitize import sanitize_line
from forgelm_tui.engine.stack_text import short_frame
from forgelm_tui.envelope.storage import not_kept_line

CODE_STYLES = {0: "bold green", 3: "bold yellow", 4: "bold cyan", 5: "bold", 6: "bold red"}
TAIL_LINES = 40  # the envelope keeps 20 of stderr; an error file may hold more
# The line that names the exception: unindented, a (dotted) name ending like an exception's.
EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Fault|Failure)\b")


def approval_hints(result: dict[str, Any] | None) -> list[str]:
    """Where ForgeLM staged the model and the command that promotes it after review.

    ForgeLM 0.11.1 stages to ``<output_dir>/final_model.staging.<run_id>`` and promotes with
    ``forgelm approve <run_id> --output-dir <output_dir>``.
    """
    if not result or not result.get("awaiting_approval"):
        return []
    staging = result.get("staging_path") or result.get("final_model_path")
    run_id = result.get("run_id")
    hints = []
    if staging:
        hints.append(f"staged at: {staging}")
    if run_id and staging:
        output_dir = PurePath(str(staging)).parent
        hints.append(f"to approve: forgelm approve {run_id} --output-dir {output_dir}")
    return hints


def _lines(value: Any) -> list[str]:
    """Untrusted text (a string or a list of lines) as sanitised lines."""
    if not value:
        return []
    raw = str(value).splitlines() if isinstance(value, str) else [str(v) for v in value]
    return [sanitize_line(line) for line in raw]


def _tail(rank: dict[str, Any]) -> list[str]:
    """The rank's traceback from its error file, else its stderr tail."""
    error = rank.get("error") or {}
    return _lines(error.get("traceback")) or _lines(rank.get("stderr_tail"))


def exception_line(rank: dict[str, Any]) -> str:
    """The line that says what went wrong: the last exception line of the traceback (or of
    the error file's message, or of the stderr tail), else the last line there is."""
    crash = rank.get("exception")
    if crash:  # the uncaught exception it died of (engine/crash.py)
        return sanitize_line(f"{crash['type']}: {crash['message']}".rstrip(": "))
    error = rank.get("error") or {}
    sources = [_lines(error.get("traceback")), _lines(error.get("message")),
               _lines(rank.get("stderr_tail"))]
    for lines in sources:
        for line in reversed(lines):
            if EXCEPTION.match(line):
                return line
    return next((ln.strip() for lines in sources for ln in reversed(lines) if ln.strip()), "")


def _line(label: str, text: str, style: str = "") -> Text:
    """A summary line: one line, an ellipsis if it is too long (the details have it all)."""
    return Text.assemble((label, "bold"), (text, style), no_wrap=True, overflow="ellipsis")


def verdict_summary(envelope: dict[str, Any], envelope_path: str | None) -> Group:
    code = int(envelope["exit_code"])
    decided = envelope["decided_by"]
    parts = [
        Text.assemble((f" exit {code} {envelope['exit_name'].removeprefix('EXIT_')} ",
                       CODE_STYLES.get(code, "bold red")), "  ", envelope["exit_meaning"],
                      no_wrap=True, overflow="ellipsis"),
        _line("CI action: ", envelope["ci_action"]),
        _line("decided by: ", f"rule {decided['rule']}: {decided['explanation']}"),
    ]
    root = envelope.get("root_cause_rank")
    rank = next((r for r in envelope["ranks"] if r["rank"] == root), None)
    if rank is not None:
        line = exception_line(rank)
        where = line or f"no traceback: see {sanitize_line(str(rank.get('stderr_log')))}"
        parts.append(_line(f"root cause: rank {root}: ", where, "bold red"))
    parts.extend(_line("warning: ", text, "bold yellow") for text in after_rank0(envelope))
    if envelope.get("hang"):
        parts.append(_line("hang: ", hang.sentence(envelope["hang"]), "bold red"))
    stuck = [r for r in envelope["ranks"] if r.get("stuck_at")]
    if stuck and (envelope.get("stop") or {}).get("kind") == "stall":
        parts.append(_line("stuck at: ", " · ".join(
            f"rank {r['rank']} {short_frame(sanitize_line(r['stuck_at']))}" for r in stuck)))
    if (lost := not_kept_line(envelope)) is not None:  # a full or unwritable run dir
        parts.append(_line("storage: ", lost, "bold yellow"))
    # The path wraps rather than losing its end: it is what the operator copies.
    parts.append(Text.assemble(("envelope: ", "bold"), envelope_path or "(not written)"))
    return Group(*parts)


def after_rank0(envelope: dict[str, Any]) -> list[str]:
    """Ranks that failed after rank 0's outcome exit: collateral in ForgeLM mode (never a root
    cause), still failures otherwise (docs/verdict.md)."""
    collateral = [int(r) for r in envelope.get("collateral_ranks") or []]
    texts = [f"rank {rank} failed after rank 0 had exited: collateral (teardown), "
             "not a root cause" for rank in collateral]
    texts += [f"rank {r['rank']} failed after rank 0 had exited (not ForgeLM: a failure)"
              for r in envelope["ranks"]
              if r.get("failed_after_rank0_exit") and r["rank"] not in collateral]
    return texts


def verdict_details(envelope: dict[str, Any]) -> list[Text]:
    parts = []
    if envelope.get("cancelled"):
        cancel = envelope["cancelled"]
        parts.append(Text.assemble(("cancelled: ", "bold"), f"by {cancel['by']} at {cancel['at']}"))
    for item in envelope.get("disagreements", []):
        parts.append(Text(f"note: rank {item['rank']} exited {item['exit_code']}, unlike rank 0",
                          style="yellow"))
    root = envelope.get("root_cause_rank")
    rank = next((r for r in envelope["ranks"] if r["rank"] == root), None)
    if rank is not None and (tail := _tail(rank)[-TAIL_LINES:]):
        parts.append(Text(f"rank {root}, the end of its traceback / stderr:", style="bold red"))
        parts.extend(Text("  " + line, style="red") for line in tail)
    parts.extend(stacks_details(envelope["ranks"]))
    killed = [r for r in envelope["ranks"] if r.get("signal") == "SIGKILL"
              and r.get("signalled_by_supervisor")]
    for rank in killed:
        parts.append(Text(f"rank {rank['rank']}: SIGKILL sent by forgelm-tui "
                          f"({rank['signals_sent'][-1]['reason']})", style="magenta"))
    if int(envelope["exit_code"]) == 4:
        results = [r.get("forgelm_result") for r in envelope["ranks"]]
        for index, result in enumerate(results):
            for hint in approval_hints(result):
                parts.append(Text(f"rank {index} {sanitize_line(hint)}", style="cyan"))
    return parts


def stacks_details(ranks: list[dict[str, Any]]) -> list[Text]:
    """Where each rank was stuck at the last capture: its main thread's innermost frame, or
    why there is no stack; every thread's stack is in the rank's stacks file."""
    captured = [r for r in ranks if r.get("stuck_at") or r.get("stacks_note")
                or r.get("stacks_file")]
    if not captured:
        return []
    parts = [Text("where each rank was stuck (main thread, innermost frame):", style="bold")]
    for rank in captured:
        frame = sanitize_line(str(rank.get("stuck_at") or "no Python frame"))
        if rank.get("stacks_file"):
            where = sanitize_line(str(rank["stacks_file"]))
            parts.append(Text.assemble(f"  rank {rank['rank']}: ", (frame, "bold"),
                                       f"  (every thread: {where})"))
        else:
            note = sanitize_line(str(rank.get("stacks_note") or ""))
            parts.append(Text(f"  rank {rank['rank']}: no stacks: {note}", style="yellow"))
    return parts


def verdict_renderable(envelope: dict[str, Any], envelope_path: str | None) -> RenderableType:
    """The whole verdict, summary then details: what the panel shows, in one renderable."""
    return Group(verdict_summary(envelope, envelope_path), *verdict_details(envelope))


class VerdictPanel(VerticalScroll):
    """Hidden until the run has ended; focusable, so the keys scroll its details."""

    shown: RenderableType | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="verdict-summary")
        yield Static(id="verdict-details")

    def show_verdict(self, envelope: dict[str, Any], envelope_path: str | None) -> None:
        summary, details = verdict_summary(envelope, envelope_path), verdict_details(envelope)
        self.shown = Group(summary, *details)
        self.query_one("#verdict-summary", Static).update(summary)
        more = self.query_one("#verdict-details", Static)
        more.update(Group(*details))
        more.display = bool(details)
        # An auto-height container counts a docked child only beside others: with nothing to
        # scroll, the summary is the content.
        self.query_one("#verdict-summary", Static).styles.dock = "top" if details else "none"
        self.display = True
        self.call_after_refresh(self._mark_more)

    def on_resize(self) -> None:
        self._mark_more()

    def _mark_more(self) -> None:
        """Say so on the border when the details go on below."""
        self.border_subtitle = "tab: scroll the details" if self.max_scroll_y else ""
