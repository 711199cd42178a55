"""Everything autoplan changes in DTensor (and in fake tensors), in one place, and only while in use.

``overrides.py`` installs the pieces below while autoplan plans or runs an applied model,
and restores torch afterwards; importing any autoplan module changes nothing.

- ``rules.py``: sharding rules DTensor lacks (CPU fused attention, ``fill_`` with a tensor,
  the replicate fallback for ops without a rule).
- ``view_rules.py``: reshaping views never make a ``_StridedShard``.
- ``strategy_choice.py``: DTensor's per-op strategy choice kept from splitting values on
  axes the plan leaves whole.
- ``saved_inputs.py``: a forward redistribution autograd saved is not repeated in the backward.
- ``fake_kernels.py``: fake-tensor kernels for what the device kernels accept (float32 grouped mm).
- ``strategies.py``: candidate strategies of one ATen op, read from DTensor's registry.
- ``fused_attention.py``: ``scaled_dot_product_attention`` traced and run as the fused kernel.
"""
