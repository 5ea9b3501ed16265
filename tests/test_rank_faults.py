"""Rank-side faults of docs/faults.md not covered elsewhere: a rank that closes its own stdout,
a rank whose output is no text."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
from conftest import rank_script, run_cli

pytestmark = pytest.mark.timeout(90)


@pytest.mark.fault("F16")
def test_a_rank_that_closes_its_stdout_changes_nothing(tmp_path: Path) -> None:
    run = run_cli(["--nproc-per-node", "2", rank_script("close_stdout.py"), "4"], tmp_path)
    _, err = run.output()
    assert run.proc.returncode == 4, err
    envelope = run.envelope()
    assert envelope["exit_code"] == 4
    assert [r["exit_code"] for r in envelope["ranks"]] == [4, 4]
    for rank in (0, 1):
        assert (run.run_dir / f"rank-{rank}.stdout.log").read_bytes() == \
            b"before closing stdout\n"
        assert b"still here" in (run.run_dir / f"rank-{rank}.stderr.log").read_bytes()
    assert "Traceback" not in err


@pytest.mark.fault("F15")
def test_binary_output_is_kept_raw_and_shown_as_text(tmp_path: Path) -> None:
    script = rank_script("binary_output.py")
    run = run_cli([script, "0"], tmp_path)
    out, err = run.output()
    assert run.proc.returncode == 0, err
    written = runpy.run_path(rank_script("binary_blob.py"))["BLOB"]
    assert (run.run_dir / "rank-0.stdout.log").read_bytes() == written + b"after the blob\n"
    shown = [line for line in out.splitlines() if line.startswith("[rank 0]")]
    assert "[rank 0] after the blob" in shown
    for line in shown:
        assert not any((ord(c) < 32 and c != "\t") or 0x7F <= ord(c) < 0xA0 for c in line), line
    assert "Traceback" not in err
