"""The planning pipeline: trace -> choices -> cost -> solve -> plan, and what wraps it.

``suggest.py`` runs the stages; ``pinning.py`` solves with some decisions fixed (what
``score`` and the baselines ask); ``cached.py`` puts the plan cache (``plan_cache.py``) and
the rank-0 broadcast (``rank_sync.py``) around it.
"""
