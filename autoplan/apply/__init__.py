"""Stage 6, apply: run a plan with DTensor on an N-D device mesh.

Entry point ``engine.apply_plan(model, plan, device_mesh) -> nn.Module``; a model built on
the meta device gets only its local shards (``materialize.py``).
"""
