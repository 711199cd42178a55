"""The planning pipeline: trace -> choices -> cost -> simplify -> solve -> plan, and what wraps it.

``problem.py`` builds the planning problem once (identical layers tied) and solves it;
``pinning.py`` fixes some of its decisions (``Pins``). ``suggest``, ``score`` and the
baselines all solve that one problem. ``suggest.py`` runs it once with a report;
``cached.py`` puts the plan cache (``plan_cache.py``) and the rank-0 broadcast
(``rank_sync.py``) around that, and holds the public ``autoplan.suggest``.
"""
