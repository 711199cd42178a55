"""Stage 5, plan: the module-level plan, its JSON form, and how a solution becomes one.

Entry point ``builder.build_plan(costed, choice, solution) -> Plan`` (``module_plan.py``),
with the collectives the step will run (``collectives.py``, following each gradient back by
``gradient_rules.py`` and ``split_gradients.py`` from the values that get one,
``reached.py``, each value's readers' parts summed by ``value_gradient.py``, asking
DTensor where it decides at run time, ``runtime_choice.py`` and ``runtime_backward.py``,
and ``loss_reductions.py``), where each parameter is gathered (``parameter_uses.py``)
and a tied plan widened to every layer (``expand.py``).
"""
