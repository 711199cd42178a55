"""Stage 2, choices: the placement-choice graph, one decision per value with DTensor's strategies.

Entry point ``graph.build_choices(traced, mesh, axis_names) -> ChoiceGraph``.
"""
