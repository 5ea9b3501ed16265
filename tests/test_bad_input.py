"""Bad input: one clear line, exit 1, an envelope that says why, no traceback, no rank."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import cli_env, rank_script

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _cases(tmp: Path, port: int) -> dict[str, tuple[list[str], str]]:
    (tmp / "bad.yaml").write_text("model: [unclosed\n")
    (tmp / "list.yaml").write_text("- a\n- b\n")
    (tmp / "noread.yaml").write_text("model: {}\n")
    (tmp / "noread.yaml").chmod(0)
    (tmp / "adir.yaml").mkdir()
    script = rank_script("exit_with.py")
    return {
        "unknown option": (["--frobnicate", script], "unrecognized arguments: --frobnicate"),
        "missing script": (["nope.py"], "nope.py: no such script"),
        "missing config": (["--config", "missing.yaml"], "--config missing.yaml: no such file"),
        "forgelm module form": (["-m", "forgelm.cli", "--config", "missing.yaml"],
                                "--config missing.yaml: no such file"),
        "forgelm bare form": (["forgelm", "--config=missing.yaml"],
                              "--config missing.yaml: no such file"),
        "forgelm without config": (["-m", "forgelm"], "ForgeLM mode needs --config job.yaml"),
        "invalid yaml": (["--config", "bad.yaml"], "invalid YAML at line"),
        "yaml not a mapping": (["--config", "list.yaml"], "expected a YAML mapping"),
        "config is a directory": (["--config", "adir.yaml"], "is a directory"),
        "program not on path": (["--no-python", "no-such-program-xyz"], "no such program"),
        "missing module": (["-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
        "nproc zero": (["--nproc-per-node", "0", script], "must be at least 1"),
        "nproc negative": (["--nproc-per-node", "-2", script], "must be at least 1"),
        "nproc not a number": (["--nproc-per-node", "two", script], "must be a whole number"),
        "port in use": (["--master-port", str(port), script], f"--master-port {port}"),
        "bad grace": (["--grace", "soon", script], "--grace"),
        "nothing to run": ([], "nothing to run"),
        "multi node without node 0": (["--nnodes", "2", script], "--node-rank is required"),
        "multi node without address": (["--nnodes", "2", "--node-rank", "1", script],
                                       "needs --master-addr and --master-port"),
        "elastic range": (["--nnodes", "1:4", script], "(elastic) needs --rdzv-backend c10d"),
        "node rank outside": (["--nnodes", "2", "--node-rank", "2", "--master-addr",
                               "127.0.0.1", "--master-port", "29400", script],
                              "--node-rank 2 is outside 0..1"),
        "bad endpoint": (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "nohost",
                          script], "--rdzv-endpoint must be HOST:PORT"),
        "bad backend": (["--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint",
                         "127.0.0.1:29400", script], "--rdzv-backend etcd: use static or c10d"),
        "node timeout zero": (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                               "127.0.0.1:29400", "--node-timeout", "0", script],
                              "--node-timeout must be more than 0"),
        "bad signal": (["--forward-signals", "SIGNOPE", script], "unknown signal"),
        "reserved signal": (["--forward-signals", "SIG32", script], "unknown signal 'SIG32'"),
        "stop signal forwarded": (["--forward-signals", "hup", script], "SIGHUP stops the run"),
        "ranks filter not ranks": (["--local-ranks-filter", "0,one", script],
                                   "--local-ranks-filter must be local ranks separated by commas"),
        "ranks filter beyond node": (["--nproc-per-node", "2", "--local-ranks-filter", "0,3",
                                      script], "each node runs local ranks 0-1, not 3"),
    }


NAMES = [
    "unknown option", "missing script", "missing config", "forgelm module form",
    "forgelm bare form", "forgelm without config", "invalid yaml", "yaml not a mapping",
    "config is a directory", "program not on path", "missing module", "nproc zero",
    "nproc negative", "nproc not a number", "port in use", "bad grace", "nothing to run",
    "multi node without node 0", "multi node without address", "elastic range",
    "node rank outside", "bad endpoint", "bad backend", "node timeout zero", "bad signal",
    "reserved signal", "stop signal forwarded", "ranks filter not ranks",
    "ranks filter beyond node",
]


def _check_refused(code: int, out: str, err: str, expected: str, run_dir: Path,
                   envelope_path: Path) -> None:
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("forgelm-tui: error: ")
    assert expected in lines[0]
    assert "Traceback" not in err + out
    for path in (run_dir / "envelope.json", envelope_path):
        envelope = json.loads(path.read_text())
        assert envelope["exit_code"] == 1
        assert envelope["exit_name"] == "EXIT_CONFIG_ERROR"
        assert envelope["decided_by"]["rule"] == 1
        assert expected in envelope["error"]
        assert envelope["ranks"] == []
    assert not list(run_dir.glob("rank-*")), "no rank may start"


@pytest.mark.fault("F38")
@pytest.mark.parametrize("name", NAMES)
def test_bad_input(tmp_path: Path, busy_port: int, name: str, monkeypatch: pytest.MonkeyPatch,
                   capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's main() in-process: every refusal happens before launch, so a process of its
    own per case would only prove the entry point again (the test below does, in one)."""
    from forgelm_tui.cli import main

    args, expected = _cases(tmp_path, busy_port)[name]
    run_dir = tmp_path / "run"
    envelope_path = tmp_path / "out" / "env.json"
    monkeypatch.chdir(tmp_path)
    for key, value in cli_env().items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    code = main(["--no-tui", "--run-dir", str(run_dir), "--envelope", str(envelope_path),
                 *args])
    out, err = capsys.readouterr()
    _check_refused(code, out, err, expected, run_dir, envelope_path)


