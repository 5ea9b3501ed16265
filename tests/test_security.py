"""Security (docs/security.md): private run dirs and files whatever the umask; secrets in the
command line never shown or recorded; a planted symlink at --envelope is never followed; the
closing lines name every envelope file written."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_env, rank_script, run_cli

from forgelm_tui.envelope.write import write_atomic
from forgelm_tui.private_files import make_private_dir, open_private
from forgelm_tui.redact import REDACTED, is_secret_name, redact_argv, redact_text, words

pytestmark = pytest.mark.timeout(90)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ------------------------------------------------------------------ redact.py, table


@pytest.mark.parametrize(("argv", "shown"), [
    (["--hf-token", "abc"], ["--hf-token", REDACTED]),
    (["--hf-token=abc"], [f"--hf-token={REDACTED}"]),
    (["--hf_token", "abc", "x"], ["--hf_token", REDACTED, "x"]),
    (["--api-key", "abc"], ["--api-key", REDACTED]),
    (["--apikey=abc"], [f"--apikey={REDACTED}"]),
    (["--apiKey", "abc"], ["--apiKey", REDACTED]),
    (["--key", "abc"], ["--key", REDACTED]),
    (["--secret", "s", "--password", "p", "--passwd", "q"],
     ["--secret", REDACTED, "--password", REDACTED, "--passwd", REDACTED]),
    (["-token", "abc"], ["-token", REDACTED]),
    (["env", "HF_TOKEN=abc", "WANDB_API_KEY=k", "python", "t.py"],
     ["env", f"HF_TOKEN={REDACTED}", f"WANDB_API_KEY={REDACTED}", "python", "t.py"]),
    (["wandb.api_key=abc", "+db.password=pw"],
     [f"wandb.api_key={REDACTED}", f"+db.password={REDACTED}"]),
    (["--keyword", "abc"], ["--keyword", "abc"]),
    (["--monkey", "abc"], ["--monkey", "abc"]),
    (["--max-new-tokens", "512", "--tokenizer", "gpt2"],
     ["--max-new-tokens", "512", "--tokenizer", "gpt2"]),
    (["--keys", "a"], ["--keys", "a"]),
    (["--hf-token", "--verbose"], ["--hf-token", "--verbose"]),  # no value: nothing to hide
    (["--hf-token"], ["--hf-token"]),
    (["KEYWORD=abc", "monkey=abc", "x=abc"], ["KEYWORD=abc", "monkey=abc", "x=abc"]),
    (["python", "-u", "t.py", "--lr", "0.1"], ["python", "-u", "t.py", "--lr", "0.1"]),
])
def test_redact_table(argv: list[str], shown: list[str]) -> None:
    assert redact_argv(argv) == shown


def test_words_split_on_dash_underscore_dot_and_case() -> None:
    assert words("--hf-token") == ["hf", "token"]
    assert words("HF_TOKEN") == ["hf", "token"]
    assert words("APIKey") == ["api", "key"]
    assert words("wandb.apiKey") == ["wandb", "api", "key"]
    assert not is_secret_name("--keyword") and is_secret_name("--access-key-id")


def test_redact_text_hides_values_in_a_message() -> None:
    message = "unrecognized arguments: --hf-token abc --api-key=xyz"
    assert redact_text(message) == (f"unrecognized arguments: --hf-token {REDACTED} "
                                    f"--api-key={REDACTED}")
    assert redact_text("no secret here: --keyword abc") == "no secret here: --keyword abc"


# ------------------------------------------------------------------ redact.py, properties


NAMES = ["token", "hf-token", "HF_TOKEN", "api-key", "apikey", "secret", "password", "passwd",
         "db.password", "awsSecretKey", "key"]
PLAIN = ["keyword", "monkey", "lr", "max-tokens", "tokenizer", "seed", "keys", "turkey"]


def test_properties_on_random_command_lines() -> None:
    rng = random.Random(12)
    for _ in range(500):
        argv, secrets = [], []
        for _ in range(rng.randint(0, 8)):
            secret = rng.random() < 0.4
            name = rng.choice(NAMES if secret else PLAIN)
            value = f"v{rng.randrange(10**9)}"
            form = rng.choice(["--", "-", "env", "eq"])
            if form == "env":
                snake = re.sub(r"(?<=[a-z])(?=[A-Z])|[-.]", "_", name)  # AWS_SECRET_KEY
                argv.append(f"{snake.upper()}={value}")
            elif form == "eq":
                argv.append(f"--{name}={value}")
            else:
                argv += [f"{form}{name}", value]
            if secret:
                secrets.append(value)
        shown = redact_argv(argv)
        assert len(shown) == len(argv)  # names kept, one token for one token
        text = " ".join(shown)
        for value in secrets:
            assert value not in text
        for before, after in zip(argv, shown, strict=True):  # a plain token is never touched
            if after != before:
                assert REDACTED in after
        assert redact_argv(shown) == shown  # idempotent
        assert redact_text(" ".join(argv)) == " ".join(shown)


def test_plain_words_are_never_redacted() -> None:
    rng = random.Random(5)
    for _ in range(200):
        argv = [rng.choice([f"--{rng.choice(PLAIN)}", f"v{rng.randrange(1000)}", "t.py"])
                for _ in range(rng.randint(0, 10))]
        assert redact_argv(argv) == argv


# ------------------------------------------------------------------ modes, whatever the umask


def test_private_dirs_and_files_ignore_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        make_private_dir(tmp_path / "a" / "b")
        fd = open_private(str(tmp_path / "a" / "b" / "f"), os.O_WRONLY | os.O_CREAT)
        os.close(fd)
        write_atomic(tmp_path / "a" / "b" / "envelope.json", {"x": 1})
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a") == _mode(tmp_path / "a" / "b") == 0o700
    assert _mode(tmp_path / "a" / "b" / "f") == 0o600
    assert _mode(tmp_path / "a" / "b" / "envelope.json") == 0o600


def test_runs_root_run_dir_logs_and_envelopes_are_private_whatever_the_umask(
        tmp_path: Path) -> None:
    """The default runs root and the run dir in it 0700, the logs and every envelope 0600."""
    extra = tmp_path / "out" / "envelope.json"
    done = subprocess.run([sys.executable, "-m", "forgelm_tui", "--no-tui", "--nproc-per-node",
                           "2", "--envelope", str(extra), rank_script("exit_with.py"), "0"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True,
                          timeout=60, preexec_fn=lambda: os.umask(0))  # nothing may rely on it
    assert done.returncode == 0, done.stderr
    root = tmp_path / "forgelm-tui-runs"
    assert _mode(root) == 0o700
    (run_dir,) = root.iterdir()
    assert _mode(run_dir) == 0o700
    for rank in (0, 1):
        for stream in ("stdout", "stderr"):
            assert _mode(run_dir / f"rank-{rank}.{stream}.log") == 0o600
    assert _mode(run_dir / "envelope.json") == 0o600
    assert _mode(extra.parent) == 0o700 and _mode(extra) == 0o600


# ------------------------------------------------------------------ secrets in the command line


@pytest.mark.fault("F37")
def test_hf_token_redacted_in_envelope_and_headless_lines(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "go").write_text("")
    extra = tmp_path / "e.json"
    run = run_cli(["--envelope", str(extra), "--nproc-per-node", "2",
                   rank_script("wait_then_flood.py"), str(marks), "3", "0",
                   "--hf-token", "abc123secret", "--api-key=k9secret", "--keyword", "kw777"],
                  tmp_path)
    out, err = run.output()
    assert run.proc.returncode == 0, err
    envelope = run.envelope()
    text = json.dumps(envelope)
    assert "abc123secret" not in text and "k9secret" not in text
    assert "abc123secret" not in out + err and "k9secret" not in out + err
    assert envelope["command"][-5:] == ["--hf-token", REDACTED, f"--api-key={REDACTED}",
                                        "--keyword", "kw777"]
    assert envelope["rank_command"][-5:] == ["--hf-token", REDACTED, f"--api-key={REDACTED}",
                                             "--keyword", "kw777"]
    closing = out.rstrip().splitlines()[-1]
    assert closing.endswith(f"; envelope: {run.run_dir / 'envelope.json'}, {extra}")
    assert json.loads(extra.read_text()) == envelope


@pytest.mark.fault("F37")
def test_bad_input_with_a_secret_is_redacted(tmp_path: Path) -> None:
    run = run_cli(["--hf-token", "abc123secret", rank_script("exit_with.py"), "0"], tmp_path)
    out, err = run.output()
    assert run.proc.returncode == 1
    assert "abc123secret" not in out + err
    assert "abc123secret" not in json.dumps(run.envelope())
    assert REDACTED in json.dumps(run.envelope()["command"])


# ------------------------------------------------------------------ --envelope PATH


@pytest.mark.fault("F35")
def test_a_symlink_planted_at_envelope_path_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    victim.chmod(0o644)
    planted = tmp_path / "shared" / "envelope.json"
    planted.parent.mkdir()
    planted.symlink_to(victim)
    run = run_cli(["--envelope", str(planted), "--nproc-per-node", "1",
                   rank_script("exit_with.py"), "0"], tmp_path)
    assert run.proc.returncode == 0
    assert victim.read_text() == "precious\n" and _mode(victim) == 0o644
    assert not planted.is_symlink() and json.loads(planted.read_text())["exit_code"] == 0
    assert _mode(planted) == 0o600
    assert not [p for p in planted.parent.iterdir() if p.name.endswith(".tmp")]


# ------------------------------------------------------------------ the TUI (tmux)


@pytest.mark.fault("F37")
@pytest.mark.skipif(shutil.which("tmux") is None and not os.environ.get("CI"), reason="no tmux")
def test_tui_header_redacts_and_q_names_every_envelope(tmp_path: Path, term: Any) -> None:
    shutil.copy(rank_script("wait_then_flood.py"), tmp_path / "r.py")
    (tmp_path / "m").mkdir()
    term.start(["--tui", "--run-dir", "run", "--envelope", "out/e.json", "r.py", "m", "3",
                "4", "--hf-token", "abc123secret", "--keyword", "kw777"], raw=True)
    screen = term.wait_screen(r"--hf-token <redacted> --keyword kw777")
    (tmp_path / "m" / "go").write_text("")
    screen = term.wait_screen(r"exit 4 AWAITING_APPROVAL")
    assert "abc123secret" not in screen
    term.press("q")
    assert term.exit_code() == 4
    after = term.wait_screen(r"forgelm-tui: exit 4").replace("\n", "")
    assert "abc123secret" not in after
    assert "; envelope: " in after and "out/e.json" in after
    assert f"{tmp_path / 'run' / 'envelope.json'}, {tmp_path / 'out' / 'e.json'}" in after


@pytest.mark.fault("F37")
def test_viewers_and_other_nodes_get_the_command_redacted(tmp_path: Path) -> None:
    """The control socket's snapshot and RunStarted carry the ranks' argv: redacted."""
    from forgelm_tui.engine.spec import LaunchSpec
    from forgelm_tui.engine.supervisor import Supervisor

    argv = (sys.executable, "t.py", "--hf-token", "abc123secret", "--keyword", "kw777")
    spec = LaunchSpec(argv=argv, run_id="r", run_dir=tmp_path, nproc_per_node=1,
                      master_addr="127.0.0.1", master_port=29999, grace=5.0, cwd=tmp_path)
    snapshot = Supervisor(spec, base_env={}).snapshot()
    assert snapshot.argv == (sys.executable, "t.py", "--hf-token", REDACTED, "--keyword",
                             "kw777")
    assert spec.argv == argv  # what the ranks get


# ------------------------------------------------------------------ the progress channel


@pytest.mark.fault("F36")
def test_the_channel_drops_another_users_messages() -> None:
    """Its abstract socket's name is public (/proc/net/unix): only this user's datagrams count."""
    import asyncio

    from forgelm_tui.channel import MessageKind, encode, socket_address
    from forgelm_tui.engine.channel import ChannelServer

    if os.geteuid() != 0:
        pytest.skip("needs root to send as another user (CI runs as root)")
    server = ChannelServer("sec")
    got: list[int] = []
    address = socket_address(server.name)
    sender = ("import socket, sys; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
              "s.sendto(bytes.fromhex(sys.argv[1]), bytes.fromhex(sys.argv[2]))")

    async def main() -> None:
        server.start(asyncio.get_running_loop(), lambda message: got.append(message.rank))
        for rank, user in ((7, 65534), (1, None)):  # nobody first, then ourselves
            data = encode(rank, MessageKind.HEARTBEAT).hex()
            await asyncio.to_thread(subprocess.run, ["/usr/bin/python3", "-c", sender, data,
                                                     bytes(address).hex()],
                                    check=True, user=user, cwd="/")
        for _ in range(500):
            if got:
                break
            await asyncio.sleep(0.01)

    try:
        asyncio.run(main())
    finally:
        server.close()
    assert got == [1]
