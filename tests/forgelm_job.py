"""Offline fixture: a REAL ForgeLM 0.11.1 SFT/LoRA job that trains on CPU in seconds.

Everything is built locally — no model weights or datasets are downloaded:

* :func:`build_tiny_model` writes a random-weight 2-layer Llama (hidden 32) and a
  WordLevel tokenizer (trained on a few strings) with ``save_pretrained``.
* :func:`write_dataset` writes a local ``{"text": ...}`` JSONL corpus.
* :func:`write_job` writes a ForgeLM YAML config pointing at both, with
  ``model.offline: true`` and ``evaluation.require_human_approval`` as requested.
* :func:`make_job` does all three in one directory.
* :func:`job_env` returns the environment a ForgeLM / torchrun child needs
  (operator identity, offline flags, single-threaded BLAS, private HF cache).
* :func:`forgelm_cmd` / :func:`torchrun_cmd` build the argv for a run.

No module-level imports beyond the standard library: ``torch`` /
``transformers`` / ``tokenizers`` are imported lazily inside
:func:`build_tiny_model`, so this module can be imported by a test process
that does not have them (e.g. a supervisor test that only needs ``write_job``
against a model directory built earlier).

Usage from a test::

    from tests.forgelm_job import make_job, job_env, torchrun_cmd
    job = make_job(tmp_path)                      # require_human_approval=True
    proc = subprocess.run(torchrun_cmd(job.config), env=job_env(tmp_path),
                          cwd=tmp_path, capture_output=True, text=True)

Run ``python tests/forgelm_job.py [DIR] [--ranks N] [--long]`` to smoke-test.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

# Where the project's venv lives (overridable so CI can point elsewhere).
VENV = Path(os.environ.get("FORGELM_VENV", "/work/venv"))
PYTHON = str(VENV / "bin" / "python")
TORCHRUN = str(VENV / "bin" / "torchrun")

# ForgeLM exit-code contract (forgelm/cli/_exit_codes.py).
EXIT_SUCCESS = 0
EXIT_CONFIG_ERROR = 1
EXIT_TRAINING_ERROR = 2
EXIT_EVAL_FAILURE = 3
EXIT_AWAITING_APPROVAL = 4

# Step counts.  Measured on a 2-core CPU box (torch 2.13 CPU, OMP_NUM_THREADS=1):
# a 2-rank step with the settings below is roughly 0.03-0.05 s, and the fixed
# start-up cost (imports + model/dataset load + save + compliance artefacts)
# is ~12-15 s per rank.  QUICK_STEPS keeps a whole 2-rank run well under 40 s;
# LONG_STEPS keeps ``trainer.train()`` itself busy for well over 20 s so a
# supervisor can cancel mid-training.  See ``long_job_extra`` for the knobs.
QUICK_STEPS = 4
LONG_STEPS = 1500

_WORDS = (
    "the quick brown fox jumps over lazy dog a model learns to write short "
    "sentences about cats dogs birds and fish in the sun rain snow wind "
    "hello world forge train tune rank step loss data text token"
).split()

SPECIAL_TOKENS = {"pad": "<pad>", "eos": "</s>", "bos": "<s>", "unk": "<unk>"}


# ---------------------------------------------------------------------------
# Model + tokenizer
# ---------------------------------------------------------------------------


def _corpus_lines(n: int) -> List[str]:
    """Deterministic pseudo-sentences built from ``_WORDS`` (no RNG dependency)."""
    lines = []
    for i in range(n):
        k = 6 + (i % 7)
        words = [_WORDS[(i * 7 + j * 3 + (i * j) % 5) % len(_WORDS)] for j in range(k)]
        lines.append(" ".join(words))
    return lines


def build_tiny_model(dir: Path, *, hidden_size: int = 32, num_layers: int = 2, seed: int = 0) -> Path:
    """Build a tiny random-weight LlamaForCausalLM + WordLevel tokenizer under ``dir``.

    Returns the model directory (``dir`` itself), loadable with
    ``AutoModelForCausalLM.from_pretrained(dir)`` / ``AutoTokenizer.from_pretrained(dir)``
    and therefore by ForgeLM with ``model.name_or_path: <dir>`` + ``model.offline: true``.
    Module names include ``q_proj`` / ``v_proj`` (ForgeLM's default LoRA targets).
    Idempotent: an existing build (``config.json`` + ``tokenizer.json`` present) is reused.
    """
    dir = Path(dir)
    if (dir / "config.json").is_file() and (dir / "tokenizer.json").is_file() and (dir / "model.safetensors").is_file():
        return dir
    dir.mkdir(parents=True, exist_ok=True)

    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = [SPECIAL_TOKENS["pad"], SPECIAL_TOKENS["unk"], SPECIAL_TOKENS["bos"], SPECIAL_TOKENS["eos"]]
    tok = Tokenizer(models.WordLevel(unk_token=SPECIAL_TOKENS["unk"]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        _corpus_lines(200) + [" ".join(_WORDS), "[USER] [ASSISTANT] : . , ! ?"],
        trainer=trainers.WordLevelTrainer(special_tokens=specials, min_frequency=1),
    )
    # No BOS/EOS post-processing: ForgeLM appends eos itself (data.add_eos).
    tok.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B")
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=SPECIAL_TOKENS["pad"],
        eos_token=SPECIAL_TOKENS["eos"],
        bos_token=SPECIAL_TOKENS["bos"],
        unk_token=SPECIAL_TOKENS["unk"],
        model_max_length=128,
        padding_side="right",
    )

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(hf_tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        pad_token_id=hf_tok.pad_token_id,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(dir)
    hf_tok.save_pretrained(dir)
    return dir


# ---------------------------------------------------------------------------
# Dataset
# ---------------------------------------------------------------------------


def write_dataset(path: Path, *, rows: int = 64) -> Path:
    """Write ``rows`` lines of ``{"text": ...}`` JSONL to ``path`` and return it.

    ForgeLM auto-splits a validation set off this (10 %, >= 1 row), so 64 rows
    give ~57 train / ~7 validation rows.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for line in _corpus_lines(rows):
            fh.write(json.dumps({"text": line}) + "\n")
    return path


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------


def _deep_merge(base: Dict[str, Any], extra: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if value is None and key in out:
            out.pop(key)  # ``{"evaluation": None}`` deletes the block
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def job_config(
    dir: Path,
    *,
    model_dir: Optional[Path] = None,
    dataset: Optional[Path] = None,
    require_human_approval: bool = True,
    max_steps: int = QUICK_STEPS,
    extra: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The config dict :func:`write_job` serialises (all paths absolute)."""
    dir = Path(dir).resolve()
    model_dir = Path(model_dir or dir / "tiny-model").resolve()
    dataset = Path(dataset or dir / "data.jsonl").resolve()
    cfg: Dict[str, Any] = {
        "model": {
            "name_or_path": str(model_dir),
            "max_length": 64,
            "load_in_4bit": False,
            "backend": "transformers",
            "offline": True,
        },
        "lora": {
            "r": 4,
            "alpha": 8,
            "dropout": 0.0,
            "bias": "none",
            "method": "lora",
            "target_modules": ["q_proj", "v_proj"],
            "task_type": "CAUSAL_LM",
        },
        "training": {
            "output_dir": str(dir / "out"),
            "trainer_type": "sft",
            "max_steps": max_steps,
            "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": 1,
            "learning_rate": 1.0e-3,
            "warmup_ratio": 0.0,
            # No mid-run eval / checkpoint (save_steps must be a multiple of
            # eval_steps because a validation split exists).
            "eval_steps": 100000,
            "save_steps": 100000,
            "save_total_limit": 1,
            "report_to": "none",
        },
        "data": {
            "dataset_name_or_path": str(dataset),
            "shuffle": True,
            "clean_text": True,
            "add_eos": True,
        },
        "evaluation": {
            "auto_revert": False,
            "require_human_approval": require_human_approval,
        },
    }
    if extra:
        cfg = _deep_merge(cfg, extra)
    return cfg


def write_job(
    dir: Path,
    *,
    require_human_approval: bool = True,
    max_steps: int = QUICK_STEPS,
    extra: Optional[Dict[str, Any]] = None,
    model_dir: Optional[Path] = None,
    dataset: Optional[Path] = None,
    name: str = "job.yaml",
) -> Path:
    """Write a ForgeLM YAML config into ``dir`` and return its path.

    ``model_dir`` defaults to ``dir/tiny-model`` and ``dataset`` to
    ``dir/data.jsonl`` (build them with :func:`build_tiny_model` /
    :func:`write_dataset`, or use :func:`make_job`).  ``training.output_dir``
    is ``dir/out``.  ``extra`` is deep-merged into the config dict (a ``None``
    value deletes that key), e.g. ``extra={"training": {"max_steps": 8}}`` or
    ``extra={"bogus_key": 1}`` for an exit-1 config error.
    """
    dir = Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    cfg = job_config(
        dir,
        model_dir=model_dir,
        dataset=dataset,
        require_human_approval=require_human_approval,
        max_steps=max_steps,
        extra=extra,
    )
    path = dir / name
    try:
        import yaml  # PyYAML ships with forgelm; JSON is valid YAML otherwise.

        text = yaml.safe_dump(cfg, sort_keys=False)
    except ImportError:  # pragma: no cover
        text = json.dumps(cfg, indent=2) + "\n"
    path.write_text(text, encoding="utf-8")
    return path


def long_job_extra(max_steps: int = LONG_STEPS) -> Dict[str, Any]:
    """``extra`` for a job whose training loop runs for well over 20 s on 2 CPU ranks.

    Pass as ``write_job(dir, max_steps=LONG_STEPS)`` (or ``make_job(dir, long=True)``).
    Only ``max_steps`` changes; no eval / checkpoint happens mid-run, so a
    cancel always lands inside ``trainer.train()``.
    """
    return {"training": {"max_steps": max_steps}}


def write_bad_job(dir: Path, name: str = "bad.yaml") -> Path:
    """A config that fails validation -> ForgeLM exits 1 (before any model load)."""
    return write_job(dir, extra={"training": {"no_such_field": 1}}, name=name)


@dataclass
class Job:
    dir: Path
    model_dir: Path
    dataset: Path
    config: Path
    output_dir: Path

    @property
    def audit_log(self) -> Path:
        return self.output_dir / "audit_log.jsonl"

    def audit_events(self) -> List[Dict[str, Any]]:
        return read_audit_log(self.output_dir)


def make_job(
    dir: Path,
    *,
    require_human_approval: bool = True,
    max_steps: Optional[int] = None,
    long: bool = False,
    extra: Optional[Dict[str, Any]] = None,
    model_dir: Optional[Path] = None,
) -> Job:
    """Build model (or reuse ``model_dir``), dataset and config in ``dir``."""
    dir = Path(dir).resolve()
    model_dir = build_tiny_model(Path(model_dir) if model_dir else dir / "tiny-model")
    dataset = write_dataset(dir / "data.jsonl")
    if max_steps is None:
        max_steps = LONG_STEPS if long else QUICK_STEPS
    config = write_job(
        dir,
        require_human_approval=require_human_approval,
        max_steps=max_steps,
        extra=extra,
        model_dir=model_dir,
        dataset=dataset,
    )
    return Job(dir=dir, model_dir=model_dir, dataset=dataset, config=config, output_dir=dir / "out")


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def job_env(dir: Optional[Path] = None, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Environment for a ForgeLM / torchrun child process.

    * ``FORGELM_OPERATOR`` — audit-log operator identity (else ``user@host``;
      without a resolvable user ForgeLM refuses to start).
    * ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` / ``HF_DATASETS_OFFLINE`` —
      ForgeLM sets them itself for ``model.offline: true``; set early anyway.
    * ``OMP_NUM_THREADS=1`` — 2 ranks on 2 cores; also silences torchrun's
      OMP warning.
    * ``HF_HOME`` / ``HF_DATASETS_CACHE`` — when ``dir`` is given, keep the
      ``datasets`` Arrow cache (``load_dataset('json', ...)`` writes one) out
      of ``~/.cache/huggingface``.
    """
    env = dict(os.environ if base is None else base)
    env.update(
        {
            "FORGELM_OPERATOR": "test",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if dir is not None:
        cache = Path(dir).resolve() / ".hf-cache"
        env["HF_HOME"] = str(cache)
        env["HF_DATASETS_CACHE"] = str(cache / "datasets")
    return env


def forgelm_cmd(config: Path, *extra_args: str) -> List[str]:
    """Single-process argv: ``python -m forgelm.cli --config X --output-format json``."""
    return [PYTHON, "-m", "forgelm.cli", "--config", str(config), "--output-format", "json", *extra_args]


def torchrun_cmd(
    config: Path,
    *extra_args: str,
    nproc: int = 2,
    log_dir: Optional[Path] = None,
    master_port: Optional[int] = None,
) -> List[str]:
    """2-rank argv: ``torchrun --nproc-per-node 2 [--log-dir D --redirects 3] -m forgelm.cli ...``.

    With ``log_dir`` torchrun writes each rank's stdout/stderr to
    ``<log_dir>/<run_id>/attempt_0/<rank>/{stdout,stderr}.log`` and records
    per-rank failures in its own log.  ``--standalone`` picks a free
    rendezvous port unless ``master_port`` is given.
    """
    cmd = [TORCHRUN, "--nproc-per-node", str(nproc)]
    if master_port is None:
        cmd.append("--standalone")
    else:
        cmd += ["--master-addr", "127.0.0.1", "--master-port", str(master_port)]
    if log_dir is not None:
        cmd += ["--log-dir", str(log_dir), "--redirects", "3"]
    cmd += ["-m", "forgelm.cli", "--config", str(config), "--output-format", "json", *extra_args]
    return cmd


def read_audit_log(output_dir: Path) -> List[Dict[str, Any]]:
    """Parse ``<output_dir>/audit_log.jsonl`` (empty list if absent)."""
    path = Path(output_dir) / "audit_log.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def parse_json_stdout(text: str) -> List[Dict[str, Any]]:
    """Extract every top-level JSON object ForgeLM printed on stdout.

    Exit 4/0/3 print a pretty (indent=2) envelope; error paths print a
    one-line ``{"success": false, "error": ...}``.  Under torchrun without
    ``--redirects`` both ranks' envelopes are interleaved on one stream
    (usually whole, since each is one ``print``), so this returns a list.
    """
    decoder = json.JSONDecoder()
    out, i = [], 0
    while True:
        i = text.find("{", i)
        if i < 0:
            return out
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        if isinstance(obj, dict):
            out.append(obj)
        i = end


# ---------------------------------------------------------------------------
# Smoke test: python tests/forgelm_job.py [DIR] [--ranks N] [--long] [--no-approval]
# ---------------------------------------------------------------------------


def _main(argv: List[str]) -> int:
    import argparse
    import subprocess
    import tempfile
    import time

    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--long", action="store_true")
    ap.add_argument("--no-approval", action="store_true")
    args = ap.parse_args(argv)
    base = Path(args.dir or tempfile.mkdtemp(prefix="forgelm-job-"))
    job = make_job(base, require_human_approval=not args.no_approval, long=args.long)
    env = job_env(base)
    if args.ranks <= 1:
        cmd = forgelm_cmd(job.config)
    else:
        cmd = torchrun_cmd(job.config, nproc=args.ranks, log_dir=base / "torchrun-logs")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=base, capture_output=True, text=True)
    dt = time.monotonic() - t0
    print(f"dir={base} rc={proc.returncode} wall={dt:.1f}s", file=sys.stderr)
    for env_obj in parse_json_stdout(proc.stdout):
        print(json.dumps(env_obj, indent=2))
    if args.ranks > 1:
        for rank_out in sorted((base / "torchrun-logs").rglob("stdout.log")):
            print(f"--- {rank_out}: {parse_json_stdout(rank_out.read_text())}", file=sys.stderr)
    print("events:", [e["event"] for e in job.audit_events()], file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