@pytest.mark.fault("F38")
@pytest.mark.parametrize("name", ["unknown option", "port in use"])
def test_bad_input_in_a_real_process(tmp_path: Path, busy_port: int, name: str) -> None:
    """The same refusals through the console script: the process's exit code and stderr."""
    args, expected = _cases(tmp_path, busy_port)[name]
    run_dir = tmp_path / "run"
    envelope_path = tmp_path / "out" / "env.json"
    proc = subprocess.run(
        [sys.executable, "-m", "forgelm_tui", "--no-tui", "--run-dir", str(run_dir),
         "--envelope", str(envelope_path), *args],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=20,
    )
    _check_refused(proc.returncode, proc.stdout, proc.stderr, expected, run_dir, envelope_path)


@pytest.mark.fault("F38")
def test_bad_input_json_output_is_only_the_envelope(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "forgelm_tui", "--no-tui", "--output-format", "json",
         "--run-dir", str(tmp_path / "run"), "missing.py"],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=20,
    )
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["error"] == "missing.py: no such script"


def test_help_exits_zero_without_heavy_imports(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from forgelm_tui.cli import main\n"
        "rc = main(['--help'])\n"
        "heavy = [m for m in ('textual', 'torch', 'rich', 'yaml') if m in sys.modules]\n"
        "print('HEAVY', heavy, rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=20, cwd=tmp_path)
    assert proc.returncode == 0
    assert "HEAVY [] 0" in proc.stdout
    assert "--nproc-per-node" in proc.stdout


@pytest.mark.fault("F39")
def test_a_rank_whose_log_cannot_be_opened_is_not_started(tmp_path: Path) -> None:
    """Logs first, then the rank: a rank never runs without its log files (no leaked pipe)."""
    run_dir = tmp_path / "run"
    (run_dir / "rank-1.stderr.log").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-m", "forgelm_tui", "--no-tui", "--run-dir", str(run_dir),
         "--nproc-per-node", "2", "--grace", "5", rank_script("exit_with.py"), "0",
         "--sleep", "30"],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=25)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    envelope = json.loads((run_dir / "envelope.json").read_text())
    assert envelope["error"].startswith("cannot start rank 1: Is a directory")
    rank0, rank1 = envelope["ranks"]
    assert rank1["pid"] is None and rank1["state"] == "starting"
    assert rank0["signalled_by_supervisor"] is True  # stopped at once, not left to run
