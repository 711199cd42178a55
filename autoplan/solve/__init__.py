"""Stage 4, solve: one strategy per decision, by an integer linear program (OR-Tools).

Entry point ``ilp.solve(costed, budget_bytes, ...) -> Solution``; before it the problem is
shrunk (``simplify.py``: followers merged; ``tie.py``: identical layers tied), and a greedy
feasible start is found (``warm_start.py``).
"""
