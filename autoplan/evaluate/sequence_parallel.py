"""The module boundaries of torchtitan's tensor-parallel recipe, as plan layouts.

torchtitan runs tensor parallel with sequence parallel and loss parallel: between the
projections, activations are split along the sequence on the tp axis; each norm runs on
its slice of the sequence; the attention and MLP blocks gather the sequence at their
column-parallel input and hand back a sequence slice from their row-parallel output
(a reduce-scatter); the token embedding, split by vocabulary rows, hands back a sequence
slice too; and the output head, split by vocabulary, leaves the logits split by class
for a loss that runs on them split. The batch stays split on dp throughout.

``pin_sequence_parallel`` pins those boundaries on a problem: norms (modules whose type
name ends in ``Norm``) in and out, as a plan's own module layouts are pinned
(``Pins.module_boundaries``), and the outputs of the token embeddings and the blocks
where they are read. A block's output is the row-parallel projection's partial sum, which
no op strategy makes a sequence slice: the readers after it read it as one (the
reduce-scatter torchtitan's ``RowwiseParallel(output_layouts=Shard(1))`` runs). The
logits are left to the solver: loss parallel swaps in a cross-entropy that runs on
class-split logits (``torch.distributed.tensor.parallel.loss_parallel``), which DTensor's
strategies, and so autoplan's plans, do not have; pinned split by class, the plain loss
would gather every logit, which torchtitan never does. Only activations shaped ``[batch,
sequence, features]`` whose batch and sequence divide the axes are laid out (a norm over
attention heads, Qwen3's q/k norm, is not); everything else is left to the solver.
"""

from __future__ import annotations

from autoplan.pipeline.pinning import Pins
from autoplan.pipeline.problem import Problem
from autoplan.placements import Spec, replicated, shard
from autoplan.plan.module_plan import ModuleLayout

SEQUENCE_DIM = 1
HEADS = ("lm_head", "output")
"""Names of the output head (HF, torchtitan): split by vocabulary."""


def pin_sequence_parallel(pins: Pins, problem: Problem, dp: int | None, tp: int, row_parallel: set[str]) -> tuple[int, int]:
    """Pin torchtitan's sequence-parallel boundaries; (pinned, could not hold) counts.
    ``row_parallel``: the FQNs of the row-parallel projections (their parents are the
    attention and MLP blocks)."""
    traced = problem.traced
    mesh = problem.choices.mesh_shape
    nodes = {node.name: node for node in traced.graph_module.graph.nodes}
    batch = _batch_size(problem)
    blocks = {fqn.rpartition(".")[0] for fqn in row_parallel}

    def sequence_split(node_name: str) -> Spec | None:
        """The sequence-parallel layout of a hidden-states tensor; None for anything else."""
        source, index = traced.value_of(node_name)
        value = nodes[source].meta.get("val") if source in nodes else None
        if isinstance(value, (tuple, list)):
            value = value[index]
        shape = tuple(getattr(value, "shape", ()))
        if len(shape) != 3 or shape[0] != batch or shape[SEQUENCE_DIM] % mesh[tp]:
            return None
        if dp is not None and shape[0] % mesh[dp]:
            return None
        spec = list(replicated(len(mesh)))
        spec[tp] = shard(SEQUENCE_DIM)
        if dp is not None:
            spec[dp] = shard(0)
        return tuple(spec)

    def first_activation(tensors) -> dict[str, Spec]:
        """The first tensor (by key path) shaped as hidden states, laid out: a norm's or a
        block's hidden states, not its mask or rotary tables."""
        for key, node in tensors:
            spec = sequence_split(node)
            if spec is not None:
                return {key: spec}
        return {}

    layouts: dict[str, ModuleLayout] = {}
    pinned = skipped = 0
    for call in traced.module_calls:
        kind = traced.module_types.get(call.fqn, "")
        if kind.endswith("Norm"):
            layouts[call.fqn] = ModuleLayout(inputs=first_activation(call.inputs), outputs=first_activation(call.outputs))
        elif call.fqn in blocks or kind == "Embedding":
            for key, spec in first_activation(call.outputs).items():
                ok = _read_after(pins, problem, traced.value_of(dict(call.outputs)[key]), call.fqn, spec)
                pinned, skipped = pinned + ok, skipped + (not ok)
    done, failed = pins.module_boundaries(layouts)
    return pinned + done, skipped + failed


def _read_after(pins: Pins, problem: Problem, value: tuple[str, int], block: str, spec: Spec) -> bool:
    """Every reader of ``value`` outside ``block`` reads it as ``spec``."""
    graph = problem.choices.graph
    owners = problem.traced.node_modules
    source, out_index = value
    if source not in graph:
        return False
    ok = True
    for _, reader, k, read in graph.reads(source):
        owner = owners.get(reader, "")
        if read == out_index and owner != block and not owner.startswith(block + "."):
            ok &= pins.consumed(reader, k, spec, f"module {block} output read by {reader}")
    return ok


def _batch_size(problem: Problem) -> int | None:
    shapes = [
        tuple(node.meta["val"].shape)
        for node in problem.traced.graph_module.graph.nodes
        if node.op == "placeholder" and node.name in problem.traced.inputs
    ]
    return shapes[0][0] if shapes and shapes[0] else None
