"""Offline fixture: a REAL ForgeLM 0.11.1 SFT/LoRA job that trains on CPU in seconds.

Everything is built locally — no model weights or datasets are downloaded:

* :func:`build_tiny_model` writes a random-weight 2-layer Llama (hidden 32) and a
  WordLevel tokenizer (trained on a few strings): the files ``save_pretrained`` writes,
  without importing transformers or torch.
* :func:`write_dataset` writes a local ``{"text": ...}`` JSONL corpus.
* :func:`write_job` writes a ForgeLM YAML config pointing at both, with
  ``model.offline: true`` and ``evaluation.require_human_approval`` as requested.
* :func:`make_job` does all three in one directory and returns a :class:`Job`.
* :func:`job_env` returns the environment a ForgeLM / torchrun child needs
  (operator identity, offline flags, single-threaded BLAS, private HF cache).
* :func:`forgelm_cmd` / :func:`torchrun_cmd` / :func:`rank_env` build a run.
* :func:`result_envelope` / :func:`read_audit_log` read back what ForgeLM wrote.
* :func:`recording_cli_cmd`: the forgelm-tui CLI, recording every progress event it shows.

Only the standard library is imported at module level: ``numpy`` / ``safetensors`` /
``tokenizers`` are imported lazily inside :func:`build_tiny_model` and ``yaml`` inside
:func:`write_job`.

Usage from a test::

    from tests.forgelm_job import make_job, job_env, torchrun_cmd, result_envelope
    job = make_job(tmp_path)                      # require_human_approval=True
    proc = subprocess.run(torchrun_cmd(job.config), env=job_env(tmp_path),
                          cwd=tmp_path, capture_output=True, text=True)
    # every rank exits 4; torchrun itself exits 1 (ChildFailedError)

Smoke test: ``python tests/forgelm_job.py [DIR] [--ranks N] [--long] [--no-approval]``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The interpreter running the tests is the one with forgelm installed (CI's .venv).
PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))

# ForgeLM exit-code contract (forgelm/cli/_exit_codes.py).
EXIT_SUCCESS = 0
EXIT_CONFIG_ERROR = 1
EXIT_TRAINING_ERROR = 2
EXIT_EVAL_FAILURE = 3
EXIT_AWAITING_APPROVAL = 4

# Step counts.  Measured on the 2-core CPU dev box (torch 2.13 CPU,
# OMP_NUM_THREADS=1): ~45 steps/s with 2 DDP ranks (gloo), ~110 steps/s in a
# single process; fixed overhead (imports, model/dataset load, staging save,
# compliance artefacts) is ~7 s single-process and ~9-10 s for 2 ranks.
# QUICK_STEPS: a whole 2-rank run takes ~10 s.  LONG_STEPS[nproc]: the training
# loop alone runs ~25-30 s, so a supervisor can cancel mid-training (training
# starts ~8 s after launch; the audit event ``training.started`` marks it).
QUICK_STEPS = 4
LONG_STEPS = {1: 3000, 2: 1200}

# ``extra`` presets for the other exit codes (all verified against forgelm 0.11.1).
#
# CONFIG_ERROR_EXTRA    -> exit 1 in ~0.3 s: pydantic rejects the key; nothing is
#                          written (no output_dir, no audit log).
# PREFLIGHT_ERROR_EXTRA -> exit 1 *after* the model loads (~5 s): ForgeTrainer
#                          raises ConfigError while building TrainingArguments, so
#                          the audit log gets pipeline.initialized + pipeline.failed.
# GATE_FAILURE_EXTRA    -> exit 3: the loss gate fails with auto_revert, the staged
#                          model is deleted; audit: evaluation.loss_gate_completed
#                          (passed=false) + model.reverted; envelope reverted=true.
# RUNTIME_ERROR_EXTRA   -> exit 2: the GaLore optimizer needs ``galore_torch`` (not
#                          installed in the venv) -> ImportError inside
#                          trainer.train(); audit: training.started + pipeline.failed.
CONFIG_ERROR_EXTRA: dict[str, Any] = {"training": {"no_such_field": 1}}
PREFLIGHT_ERROR_EXTRA: dict[str, Any] = {"training": {"eval_steps": 2, "save_steps": 3}}
GATE_FAILURE_EXTRA: dict[str, Any] = {
    "evaluation": {"auto_revert": True, "max_acceptable_loss": 0.001}
}
RUNTIME_ERROR_EXTRA: dict[str, Any] = {"training": {"galore_enabled": True}}

_WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "a", "model",
    "learns", "to", "write", "short", "sentences", "about", "cats", "dogs", "birds",
    "and", "fish", "in", "sun", "rain", "snow", "wind", "hello", "world", "forge",
    "train", "tune", "rank", "step", "loss", "data", "text", "token",
]  # fmt: skip

SPECIAL_TOKENS = {"pad": "<pad>", "eos": "</s>", "bos": "<s>", "unk": "<unk>"}


def long_steps(nproc: int = 2) -> int:
    """``max_steps`` that keeps ``trainer.train()`` busy ~25-30 s with ``nproc`` CPU ranks."""
    return LONG_STEPS.get(nproc, LONG_STEPS[2])


# ---------------------------------------------------------------------------
# Model + tokenizer
# ---------------------------------------------------------------------------


def _corpus_lines(n: int) -> list[str]:
    """Deterministic pseudo-sentences built from ``_WORDS`` (no RNG dependency)."""
    lines = []
    for i in range(n):
        k = 6 + (i % 7)
        words = [_WORDS[(i * 7 + j * 3 + (i * j) % 5) % len(_WORDS)] for j in range(k)]
        lines.append(" ".join(words))
    return lines


def _model_complete(dir: Path) -> bool:
    return all((dir / f).is_file() for f in ("config.json", "tokenizer.json", "model.safetensors"))


def build_tiny_model(
    dir: Path, *, hidden_size: int = 32, num_layers: int = 2, seed: int = 0
) -> Path:
    """Build a tiny random-weight LlamaForCausalLM + WordLevel tokenizer in ``dir``.

    Returns ``dir``, loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer``
    and therefore by ForgeLM with ``model.name_or_path: <dir>`` and
    ``model.offline: true``.  ~25k parameters; module names include ``q_proj`` /
    ``v_proj`` (ForgeLM's default LoRA targets).

    Written without importing transformers or torch (``tokenizers``, ``numpy`` and
    ``safetensors`` only, ~0.3 s): the files ``save_pretrained`` writes for this
    model (transformers 5), with its initialisation (normal(0, 0.02) matrices, RMSNorm
    weights 1). Building it through transformers cost ~8 s of CPU per test session.
    Idempotent and safe against concurrent builders: it builds in a temp
    sibling directory and renames it into place; an existing build is reused.
    """
    dir = Path(dir)
    if _model_complete(dir):
        return dir
    dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = dir.with_name(f".{dir.name}.tmp-{os.getpid()}")
    tmp.mkdir()

    import numpy as np
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    specials = [SPECIAL_TOKENS[k] for k in ("pad", "unk", "bos", "eos")]
    tok = Tokenizer(models.WordLevel(unk_token=SPECIAL_TOKENS["unk"]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        [*_corpus_lines(200), " ".join(_WORDS), "[USER] [ASSISTANT] : . , ! ?"],
        trainer=trainers.WordLevelTrainer(special_tokens=specials, min_frequency=1),
    )
    # No BOS/EOS post-processing: ForgeLM / TRL append eos themselves (data.add_eos).
    tok.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B")
    tok.save(str(tmp / "tokenizer.json"))
    ids = {name: tok.token_to_id(token) for name, token in SPECIAL_TOKENS.items()}
    vocab = tok.get_vocab_size()
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 128,
        "padding_side": "right", **{f"{name}_token": token
                                    for name, token in SPECIAL_TOKENS.items()}}, indent=2))
    heads, inner = 4, hidden_size * 2
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "dtype": "float32",
        "vocab_size": vocab, "hidden_size": hidden_size, "intermediate_size": inner,
        "num_hidden_layers": num_layers, "num_attention_heads": heads,
        "num_key_value_heads": heads, "head_dim": hidden_size // heads,
        "max_position_embeddings": 128, "hidden_act": "silu", "rms_norm_eps": 1e-06,
        "initializer_range": 0.02, "attention_bias": False, "attention_dropout": 0.0,
        "mlp_bias": False, "pretraining_tp": 1, "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "use_cache": True, "pad_token_id": ids["pad"], "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    (tmp / "generation_config.json").write_text(json.dumps({
        "_from_model_config": True, "bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"], "use_cache": True}, indent=2))
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> Any:
        return rng.normal(0.0, 0.02, (rows, cols)).astype(np.float32)

    weights = {"model.embed_tokens.weight": matrix(vocab, hidden_size),
               "model.norm.weight": np.ones(hidden_size, np.float32),
               "lm_head.weight": matrix(vocab, hidden_size)}
    for layer in range(num_layers):
        prefix = f"model.layers.{layer}."
        for proj in ("q", "k", "v", "o"):
            weights[f"{prefix}self_attn.{proj}_proj.weight"] = matrix(hidden_size, hidden_size)
        weights[f"{prefix}mlp.gate_proj.weight"] = matrix(inner, hidden_size)
        weights[f"{prefix}mlp.up_proj.weight"] = matrix(inner, hidden_size)
        weights[f"{prefix}mlp.down_proj.weight"] = matrix(hidden_size, inner)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            weights[f"{prefix}{norm}.weight"] = np.ones(hidden_size, np.float32)
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    try:
        os.rename(tmp, dir)  # atomic; fails if a concurrent builder won the race
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        if not _model_complete(dir):
            raise
    return dir


# ---------------------------------------------------------------------------
# Dataset
# ---------------------------------------------------------------------------


def write_dataset(path: Path, *, rows: int = 64) -> Path:
    """Write ``rows`` lines of ``{"text": ...}`` JSONL to ``path`` and return it.

    ForgeLM auto-splits a validation set off this (10 %, >= 1 row), so 64 rows
    give 57 train / 7 validation rows.
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


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if value is None:
            out.pop(key, None)  # ``{"evaluation": None}`` deletes the block
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def job_config(
    dir: Path,
    *,
    model_dir: Path | None = None,
    dataset: Path | None = None,
    require_human_approval: bool = True,
    max_steps: int = QUICK_STEPS,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The config dict :func:`write_job` serialises (all paths absolute)."""
    dir = Path(dir).resolve()
    model_dir = Path(model_dir or dir / "tiny-model").resolve()
    dataset = Path(dataset or dir / "data.jsonl").resolve()
    cfg: dict[str, Any] = {
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
            # No mid-run eval / checkpoint.  save_steps must be a multiple of
            # eval_steps because a validation split exists.  HF still writes
            # one checkpoint-<max_steps>/ at the end.
            "eval_steps": 100000,
            "save_steps": 100000,
            "save_total_limit": 1,
            "report_to": "none",  # default "tensorboard" would write out/runs/
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
    extra: dict[str, Any] | None = None,
    model_dir: Path | None = None,
    dataset: Path | None = None,
    name: str = "job.yaml",
) -> Path:
    """Write a ForgeLM YAML config into ``dir`` and return its path.

    ``model_dir`` defaults to ``dir/tiny-model`` and ``dataset`` to
    ``dir/data.jsonl`` (build them with :func:`build_tiny_model` /
    :func:`write_dataset`, or use :func:`make_job`).  ``training.output_dir``
    is ``dir/out``.  ``extra`` is deep-merged into the config dict (a ``None``
    value deletes that key), e.g. ``extra=GATE_FAILURE_EXTRA`` or
    ``extra=long_job_extra()``.
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


def long_job_extra(nproc: int = 2) -> dict[str, Any]:
    """``extra`` for a job whose training loop runs ~25-30 s (see :data:`LONG_STEPS`).

    Same as ``write_job(dir, max_steps=long_steps(nproc))`` or
    ``make_job(dir, long=True, nproc=nproc)``.  Only ``max_steps`` changes; no
    eval / checkpoint happens mid-run, so a cancel lands inside ``trainer.train()``.
    """
    return {"training": {"max_steps": long_steps(nproc)}}


def write_bad_job(dir: Path, name: str = "bad.yaml") -> Path:
    """A config that fails validation -> ForgeLM exits 1 (before any model load)."""
    return write_job(dir, extra=CONFIG_ERROR_EXTRA, name=name)


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

    def audit_events(self) -> list[dict[str, Any]]:
        return read_audit_log(self.output_dir)


def make_job(
    dir: Path,
    *,
    require_human_approval: bool = True,
    max_steps: int | None = None,
    long: bool = False,
    nproc: int = 2,
    extra: dict[str, Any] | None = None,
    model_dir: Path | None = None,
) -> Job:
    """Build the model (or reuse ``model_dir``), dataset and config in ``dir``.

    ``long=True`` picks ``long_steps(nproc)``; an explicit ``max_steps`` wins.
    Pass a shared ``model_dir`` (e.g. from a session-scoped fixture) to skip
    the ~3-4 s model build per test.
    """
    dir = Path(dir).resolve()
    model = build_tiny_model(Path(model_dir) if model_dir else dir / "tiny-model")
    dataset = write_dataset(dir / "data.jsonl")
    if max_steps is None:
        max_steps = long_steps(nproc) if long else QUICK_STEPS
    config = write_job(
        dir,
        require_human_approval=require_human_approval,
        max_steps=max_steps,
        extra=extra,
        model_dir=model,
        dataset=dataset,
    )
    return Job(dir=dir, model_dir=model, dataset=dataset, config=config, output_dir=dir / "out")


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def job_env(dir: Path | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a ForgeLM / torchrun child process.

    * ``FORGELM_OPERATOR`` — audit-log operator identity (else ``user@host``;
      with no resolvable user ForgeLM refuses to start).
    * ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` / ``HF_DATASETS_OFFLINE`` —
      ForgeLM sets them itself for ``model.offline: true``; set early anyway.
    * ``OMP_NUM_THREADS=1`` — 2 ranks on 2 cores; also silences torchrun's warning.
    * ``HF_HOME`` / ``HF_DATASETS_CACHE`` — when ``dir`` is given, keep the
      ``datasets`` Arrow cache (``load_dataset("json", ...)`` always writes one)
      out of ``~/.cache/huggingface``.
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


def forgelm_cmd(config: Path, *extra_args: str) -> list[str]:
    """Single-process argv: ``python -m forgelm.cli --config X --output-format json``."""
    return [
        PYTHON, "-m", "forgelm.cli", "--config", str(config), "--output-format", "json",
        *extra_args,
    ]  # fmt: skip


def torchrun_cmd(
    config: Path,
    *extra_args: str,
    nproc: int = 2,
    log_dir: Path | None = None,
    master_port: int | None = None,
) -> list[str]:
    """torchrun argv: ``torchrun --nproc-per-node N [...] -m forgelm.cli --config X ...``.

    With ``log_dir`` torchrun adds ``--log-dir D --redirects 3`` and writes each
    rank's output to ``D/<run_id>/attempt_0/<rank>/{stdout,stderr}.log`` (see
    :func:`torchrun_rank_logs`); its own stderr still carries the failure table
    (``rank : N`` / ``exitcode : C``).  ``--standalone`` picks a free
    rendezvous port unless ``master_port`` is given.
    """
    cmd = [TORCHRUN, "--nproc-per-node", str(nproc)]
    if master_port is None:
        cmd.append("--standalone")
    else:
        cmd += ["--master-addr", "127.0.0.1", "--master-port", str(master_port)]
    if log_dir is not None:
        cmd += ["--log-dir", str(log_dir), "--redirects", "3"]
    cmd += ["-m", "forgelm.cli", "--config", str(config), "--output-format", "json"]
    return [*cmd, *extra_args]


def recording_cli_cmd(events: Path, *args: str) -> list[str]:
    """``python -m forgelm_tui ARGS``, the CLI unchanged, that also appends every
    ``RankProgressed`` event of its session to ``events`` (JSON lines: rank, step, total,
    source): what a rank showed as its step all along, not only at the end."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            "import forgelm_job; forgelm_job.recording_cli()")
    return [PYTHON, "-c", code, str(events), *args]


def recording_cli() -> None:
    """``python -c ... EVENTS ARGS`` (:func:`recording_cli_cmd`): ``forgelm_tui.cli.entry``."""
    events, *args = sys.argv[1:]
    from forgelm_tui import cli
    from forgelm_tui.engine import events as ev
    from forgelm_tui.session import run

    sink = open(events, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (until os._exit)

    def record(event: ev.Event) -> None:
        if isinstance(event, ev.RankProgressed):
            sink.write(json.dumps({"rank": event.rank, "step": event.step, "total": event.total,
                                   "source": str(event.source)}) + "\n")

    session_init = run.Session.__init__

    def init(self: run.Session, *a: Any, **kw: Any) -> None:
        session_init(self, *a, **kw)
        self.subscribe(record)

    run.Session.__init__ = init  # type: ignore[method-assign]
    sys.argv = [sys.argv[0], *args]
    cli.entry()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rank_env(env: dict[str, str], rank: int, world_size: int, master_port: int) -> dict[str, str]:
    """Per-rank env for launching :func:`forgelm_cmd` by hand (what torchrun sets).

    Launching the ranks yourself is the way to see every rank's real exit code:
    torchrun SIGTERMs the surviving ranks as soon as one exits non-zero.
    """
    env = dict(env)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(master_port),
    )
    return env


def torchrun_rank_logs(log_dir: Path) -> dict[int, dict[str, Path]]:
    """``{rank: {"stdout": path, "stderr": path}}`` from a torchrun ``--log-dir``."""
    out: dict[int, dict[str, Path]] = {}
    for f in sorted(Path(log_dir).glob("*/attempt_*/*/std*.log")):
        if f.parent.name.isdigit():
            out.setdefault(int(f.parent.name), {})[f.stem] = f
    return out


def read_audit_log(output_dir: Path) -> list[dict[str, Any]]:
    """Parse ``<output_dir>/audit_log.jsonl`` (empty list if absent).

    Under torchrun BOTH ranks append to this one file, each with its own
    ``run_id`` (ForgeLM 0.11.1 has no rank awareness).
    """
    path = Path(output_dir) / "audit_log.jsonl"
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def parse_json_stdout(text: str) -> list[dict[str, Any]]:
    """Every top-level JSON object found in ``text`` (non-JSON noise is skipped).

    Exit 4/0/3 print a pretty (indent=2) envelope; error paths print a one-line
    ``{"success": false, "error": ...}``.  Under torchrun without ``--redirects``
    both ranks' envelopes arrive on one stream, so this returns a list.
    """
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    i = 0
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


def result_envelope(text: str) -> dict[str, Any] | None:
    """The last ForgeLM result envelope (a dict with ``success``) in ``text``, or None.

    stdout is NOT pure JSON even with ``--output-format json``: PEFT prints
    ``trainable params: ...`` and the HF progress callback prints per-step
    ``{'loss': ...}`` Python dicts (single-quoted, not JSON) before the envelope.
    """
    found = [o for o in parse_json_stdout(text) if "success" in o]
    return found[-1] if found else None


# ---------------------------------------------------------------------------
# Smoke test: python tests/forgelm_job.py [DIR] [--ranks N] [--long] [--no-approval]
# ---------------------------------------------------------------------------


def _main(argv: list[str]) -> int:
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
    base = Path(args.dir or tempfile.mkdtemp(prefix="forgelm-job-")).resolve()
    job = make_job(
        base, require_human_approval=not args.no_approval, long=args.long, nproc=args.ranks
    )
    env = job_env(base)
    if args.ranks <= 1:
        cmd = forgelm_cmd(job.config)
    else:
        cmd = torchrun_cmd(job.config, nproc=args.ranks, log_dir=base / "torchrun-logs")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=base, capture_output=True, text=True)
    wall = time.monotonic() - t0
    print(f"dir={base} rc={proc.returncode} wall={wall:.1f}s", file=sys.stderr)
    envelope = result_envelope(proc.stdout)
    if envelope is not None:
        print(json.dumps(envelope, indent=2))
    if args.ranks > 1:
        for rank, files in torchrun_rank_logs(base / "torchrun-logs").items():
            env_obj = result_envelope(files["stdout"].read_text()) or {}
            keys = ("success", "awaiting_approval", "run_id", "error")
            summary = {k: env_obj.get(k) for k in keys}
            print(f"rank {rank}: {summary}", file=sys.stderr)
        for line in proc.stderr.splitlines():
            if "exitcode" in line:
                print("torchrun:", line.strip(), file=sys.stderr)
    print("audit events:", [e["event"] for e in job.audit_events()], file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
