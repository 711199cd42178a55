"""Llama-3-8B as ``examples/llama3_8b.py`` builds it (Meta's config, bfloat16, all 32 layers),
at 8 sequences of 131072 tokens (1,048,576 tokens per step), the long-context row of issue 48.

The batch is ``autoplan.sequence_batch.causal_lm_batch``'s: position ids and labels shifted
beforehand, and a mask of ones (no padding), so that the sequence can be split in a
load-balanced order (context parallel). Planned without a context axis, the extra keys
change nothing: the model reads them as it reads its own.

    python -m autoplan suggest benchmarks/models/llama3_8b_128k.py --mesh 8x8 --axis-names dp,cp --context-axis cp
"""

from pathlib import Path
from runpy import run_path

import torch

from autoplan.sequence_batch import causal_lm_batch

# The example's model, not a second copy of its config: only the batch differs.
_EXAMPLE = run_path(str(Path(__file__).resolve().parents[2] / "examples" / "llama3_8b.py"))
build_model = _EXAMPLE["build_model"]
VOCAB_SIZE = _EXAMPLE["VOCAB_SIZE"]
SEQUENCES, SEQ_LEN = 8, 131072


def example_inputs():
    return causal_lm_batch(
        torch.randint(0, VOCAB_SIZE, (SEQUENCES, SEQ_LEN)),
        torch.randint(0, VOCAB_SIZE, (SEQUENCES, SEQ_LEN)),
    )
