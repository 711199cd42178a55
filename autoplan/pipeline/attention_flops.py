"""Attention's score and value products in one training step, for MFU at long sequences.

``explain/mfu.py`` counts a model's FLOPs as 6 x parameters x tokens, which leaves out
attention's two products of the sequence with itself: ``Q K^T`` and ``P V``, each
``2 x batch x heads x queries x keys x head_dim`` FLOPs forward and twice that backward,
12 x batch x heads x queries x keys x head_dim per attention call and step. That is PaLM's
count (its appendix B: 12·L·H·Q·T per token) and torchtitan's, the causal mask's skipped
half included, as they count it. At 131072 tokens it is most of the step's FLOPs.

Counted on the traced step (``F.scaled_dot_product_attention`` as the fused op,
``dtensor/fused_attention.py``); a stack of identical layers traced a few layers deep
counts one layer's calls per layer of the full model.
"""

from __future__ import annotations

from autoplan.dtensor.fused_attention import FUSED_FORWARD


def attention_flops(traced, blocks) -> float:
    """12 x batch x heads x queries x keys x head_dim over every fused attention call of the
    step traced in ``traced`` (a ``TracedGraph``), widened to ``blocks.count`` layers."""
    outside = 0.0
    per_layer: dict[int, float] = {}
    for node in traced.graph_module.graph.nodes:
        if node.op != "call_function" or node.target is not FUSED_FORWARD:
            continue
        query, key = node.args[0].meta["val"], node.args[1].meta["val"]
        batch, heads, queries, head_dim = query.shape
        flops = 12.0 * batch * heads * queries * key.shape[-2] * head_dim
        layer = blocks.layer_of(traced.node_modules.get(node.name, "")) if blocks is not None else None
        if layer is None:
            outside += flops
        else:
            per_layer[layer] = per_layer.get(layer, 0.0) + flops
    if not per_layer:
        return outside
    return outside + max(per_layer.values()) * blocks.count
