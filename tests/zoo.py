"""The public zoo the zoo tests run: example model files, meshes, and a sharding-forcing budget."""

from __future__ import annotations

from conftest import EXAMPLES

PUBLIC_ZOO = ("mlp", "cnn", "transformer", "gpt2", "bert", "llama")
"""examples/<name>.py: MLP, CNN with BatchNorm, torch's test Transformer, GPT-2, BERT, Llama (GQA)."""
HARD_CASES = ("llama_uneven", "moe")
MESHES = {(8,): ("dp",), (2, 4): ("dp", "tp"), (2, 2, 2): ("pp", "dp", "tp")}


def example_path(name: str) -> str:
    return str(EXAMPLES / f"{name}.py")


def sharding_budget_gb(plan) -> float:
    """A budget that the unconstrained plan exceeds: half its model state must be sharded away."""
    predicted = plan.predicted
    return (predicted.peak_memory_bytes - 0.5 * predicted.model_state_bytes) / 2**30
