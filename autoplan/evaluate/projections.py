"""Which modules are the projections tensor parallelism splits, told by name (as data).

Shared by the baselines (``baselines.py``) and by ``explain`` and ``show``, which describe
and propose layouts in the same terms; its own module so that those need not import the
baselines (which score plans, and ``score`` prints with ``show``).
"""

from __future__ import annotations

# Module name suffixes (torchtitan's per-family TP plans, as data). A module matches when
# its FQN is the suffix or ends with "." + suffix.
COLUMN_PARALLEL = (
    "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj",  # Llama, Mistral, Mixtral attention
    "wq", "wk", "wv", "wqkv", "w1", "w3",  # torchtitan (wqkv: fused, grouped per kv head) / torch's test Transformer
    "c_attn", "c_fc",  # GPT-2 (Conv1D)
    "query", "key", "value", "intermediate.dense",  # BERT
)
ROW_PARALLEL = (
    "o_proj", "down_proj",
    "wo", "w2",
    "c_proj",
    "output.dense",  # BERT: attention.output.dense and the layer's output.dense
)
# Weight dims per module type: (dim sharded when column-parallel, when row-parallel);
# GPT-2's Conv1D stores its weight input x output.
WEIGHT_DIMS = {"Linear": (0, 1), "Conv1D": (1, 0)}


def projection_role(module: str) -> str | None:
    """The split a module named as a projection takes ("column" or "row"), else None."""

    def matches(suffix: str) -> bool:
        return module == suffix or module.endswith("." + suffix)

    if any(matches(s) for s in ROW_PARALLEL):  # before column: "output.dense" vs "dense"
        return "row"
    if any(matches(s) for s in COLUMN_PARALLEL):
        return "column"
    return None
