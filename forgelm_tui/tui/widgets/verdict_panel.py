"""The verdict: the true code, why, what CI should do, and where the envelope is."""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text
from textual.widgets import Static

CODE_STYLES = {0: "bold green", 3: "bold yellow", 4: "bold cyan", 5: "bold", 6: "bold red"}


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


def verdict_renderable(envelope: dict[str, Any], envelope_path: str | None) -> RenderableType:
    code = int(envelope["exit_code"])
    style = CODE_STYLES.get(code, "bold red")
    decided = envelope["decided_by"]
    parts: list[RenderableType] = [
        Text.assemble((f" exit {code} {envelope['exit_name'].removeprefix('EXIT_')} ", style),
                      "  ", envelope["exit_meaning"]),
        Text.assemble(("CI action: ", "bold"), envelope["ci_action"]),
        Text.assemble(("decided by: ", "bold"),
                      f"rule {decided['rule']}: {decided['explanation']}"),
    ]
    if envelope.get("cancelled"):
        cancel = envelope["cancelled"]
        parts.append(Text.assemble(("cancelled: ", "bold"), f"by {cancel['by']} at {cancel['at']}"))
    for item in envelope.get("disagreements", []):
        parts.append(Text(f"note: rank {item['rank']} exited {item['exit_code']}, unlike rank 0",
                          style="yellow"))
    root = envelope.get("root_cause_rank")
    if root is not None:
        rank = next((r for r in envelope["ranks"] if r["rank"] == root), None)
        if rank is not None:
            parts.append(Text(f"root cause: rank {root}", style="bold red"))
            error = rank.get("error") or {}
            tail = (error.get("traceback") or "").splitlines()[-12:] or (rank.get("stderr_tail")
                                                                         or [])[-12:]
            parts.extend(Text("  " + line, style="red") for line in tail)
    killed = [r for r in envelope["ranks"] if r.get("signal") == "SIGKILL"
              and r.get("signalled_by_supervisor")]
    for rank in killed:
        parts.append(Text(f"rank {rank['rank']}: SIGKILL sent by forgelm-tui "
                          f"({rank['signals_sent'][-1]['reason']})", style="magenta"))
    if code == 4:
        results = [r.get("forgelm_result") for r in envelope["ranks"]]
        for index, result in enumerate(results):
            for hint in approval_hints(result):
                parts.append(Text(f"rank {index} {hint}", style="cyan"))
    parts.append(Text.assemble(("envelope: ", "bold"), envelope_path or "(not written)"))
    parts.append(Text("q quit with this code · s save the envelope · ? keys", style="dim"))
    return Group(*parts)


class VerdictPanel(Static):
    shown: RenderableType | None = None

    def show_verdict(self, envelope: dict[str, Any], envelope_path: str | None) -> None:
        self.shown = verdict_renderable(envelope, envelope_path)
        self.update(self.shown)
        self.display = True
