"""The pipelined plan: the stage mesh's layout with the chosen stages, schedule and checkpointing.

Stages name module FQNs whose whole subtrees they hold: the modules before the stack with
the first stage, its blocks (``<stack>.<i>``) in runs, the modules after it with the last.
The modules before and after are the shallowest that hold only parameters and buffers of
one side of the stack (``model.embed_tokens``, ``model.norm``, ``lm_head`` rather than
``model``, which holds the stack). The prediction is the pipeline's: step time the
schedule's makespan plus the once-per-step work, peak the busiest stage's; its split into
compute and communication is the pipeline's sends plus the rest split as the layout's own
prediction splits its step. Its collective tables are the layout's for one microbatch
(``microbatch_collectives.py``), each module's rows run once per microbatch by the ranks
holding it; the sends between stages are not in them (``verify/pipeline_counts.py``
derives those from the stages).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from autoplan.errors import OptionError
from autoplan.pipeline_parallel.search import PipelineOption
from autoplan.plan.module_plan import Plan, Predicted, SolverReport, rounded
from autoplan.plan.pipeline_plan import Alternative, PipelinePlan, Stage
from autoplan.trace.repeats import RepeatedBlocks
from autoplan.tree_paths import fqn_within


def outer_modules(names: list[str], named: dict[str, str], stack: str) -> dict[str, list[str]]:
    """"pre" and "post" -> module FQNs (in ``names``' order) covering the parameters ``named``
    puts there; ``names``: every parameter FQN of the model (modules holding only buffers,
    a rotary table, are no stage's: every stage keeps them)."""
    outside = [n for n in names if not fqn_within(n, stack)]
    side = {n: named.get(n, "pre") for n in outside}  # untraced ones ride with the first stage
    covers: dict[str, list[str]] = {"pre": [], "post": []}
    for name in outside:
        parts = name.split(".")
        module = name
        for depth in range(1, len(parts)):
            prefix = ".".join(parts[:depth])
            if fqn_within(stack, prefix):
                continue  # an ancestor of the stack: its subtree is not one side's
            if all(side[n] == side[name] for n in outside if fqn_within(n, prefix)):
                module = prefix
                break
        if module not in covers[side[name]]:
            covers[side[name]].append(module)
    return covers


def pipelined_plan(layout: Plan, option: PipelineOption, blocks: RepeatedBlocks, covers: dict[str, list[str]],
                   axis: str, axis_index: int, alternatives: tuple[Alternative, ...] = (),
                   tables: Callable[[dict[str, str]], tuple[dict, dict]] | None = None) -> Plan:
    """``layout`` (the stage mesh's plan) with ``option``'s pipeline. ``tables``: given the
    stages' checkpointing (block FQN -> mode), the layout's (module_collectives, collectives)
    for one microbatch; without, they are left empty."""
    if layout.tied_parameters and len(option.stages) > 1:
        tied = ", ".join(f"{a} = {b}" for a, b in sorted(layout.tied_parameters.items()))
        raise OptionError(f"tied weights ({tied}) would be needed on two pipeline stages; untie them "
                        "(tie_word_embeddings=False in a HuggingFace config) or plan without a pp axis")
    last = len(option.stages) - 1
    stages, recompute = [], {}  # recompute: block FQN -> "full" or "selective"
    for i, price in enumerate(option.stages):
        modules = list(covers["pre"]) if i == 0 else []
        modules += [blocks.layer_prefix(price.first_block + j) for j in range(price.blocks)]
        modules += list(covers["post"]) if i == last else []
        if not modules:
            raise OptionError(f"pipeline stage {i} would hold no module; plan with fewer stages")
        for j in range(price.recomputed_blocks if price.recompute else 0):
            recompute[blocks.layer_prefix(price.first_block + j)] = str(price.recompute)
        stages.append(Stage(tuple(modules), price.rank, rounded(price.forward_s), rounded(price.backward_s),
                            int(price.peak_bytes)))
    pipeline = PipelinePlan(axis, option.size, axis_index, option.schedule.name, option.microbatches, tuple(stages),
                            rounded(option.bubble_share), rounded(option.p2p_s), alternatives)
    step = option.step_s
    # the layout's own split of compute and collectives, carried over to what is not sends
    own = layout.predicted
    comm_share = own.comm_s / own.step_time_s if own.step_time_s > 0 else 0.0
    comm = option.p2p_s + comm_share * (step - option.p2p_s)
    state = max(p.state_bytes for p in option.stages)
    peak = int(option.peak_bytes)
    # AdamW's state as the cost stage counts it: parameters, gradients, two moments, alike in size
    memory = {"parameters": int(state / 4), "buffers": 0, "gradients": int(state / 4), "optimizer": int(state / 2),
              "temporaries": 0}
    memory["activations"] = peak - sum(memory.values())
    module_collectives, collectives = tables(recompute) if tables is not None else ({}, {})
    predicted = Predicted(step_time_s=rounded(step), compute_s=rounded(step - comm), comm_s=rounded(comm),
                          peak_memory_bytes=peak, model_state_bytes=int(state),
                          activation_bytes=int(max(0.0, option.peak_bytes - state)), memory=memory,
                          collectives=collectives, module_collectives=module_collectives)
    solver = SolverReport(layout.solver.status, rounded(step), rounded(step * (1 - layout.solver.gap)), layout.solver.gap,
                          layout.solver.memory_budget_bytes)
    warnings = tuple(w for w in layout.warnings if "does not fit" not in w)
    if not option.fits:
        warnings += ((f"no pipeline of {len(option.stages)} stages fits the per-device budget: the busiest stage "
                      f"needs {option.peak_bytes / 2**30:.2f} GiB"),)
    return replace(layout, predicted=predicted, solver=solver, recompute=recompute, pipeline=pipeline, warnings=warnings)
