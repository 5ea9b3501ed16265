"""ForgeLM specifics: the job's YAML, and ForgeLM's JSON result in a rank's stdout."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULT_SCAN_BYTES = 8 * 1024 * 1024  # the result is printed last; read at most this much
DEFAULT_OUTPUT_DIR = "./checkpoints"  # ForgeLM 0.11.1 TrainingConfig.output_dir default


class JobConfigError(Exception):
    """The job's YAML cannot be used; the message is one line for the operator."""


@dataclass(frozen=True)
class JobConfig:
    path: Path
    output_dir: Path  # where ForgeLM writes, and where last_exit.json goes


def find_config_arg(args: list[str]) -> str | None:
    """The value of ``--config`` in ForgeLM's own arguments, as ForgeLM's argparse reads it."""
    for index, arg in enumerate(args):
        if arg == "--config" and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def read_job_config(path_text: str, cwd: Path) -> JobConfig:
    """Check the job's YAML the way an operator would want before any rank starts."""
    import yaml  # only ForgeLM mode needs it

    path = (cwd / path_text).resolve() if not os.path.isabs(path_text) else Path(path_text)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobConfigError(f"--config {path_text}: no such file") from None
    except IsADirectoryError:
        raise JobConfigError(f"--config {path_text}: is a directory, not a YAML file") from None
    except PermissionError:
        raise JobConfigError(f"--config {path_text}: permission denied") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise JobConfigError(f"--config {path_text}: cannot read ({exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise JobConfigError(f"--config {path_text}: invalid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise JobConfigError(f"--config {path_text}: expected a YAML mapping at the top level")
    training = data.get("training") or {}
    if not isinstance(training, dict):
        raise JobConfigError(f"--config {path_text}: 'training' must be a mapping")
    output_dir = str(training.get("output_dir") or DEFAULT_OUTPUT_DIR)
    out = Path(output_dir)
    return JobConfig(path=path, output_dir=out if out.is_absolute() else cwd / out)


def extract_result(stdout_log: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The last JSON object with a ``success`` key in a rank's stdout, or None.

    ForgeLM's stdout also carries other lines (peft's banner, HF Trainer's ``{'loss': ...}``
    dicts); its success/approval result is pretty-printed over many lines, errors are compact.
    """
    try:
        with open(stdout_log, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - RESULT_SCAN_BYTES))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    position = text.find("{")
    while position != -1:
        at_line_start = position == 0 or text[position - 1] == "\n"
        if at_line_start:
            try:
                obj, end = decoder.raw_decode(text, position)
            except ValueError:
                obj, end = None, position + 1
            if isinstance(obj, dict) and "success" in obj:
                found = obj
            position = text.find("{", max(end, position + 1))
        else:
            position = text.find("{", position + 1)
    return found
