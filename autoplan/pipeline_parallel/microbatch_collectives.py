"""The collectives a pipelined plan predicts: its layout's, for one microbatch.

A rank of a pipeline runs, per microbatch, the forward and backward of its stages' modules
on its stage mesh; what those modules run is what the layout runs on a batch of one
microbatch. So the prediction is made as ``autoplan.suggest`` makes a plain plan's
(``pipeline/repricing.py``): a dry run of the layout's step on fake tensors with the batch
cut to one microbatch, the rules of ``plan/builder.predict`` where the step cannot run so.
``verify/pipeline_counts.predicted_counts`` then runs each module's rows once per microbatch
on the ranks holding it, and adds the point-to-point sends it derives from the stages.

Checkpointing is the pipeline's, not the layout's: each stage checkpoints its first blocks
(``PipelineOption``), which no prefix of the whole stack describes. A block checkpointed
reruns its forward's collectives in the backward, so the table is made twice where any
block is checkpointed, every block plain and every block checkpointed, and each block's
rows taken from the table of its own checkpointing.
"""

from __future__ import annotations

from dataclasses import replace

from torch.utils._pytree import tree_map

from autoplan.pipeline.repricing import StepInputs, priced_plan
from autoplan.plan.module_plan import total_table
from autoplan.solve.ilp import Solution
from autoplan.trace.repeats import RepeatedBlocks


def microbatch_of(batch, sequences: int, microbatches: int):
    """``batch`` with every tensor whose dim 0 is the batch's ``sequences`` cut to its first
    microbatch (as ``Pipelined.step`` chunks it: dim 0 in ``microbatches`` equal pieces)."""
    rows = sequences // microbatches

    def cut(leaf):
        if hasattr(leaf, "shape") and len(leaf.shape) > 0 and leaf.shape[0] == sequences:
            return leaf[:rows]
        return leaf

    return tree_map(cut, batch)


def layout_collectives(problem, solution: Solution, step: StepInputs, recompute: dict[str, str],
                       blocks: RepeatedBlocks) -> tuple[dict, dict]:
    """(module_collectives, collectives) of one microbatch's step of ``solution``'s layout with
    ``recompute`` (block FQN -> mode) checkpointed: ``problem`` with ``step`` (its batch one
    microbatch) priced as ``repricing.priced_plan`` prices a plain plan."""
    problem = replace(problem, step=step)
    plain = priced_plan(problem, replace(solution, recompute=None, recompute_layers=0))[0].predicted.module_collectives
    modes = sorted(set(recompute.values()))
    if not modes:
        return plain, total_table(plain)
    table = {m: rows for m, rows in plain.items() if _mode(blocks, recompute, m) is None}
    for mode in modes:
        checked = replace(solution, recompute=mode, recompute_layers=blocks.count)
        rows_of = priced_plan(problem, checked)[0].predicted.module_collectives
        table.update({module: rows for module, rows in rows_of.items() if _mode(blocks, recompute, module) == mode})
    table = dict(sorted(table.items()))
    return table, total_table(table)


def _mode(blocks: RepeatedBlocks, recompute: dict[str, str], module: str) -> str | None:
    """How ``module``'s block is checkpointed (None: not, or not in a block)."""
    layer = blocks.layer_of(module)
    return None if layer is None else recompute.get(blocks.layer_prefix(layer))
