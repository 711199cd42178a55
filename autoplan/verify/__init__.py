"""Stage 7, verify: hold an applied plan to its word.

Entry point ``step_check.verify_plan(model, batch, plan, device_mesh) -> Verification``:
the collectives one training step runs (``observe.py``) against the prediction; also
numerics against one device (``numerics.py``) and measured step times (``measure.py``).
"""
