"""Program run under the graceful runner: builds an HF Trainer (tiny random GPT-2, nothing
downloaded) and prints, as JSON, the Trainer's callbacks, whether transformers was imported
before the program imported it, and whether the Trainer's source can still be read.

argv: OUTPUT_DIR
"""

import inspect
import json
import sys

imported_before = "transformers" in sys.modules

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

model = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                                    bos_token_id=0, eos_token_id=0))
args = TrainingArguments(output_dir=sys.argv[1], report_to="none", use_cpu=True)
trainer = Trainer(model=model, args=args)
print(json.dumps({
    "imported_before": imported_before,
    "callbacks": [type(c).__name__ for c in trainer.callback_handler.callbacks],
    "source_readable": "def train" in inspect.getsource(Trainer),
}))
