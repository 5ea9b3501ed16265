"""ForgeLM's documented launcher lines, verbatim behind forgelm-tui, on the real ForgeLM (issue
26): ``accelerate launch ... -m forgelm.cli --config job.yaml`` and ``deepspeed ... --module
forgelm.cli --config job.yaml`` return ForgeLM's 4 (awaiting approval), where accelerate
returns 1; the ForgeLM ranks get the launcher's training settings (their environment, read by
a sitecustomize that runs in every rank, against the real launcher's ranks for the same
flags)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_nodes import free_port_pair
from conftest import dies_with_the_test
from forgelm_job import job_env, make_job
from test_launchers_real import BIN, DUMP

pytestmark = [pytest.mark.forgelm, pytest.mark.timeout(240)]
SITE = """import json, os, sys
if os.environ.get("RANK") and "forgelm.cli" in sys.orig_argv:
    with open(os.path.join(os.environ["DUMP_DIR"], "rank-%s.json" % os.environ["RANK"]), "w") as f:
        json.dump({"env": dict(os.environ)}, f)
"""
SETTINGS = ("ACCELERATE_", "FSDP_", "OMP_NUM_THREADS", "CROSS_", "LOCAL_SIZE", "WORLD_SIZE",
            "CUDA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE", "GROUP_")


def settings(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(SETTINGS)}


@pytest.mark.parametrize(("words", "port_flag"), [
    (["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--mixed_precision", "no",
      "--dynamo_backend", "no", "-m"], "--main_process_port"),
    (["deepspeed", "--num_gpus", "2", "--module"], "--master_port"),
], ids=["accelerate", "deepspeed"])
def test_forgelms_launcher_lines_return_its_4_with_the_launchers_settings(
        tmp_path: Path, tiny_model: Path, words: list[str], port_flag: str) -> None:
    job = make_job(tmp_path / "job", require_human_approval=True, model_dir=tiny_model)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITE)
    dumps = {name: tmp_path / name for name in ("forgelm", "launcher")}
    for path in dumps.values():
        path.mkdir()
    env = job_env(job.dir, {**os.environ, "ACCELERATE_USE_CPU": "true",
                            "HF_HOME": str(tmp_path / "hf")})
    port_words = [port_flag, str(free_port_pair())]
    cmd = [sys.executable, "-m", "forgelm_tui", "--no-tui", "--run-dir", str(tmp_path / "run"),
           *words[:-1], *port_words, words[-1], "forgelm.cli", "--config", str(job.config)]
    ours = subprocess.Popen(cmd, cwd=job.dir, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=dies_with_the_test,
                            env={**env, "PYTHONPATH": str(tmp_path / "site"),
                                 "DUMP_DIR": str(dumps["forgelm"])})
    own = [str(BIN / words[0]), *words[1:-1], port_flag, str(free_port_pair()), DUMP]
    theirs = subprocess.run(own, cwd=tmp_path, env={**env, "DUMP_DIR": str(dumps["launcher"])},
                            capture_output=True, text=True, timeout=150)
    out, _ = ours.communicate(timeout=220)
    assert ours.returncode == 4, out[-3000:]
    assert theirs.returncode == 0, theirs.stdout[-2000:] + theirs.stderr[-2000:]
    envelope = json.loads((tmp_path / "run" / "envelope.json").read_text())
    assert envelope["mode"] == "forgelm" and envelope["result"]["awaiting_approval"] is True
    for rank in ("0", "1"):
        forgelm = json.loads((dumps["forgelm"] / f"rank-{rank}.json").read_text())["env"]
        launcher = json.loads((dumps["launcher"] / f"rank-{rank}.json").read_text())["env"]
        assert settings(forgelm) == settings(launcher) and settings(forgelm), rank
    if words[0] == "deepspeed":
        assert "--local_rank=N is not passed to ForgeLM" in out
