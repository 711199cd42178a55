"""Llama-3-8B as ``examples/llama3_8b.py`` builds it (Meta's config, bfloat16, all 32 layers),
at a training batch of 64 sequences of 4096 tokens (262,144 tokens per step): the shape
issue 45 compares baselines at on an 8x8 mesh.

    python benchmarks/baselines.py benchmarks/models/llama3_8b_4k.py --mesh 8x8
"""

from pathlib import Path
from runpy import run_path

import torch

# The example's model, not a second copy of its config: only the batch differs.
_EXAMPLE = run_path(str(Path(__file__).resolve().parents[2] / "examples" / "llama3_8b.py"))
build_model = _EXAMPLE["build_model"]
VOCAB_SIZE = _EXAMPLE["VOCAB_SIZE"]
SEQUENCES, SEQ_LEN = 64, 4096


def example_inputs():
    return dict(
        input_ids=torch.randint(0, VOCAB_SIZE, (SEQUENCES, SEQ_LEN)),
        labels=torch.randint(0, VOCAB_SIZE, (SEQUENCES, SEQ_LEN)),
    )
