"""Stage 3, cost: the time and memory of every strategy and every edge, for one training step.

Entry point ``estimate.estimate_costs(choices, profile) -> CostedGraph``; the cluster
profile it prices with (``profile.py``), communication (``comm.py``) and per-op fixed
costs (``op_classes.py``).
"""
