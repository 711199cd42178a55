"""The collectives one training step of a solved plan runs.

One entry per collective: the module whose op causes it, its kind, mesh axis and bytes
(nccl-tests sizes, as in ``cost/comm.py``), in the way ``apply_plan`` and DTensor run them.
Each op runs the strategy DTensor picks for the layouts its inputs arrive in
(``runtime_choice.py``): the plan's, mostly; where DTensor picks another (an equal-cost
move of the other input, a view run on its input as it arrives), that one, and the
layout it makes is what the next readers get (a module output hook moves it to the
plan's layout for the readers outside the module, after those inside have read it; its
backward runs for a gradient from outside). Parameters arrive as their op asks: the
module's hook gathers them (``Plan.parameter_uses``), once per call of the outermost
module whose hook moves them, for every read inside, views included; one whose uses ask
for different layouts has no hook and arrives at each op as stored
(``parameter_uses.gathered_parameters``).

- each module input the plan lays out: the module's input hook (``apply_plan``) moves the
  value once per call, from the layout it arrives in (its producer's, or an enclosing
  module's), for every reader inside; charged to that module;
- each edge whose reader asks for another layout than the value arrives in (from its
  producer or the innermost boundary it crossed): ``comm.redistribute_collectives``,
  charged to the consumer's module. A view runs on its input as it arrives (DTensor
  moves nothing for it where one of its strategies takes that layout), so a boundary
  that lays a value out for the compute op behind a reshape leaves that op nothing to
  move;
- gradients go back the same way (each op's rule: ``plan/gradient_rules.py``; each
  value's sum: ``plan/value_gradient.py``): each reader's gradient is partial on each
  axis over which it splits its work while reading
  the value replicated, a view, a copy or an add passes
  its output's gradient on to its input as it is (split where a slice further on split
  it; an expand's sum over a split broadcast dim is partial; reduced where a view's
  backward copies it, ``plan/gradient_strides.py``; gathered where a reshape's backward
  cannot keep its split, ``split_gradients.reshaped_gradient``; a slice's split on the
  sliced dim goes where DTensor's ``slice_backward`` asks, ``sliced_gradient``), a move DTensor made inside an op
  (a gather, a reduction, a slice) has no backward, so the op's gradient goes back as its
  backward made it, autograd sums the readers' gradients in the order
  they are ready (DTensor adds a replicated one to a partial one as partial, and reduce-scatters a partial one added
  to a split one, each time; a boundary hook that moved nothing makes no sum of its
  own), and each move sends the sum back in DTensor's order of axes
  (``gradient_collectives``): a partial gradient of a moved value is reduced there (an
  FSDP parameter's gradient is reduce-scattered there);
- a partial gradient goes on unreduced through the backward of an op that is linear in
  it and reads nothing split on that axis (a pointwise op of one tensor, an op with a
  scalar, a sum or mean: an RMSNorm's rsqrt, eps add and mean of squares; a pad, a fill
  of a scalar, a triangular solve: Qwen3-Next's chunked delta rule; a product of
  operands read whole: a gated MLP's ``act(gate) * up``, an experts' grouped matrix
  product; a split, whose backward joins its outputs' gradients; DTensor's forward move
  of such an op's input ran below autograd and has no backward), to the first op whose
  backward does (``carries_partial``); an experts' grouped product whose operands were
  saved split carries it on where DTensor, asked, moves the saved operands instead
  (``runtime_backward.grouped_backward_moves``: Qwen2-MoE gathers its weight); a matrix
  product that moved an operand inside its forward (autograd saved it unmoved) hands its
  inputs the gradients of the backward products DTensor picks for the operands as saved
  (``runtime_backward.product_backward``: Segformer's MLP gathers the smaller gradient
  rather than its weight once more); an elementwise product of two operands of its shape,
  or a ``mm`` or ``bmm``, whose output gradient comes in another layout than it made, runs
  each input's backward product as DTensor, asked, picks its moves
  (``runtime_backward.runs_elementwise_backward``, ``runs_product_backward``: Llama 4's
  experts); a product
  whose output gradient came back whole where it was made split hands its inputs whole
  gradients where the other operands were read whole (``whole_product_gradient``);
  an input whose gradient the op's backward makes last with a kernel DTensor runs on
  whole tensors only gets it whole, gathered and reduced there on every axis
  (``runtime_choice.replicated_gradient``: ``linalg_solve_triangular``'s ``tril``);
- a gradient split where a pointwise op made its output whole runs that op's backward
  split (DTensor slices the saved operands it multiplies by): the op's inputs get it
  split on their own dim, or partial where they were broadcast along it (an RMSNorm's
  ``x * rsqrt`` with the gradient split by hidden: ``rsqrt``'s gradient is partial, and
  reduce-scattered where it is added to ``x``'s split one) (``split_through``);
- a split's backward joins its outputs' gradients as they come, in the layout DTensor's
  ``cat`` picks for them, moving each part only as far as that asks
  (``runtime_choice.joined_gradient``): MPT's chunked q/k/v;
- a partial gradient left where the value was made: one reduction per value and axis
  brings it to the value's layout (``apply_plan`` hooks module outputs and parameters to
  do so): a reduce_scatter where the value is sharded on that axis, else an all_reduce,
  of the partial sum each rank holds. Charged to the module that made the value; for a
  parameter, to its own module; an ``index``'s gradient goes to the layout DTensor's
  ``index_put`` reads it in (``runtime_backward.index_backward_read``);
- the loss (``plan/loss_reductions.py``): a loss left partial on an axis is all-reduced there
  (at the root), and so is a mean ``nll_loss``'s count of targets, in its backward;
- what an op runs itself: cross-entropy on logits split by class all-reduces row
  statistics and the loss on that axis (``dtensor/loss_parallel.py``), in its own module.

The cost stage prices the same collectives, except that it charges each reader a share
of a shared gradient reduction and a move of its own (where a module boundary moves a
value once for all its readers), ignores the order of axes on a gradient's way back,
prices a move over several axes on a stand-in shape (``cost/comm.py``; here each value's
own shape decides DTensor's path), and leaves out the loss's all_reduces
(``plan/loss_reductions.py`` says why).

For a tied plan (``solve/tie.py``) the table covers the traced layers; ``plan/expand.py``
copies the last one's entries to every later layer.
"""

from __future__ import annotations

from collections import Counter

import torch

from autoplan.choices.graph import OP, PARAMETER, planning_mesh
from autoplan.cost.comm import (
    gradient_collectives,
    redistribute_collectives,
    without_partial,
)
from autoplan.cost.estimate import CostedGraph, output_values, tensor_bytes
from autoplan.dtensor import context_attention, overrides
from autoplan.dtensor.loss_parallel import own_collectives
from autoplan.dtensor.strategies import SHAPE_ONLY_OPS, Strategy
from autoplan.placements import REPLICATE, is_partial
from autoplan.plan.boundaries import (
    Boundary,
    crossed_boundary,
    inside_only_outputs,
    module_boundaries,
    output_hooks,
    output_nodes,
    rejoined_outputs,
)
from autoplan.plan.gradient_rules import (
    gradient_reads,
    partial_axes,
    passes_gradient,
    views_follow,
)
from autoplan.plan.loss_reductions import loss_output, loss_reductions
from autoplan.plan.module_plan import ROOT_MODULE as ROOT
from autoplan.plan.module_plan import collective_table
from autoplan.plan.parameter_uses import (
    gathered_parameters,
    hook_calls,
    hook_gather,
    hooked_reads,
    parameter_module,
)
from autoplan.plan.reached import reached_by_backward
from autoplan.plan.recompute import recompute_collectives
from autoplan.plan.runtime_backward import (
    ASKED_PRODUCTS,
    elementwise_backward,
    embedding_backward,
    grouped_backward_moves,
    index_backward_read,
    product_backward,
    recentred_mean_moves,
    runs_elementwise_backward,
    runs_product_backward,
    runs_saved_value_backward,
    saved_value_backward,
)
from autoplan.plan.runtime_choice import (
    JOINS,
    added_gradients,
    joined_gradient,
    replicated_gradient,
    runtime_strategy,
)
from autoplan.plan.split_gradients import (
    matmul_split_axes,
    resplit_moves,
    resplit_through,
    split_through,
)
from autoplan.plan.value_gradient import (
    StepBackward,
    count_move,
    value_gradient,
    value_size,
)
from autoplan.plan.views import within


def step_collectives(
    costed: CostedGraph, choice: dict[str, int], modules: dict | None = None, recompute: dict[str, str] | None = None
) -> Counter:
    """``(module, kind, axis index, bytes) -> count`` for one step of the assignment ``choice``.

    ``modules``: the plan's module layouts (``Plan.modules``), whose boundary moves the
    apply engine runs once per call, for every reader inside. ``recompute``: the modules
    checkpointed (``Plan.recompute``), whose forward collectives partly run again
    (``plan/recompute.py``)."""
    choices = costed.choices
    graph = choices.graph
    mesh_shape = choices.mesh_shape
    owners = choices.traced.node_modules
    found: Counter = Counter()

    def module_of(name: str) -> str:
        return owners.get(name) or ROOT

    def planned_out(name: str, index: int):
        return graph.decision(name).strategies[choice[name]].output(index)

    boundaries = module_boundaries(choices, modules or {})
    exits = output_nodes(choices, modules or {})
    hooked_outputs = output_hooks(choices, modules or {})
    runs: dict[str, Strategy] = {}  # op -> the strategy DTensor runs, where it is not the plan's

    def made_by_op(name: str, index: int):
        """The layout ``name``'s op makes its output ``index`` in (DTensor's, where it runs another strategy)."""
        return runs[name].output(index) if name in runs else planned_out(name, index)

    def made(name: str, index: int, reader_module: str | None = None):
        """The layout a value leaves its producer in at run time (a module output: once
        its hook has put it in the plan's layout; for a reader in ``reader_module``, once
        the hooks of the modules it is not inside have: one inside reads it before)."""
        hooks = hooked_outputs.get((name, index))
        if hooks is not None:
            passed = [layout for fqn, layout in hooks if reader_module is None or not within(reader_module, fqn)]
            if passed:
                return passed[-1]
            return made_by_op(name, index)
        if name in runs and name not in exits:
            return runs[name].output(index)
        return planned_out(name, index)

    def parent_spec(b: Boundary):
        return b.parent.spec if b.parent is not None else made(*b.value, b.fqn)

    def arrival(u: str, out_index: int, reader: str):
        """(the boundary the reader sits behind or None, the layout the value arrives in)."""
        attach = crossed_boundary(boundaries.get((u, out_index), ()), module_of(reader), owners.get(u) or "")
        return attach, attach.spec if attach is not None else made(u, out_index, owners.get(reader) or "")

    # What DTensor runs, op by op, given what arrives (the plan's strategy where it agrees).
    # A parameter (or a view of one) arrives as the op asks: its module's hook gathers it
    # to that layout (``Plan.parameter_uses``).
    mesh = planning_mesh(mesh_shape, choices.axis_names)
    # Where no hook moves a parameter (its uses ask for different layouts), it arrives at
    # each op as stored, like any value (RWKV's time-mix weights, split twice on one dim,
    # read by a product and by ``1 - w``: DTensor gathers only what each op needs)
    gathered = gathered_parameters(choices, choice)
    weights: set[str] = set()
    with overrides.installed():
        for decision in graph.decisions():
            name = decision.name
            inputs = graph.inputs_of(name)
            if (decision.kind == PARAMETER and name in gathered) or (
                views_follow(graph, name) and len(inputs) == 1 and inputs[0][0] in weights
            ):
                weights.add(name)
                continue
            if decision.kind != OP or not inputs:
                continue
            planned = decision.strategies[choice[name]]
            arrived = [planned.inputs[k] if u in weights else arrival(u, i, name)[1] for u, i, k in inputs]
            if arrived == list(planned.inputs) and decision.fx_node.target not in SHAPE_ONLY_OPS:
                continue  # nothing to move: DTensor runs what the plan does
            run = runtime_strategy(decision, arrived, mesh)
            if run is not None and run != planned:
                runs[name] = run

    # Forward: each boundary moves its value once; each reader moves what arrives to what it reads.
    forward: list = []  # (where it runs, collective): what a checkpointed module's rerun repeats
    readers: dict[tuple[str, int], list] = {}
    # op -> {input index: (the layout autograd saved it in, the layout the op read it in)}:
    # a move DTensor makes inside an op runs below autograd, a module's hook moves above it
    operands: dict[str, dict[int, tuple]] = {}
    hooked = hooked_reads(graph, owners, made, gathered)
    calls = Counter(call.fqn for call in choices.traced.module_calls)
    order = {name: i for i, name in enumerate(graph.nodes)}  # when each node runs (its gradient is ready)
    hook_call = hook_calls(graph, owners, gathered, calls, order)
    gathers_counted: set[tuple[str, str]] = set()  # (parameter, module whose hook gathers it)
    for u, v, k, out_index in graph.reads():
        value = (u, out_index)
        attach, arrived = arrival(u, out_index, v)
        strategy = runs.get(v) or graph.decision(v).strategies[choice[v]]
        dst = strategy.inputs[k]
        nbytes, shape = value_size(graph, value)
        # A parameter's hook moves it to the layout the plan reads it in; where DTensor runs
        # another strategy, the op moves it on from there (Llama 4's experts: the hook gathers
        # the weight on dp to the plan's use, the product gathers it on tp)
        if (u, v, k) in hooked:
            arrived, used = hooked[(u, v, k)]
            if v in weights:
                dst = used  # a view of the parameter runs on what the hook made
        else:
            used = graph.decision(v).strategies[choice[v]].inputs[k] if u in weights else dst
        legs = hook_gather(u, gathered[u], owners.get(v) or "", arrived, calls, gathers_counted) if u in gathered else None
        if legs is None:
            legs = [(arrived, used, ("gather", module_of(v)) if u in weights else ("read", v), module_of(v), 1)]
        legs.append((used, dst, ("read", v), module_of(v), 1))
        for before, after, where, module, times in legs:
            for kind, axis, size, _ in redistribute_collectives(before, after, nbytes, mesh_shape, backward=False, shape=shape):
                found[(module, kind, axis, round(size))] += times
                forward.extend([(where, (module, kind, axis, round(size)))] * times)
        readers.setdefault(value, []).append((v, k, strategy, arrived, dst, attach, u in weights))
        # a parameter is saved as its hook moved it, anything else as it arrived
        operands.setdefault(v, {})[k] = (used if u in weights else arrived, dst)
    for value, chain in boundaries.items():
        nbytes, shape = value_size(graph, value)
        for b in chain:
            for kind, axis, size, _ in redistribute_collectives(
                parent_spec(b), b.spec, nbytes, mesh_shape, backward=False, shape=shape
            ):
                found[(b.fqn, kind, axis, round(size))] += 1
                forward.append((("boundary", b.fqn), (b.fqn, kind, axis, round(size))))
    reached = reached_by_backward(choices)
    # A module output hook puts what DTensor made in the plan's layout (where it ran
    # another strategy, or where the plan hands the output over as the reshapes outside
    # read it: ``builder._reshaped_outside``), and its backward brings the gradient back.
    for (name, index), hooks in hooked_outputs.items():
        before = made_by_op(name, index)
        nbytes, shape = value_size(graph, (name, index))
        outside = [owners.get(v) or "" for _, v, _, read in graph.reads(name) if read == index and v in reached]
        for fqn, layout in hooks:
            for kind, axis, size, _ in redistribute_collectives(before, layout, nbytes, mesh_shape, backward=False, shape=shape):
                found[(fqn, kind, axis, round(size))] += 1
                forward.append((("exit", name), (fqn, kind, axis, round(size))))
            # a gradient comes back through the hook only from readers outside its module
            # (GraniteMoE-SWA's attention returns its weights, which only its own product reads)
            if name in reached and any(not within(reader, fqn) for reader in outside):
                for kind, axis, size in gradient_collectives(without_partial(layout), before, nbytes, mesh_shape, shape):
                    found[(fqn, kind, axis, round(size))] += 1
            before = layout
    # A value a module was given and hands back (GPT-Neo's dropout of probability zero
    # returns its input) is moved by that module's hook where DTensor made it otherwise
    # than the plan: the move is charged where the value was made.
    for name in exits - {name for name, _ in hooked_outputs}:
        ran, wanted = (runs[name].output(0), planned_out(name, 0)) if name in runs else (None, None)
        if ran != wanted:
            assert ran is not None and wanted is not None  # both ran: a module's output is a tensor
            nbytes, shape = value_size(graph, (name, 0))
            for kind, axis, size, _ in redistribute_collectives(ran, wanted, nbytes, mesh_shape, backward=False, shape=shape):
                found[(module_of(name), kind, axis, round(size))] += 1
                forward.append((("exit", name), (module_of(name), kind, axis, round(size))))
            if name in reached:  # and its backward brings the gradient back to the layout DTensor made
                for kind, axis, size in gradient_collectives(without_partial(wanted), ran, nbytes, mesh_shape, shape):
                    found[(module_of(name), kind, axis, round(size))] += 1

    # A module output its hook moves, read inside the module too: nothing settles its
    # gradient's sum in the plan's layout, and its op's backward runs on it as on any op's.
    rejoined = rejoined_outputs(hooked_outputs, readers, reached, module_of, made_by_op)
    # A module output no reader after its module takes a gradient from (an attention's
    # weights it returns, read by its own product only): no hook's backward runs, and its
    # op's backward runs on the gradient its readers inside hand back, as on any op's.
    # Taken so where that op is a product whose backward DTensor is asked
    # (``runtime_backward.runs_elementwise_backward``, ``runs_product_backward``):
    # Switch Transformers' attention drops out its weights, and on torch 2.14 DTensor's
    # ``mul`` carries the partial gradient through the dropout mask as saved. Other ops
    # keep the hook's treatment: GraniteMoE-SWA's weights are a cast of the softmax, and
    # the cast's backward reduces the partial gradient on torch 2.14, where the planner's
    # rule for a pointwise op of one tensor would carry it on (``carries_partial``).
    unhooked = {
        value for value in inside_only_outputs(hooked_outputs, graph, reached, owners)
        if graph.decision(value[0]).fx_node.target in ASKED_PRODUCTS
    }
    back_exits = exits - {name for name, _ in rejoined} - {
        name for name in exits if any(v[0] == name for v in unhooked)
        and all(v in unhooked for v in hooked_outputs if v[0] == name)
    }

    def made_back(name: str, index: int):
        """The layout the gradient of ``name``'s output ``index`` meets its op's backward in."""
        if (name, index) in rejoined:
            return rejoined[(name, index)][2]
        return made_by_op(name, index) if (name, index) in unhooked else made(name, index)

    # Backward: each value's gradient, summed over its readers, goes back through the
    # boundaries it crossed; a view passes its output's gradient on to its input.
    grads: dict[tuple[str, int], tuple | None] = {}
    joined: set[str] = set()  # splits whose outputs' gradients DTensor's cat joins as they come

    def join(name: str) -> tuple | None:
        """The split ``name``'s output gradients joined as DTensor's ``cat`` joins them
        (``runtime_choice.joined_gradient``), the moves of the parts counted; None where
        DTensor cannot say (the parts are then settled where they were made)."""
        decision = graph.decision(name)
        if name in back_exits or decision.kind != OP or decision.fx_node.target not in JOINS:
            return None
        parts = [grads.get((name, i)) for i in range(len(output_values(decision)))]
        answer = joined_gradient(decision, parts, mesh)
        if answer is None:
            return None
        layout, reads = answer
        for index, (part, read) in enumerate(zip(parts, reads)):
            assert part is not None  # joined_gradient answers only where every part came
            nbytes, shape = value_size(graph, (name, index))
            count_move(found, module_of(name), part, read, nbytes, shape, mesh_shape)
        joined.add(name)
        return layout

    asked: dict[str, list | None] = {}  # grouped products -> DTensor's answer (``carries_on``)

    def carries_on(name: str, grad: tuple | None, operands_of: dict, made_as: tuple) -> tuple[bool, ...]:
        """The axes on which ``name``'s backward carries its partial gradient ``grad`` on:
        ``partial_axes``, or, for a grouped product DTensor runs on the partial gradient as
        it comes (``runtime_backward.grouped_backward_moves``), every axis where it is partial.
        The saved operands' moves that takes are counted once, but for a move the forward
        made and the backward repeats (``dtensor/saved_inputs.py`` keeps it)."""
        rule = partial_axes(graph, name, operands_of, made_as)
        if grad is None or not any(is_partial(g) and not r for g, r in zip(grad, rule)):
            return rule
        if name not in asked:
            saved = {k: pair[0] for k, pair in operands_of.items()}
            with overrides.installed():
                asked[name] = grouped_backward_moves(graph.decision(name), grad, saved, mesh)
            values = {k: (u, i) for u, i, k in graph.inputs_of(name)}
            for index, before, read in asked[name] or ():
                if read == operands_of[index][1]:
                    continue  # the forward's own move of it, kept
                nbytes, shape = value_size(graph, values[index])
                count_move(found, module_of(name), before, read, nbytes, shape, mesh_shape)
        if asked[name] is None:
            return rule
        return tuple(r or is_partial(g) for r, g in zip(rule, grad))

    def backward_product(name: str, k: int, grad: tuple, operands_of: dict) -> tuple | None:
        """The gradient the product ``name``'s backward hands its operand ``k`` where
        DTensor runs that backward product otherwise than the planner's rules say
        (``runtime_backward.product_backward``), or is asked it whole because the output's
        gradient came in another layout than the product made (``_asked_of_dtensor``),
        its moves counted; None elsewhere. For a module output (its hook's backward brought
        the gradient to the layout the op made) only an embedding's weight is asked
        (``runtime_backward.embedding_backward``)."""
        decision = graph.decision(name)
        if name in back_exits:
            answer = embedding_backward(decision, k, made_by_op(name, 0), operands_of, mesh)
        elif runs_saved_value_backward(decision, grad, made_back(name, 0)):
            answer = saved_value_backward(decision, grad, made_back(name, 0), mesh)
            if answer is not None:  # a move of the saved value the forward made too is kept
                kept = {(r[3], r[4]) for r in readers.get((name, 0), ())}
                answer = answer[0], [m for m in answer[1] if not (m[0] == "saved" and m[1:] in kept)]
        elif runs_elementwise_backward(decision, grad, made_back(name, 0)):
            answer = elementwise_backward(decision, k, grad, operands_of, mesh)
        else:
            answer = (product_backward(decision, k, grad, operands_of, mesh, made_back(name, 0))
                      or embedding_backward(decision, k, grad, operands_of, mesh))
        if answer is None:
            return None
        layout, moves = answer
        values = {index: (u, i) for u, i, index in graph.inputs_of(name)}
        for which, before, read in moves:
            nbytes, shape = value_size(graph, (name, 0) if which in ("gradient", "saved") else values[which])
            count_move(found, module_of(name), before, read, nbytes, shape, mesh_shape)
        return layout

    def whole_gradient(name: str, k: int, grad: tuple) -> tuple | None:
        """The gradient of ``name``'s input ``k`` where its backward makes it last with a
        kernel DTensor runs on whole tensors only (``runtime_choice.replicated_gradient``),
        its move there counted; None elsewhere."""
        answer = replicated_gradient(graph.decision(name), k, grad, mesh)
        if answer is None:
            return None
        read, layout = answer
        values = {index: (u, i) for u, i, index in graph.inputs_of(name)}
        nbytes, shape = value_size(graph, values[k])
        count_move(found, module_of(name), grad, read, nbytes, shape, mesh_shape)
        return layout

    step = StepBackward(  # what every value's gradient reads of the step
        graph=graph, order=order, grads=grads, mesh_shape=mesh_shape,
        parent_spec=parent_spec, found=found, module_of=module_of, made=made_back,
        exits=back_exits, operands=operands, join=join, carries_on=carries_on,
        backward_product=backward_product, whole_gradient=whole_gradient, hook_call=hook_call,
    )
    with overrides.installed():  # ``join`` asks DTensor's rules as they run
        for decision in reversed(list(graph.decisions())):
            name = decision.name
            if name not in reached:
                continue
            for out_index in range(max(1, len(output_values(decision)))):
                value = (name, out_index)
                backward_readers = [r for r in readers.get(value, ()) if r[0] in reached]
                if not backward_readers:
                    continue
                tensor = output_values(decision)[out_index]
                add = (lambda a, b, t=tensor: added_gradients(a, b, t, mesh)) if isinstance(tensor, torch.Tensor) else None
                grads[value] = value_gradient(
                    step, value, backward_readers, boundaries.get(value, ()),
                    rejoined_hook=rejoined.get(value), add=add,
                )
    for value, grad in grads.items():
        u = value[0]
        if grad is None or (passes_gradient(graph, u) and u not in back_exits):
            continue  # a view's or add's gradient goes on to its inputs (a module output's, once its hook settled it)
        if u in joined:
            continue  # the cat took it as it came
        src = made_back(*value)
        if u not in back_exits and _asked_of_dtensor(graph.decision(u), grad, src):
            continue  # each input's backward product moved it as DTensor picked (``backward_product``)
        nbytes, shape = value_size(graph, value)
        # A partial gradient goes on unreduced through an op that carries it (``carries_partial``).
        through = carries_on(u, grad, operands.get(u, {}), src)
        carried = [u not in back_exits and c and is_partial(g) for c, g in zip(through, grad)]
        # A gradient summed split where the value was made whole is gathered there (by the
        # producer's backward op, or the hook on a module output or a parameter), except
        # into a pointwise op's backward, which runs split (``split_through``), or a matrix
        # product's that saved its operands whole (``matmul_split_axes``); a partial
        # one is reduced there. One redistribute, in DTensor's order of steps: where the
        # value's dim is split over two axes, it may reduce first and split after.
        split_kept = split_through(graph, u, back_exits, grad, src, mesh_shape, operands.get(u, {}))
        kept = tuple(a or b for a, b in zip(split_kept, matmul_split_axes(graph, u, back_exits, grad, src, operands.get(u, {}))))
        if any(split_kept):
            # a pointwise backward run on its gradient's split runs on it whole where it came
            # whole: nothing splits it there, whatever the op made (Segformer's drop path, made
            # split by channels on dp, hands its gradient on split by channels on tp as it came;
            # splitting it on dp too would take a gather on tp first)
            kept = tuple(k or g == REPLICATE for k, g in zip(kept, grad))
        reduced = tuple(REPLICATE if c else g for c, g in zip(carried, grad))
        target = tuple(REPLICATE if c else (g if k else q) for c, k, g, q in zip(carried, kept, grad, src))
        # an ``index``'s backward (``index_put``) reads the gradient as DTensor's rule asks
        read = index_backward_read(graph.decision(u), grad, operands.get(u, {}), mesh) if u not in back_exits else None
        if read is not None:
            target = tuple(REPLICATE if c else r for c, r in zip(carried, read))
        # A parameter's gradient is settled by its module's hook (``Plan.parameter_uses``).
        where = parameter_module(choices, u) if graph.decision(u).kind == PARAMETER else module_of(u)
        times = 1 if u in back_exits else gradient_reads(graph, u)
        for kind, axis, size in gradient_collectives(reduced, target, nbytes, mesh_shape, shape):
            found[(where, kind, axis, round(size))] += times
        # a product run on its gradient's split moves its saved operands there instead
        resplit = resplit_through(graph, u, back_exits, grad, src, operands.get(u, {}))
        for kind, axis, size in resplit_moves(graph, u, operands.get(u, {}), grad, resplit, mesh_shape):
            found[(where, kind, axis, round(size))] += 1

    with overrides.installed():  # a variance's backward recomputes its input's mean, as saved
        for (name, index), grad in grads.items():
            saved = operands.get(name, {}).get(0, (None, None))[0]
            moves = recentred_mean_moves(graph.decision(name), saved, mesh) if index == 0 and grad is not None else None
            for _, before, read, nbytes, shape in moves or ():
                count_move(found, module_of(name), before, read, nbytes, shape, mesh_shape)

    loss = loss_output(choices)
    if loss is not None:
        node = loss[0]
        decision = graph.decision(node)
        strategy = runs.get(node) or decision.strategies[choice[node]]  # as it runs (a loss split by class reduces itself)
        values = output_values(decision)
        for at_root, axis, index in loss_reductions(loss, decision.fx_node, strategy, mesh_shape):
            found[(ROOT if at_root else module_of(node), "all_reduce", axis, round(tensor_bytes(values[index])))] += 1
    for decision in graph.decisions():  # what an op runs itself: the all_reduces of a loss split by class
        if decision.kind != OP:
            continue
        name = decision.name
        strategy = runs.get(name) or decision.strategies[choice[name]]
        for kind, axis, size, _ in own_collectives(decision.fx_node, output_values(decision), strategy, mesh_shape,
                                                   decision.requires_grad):
            found[(module_of(name), kind, axis, round(size))] += 1
        inputs = [output_values(graph.decision(u))[i] for u, i, _ in graph.inputs_of(name)]
        for kind, axis, size, _ in context_attention.kv_gathers(decision.fx_node, inputs, strategy, mesh_shape,
                                                               decision.requires_grad)[0]:
            found[(module_of(name), kind, axis, round(size))] += 1
    if recompute:
        found.update(recompute_collectives(choices, forward, recompute))
    return found


def _asked_of_dtensor(decision, grad: tuple, made: tuple) -> bool:
    """Whether each input's gradient of ``decision``'s backward is DTensor's answer for its
    backward product (``runtime_backward.runs_elementwise_backward``,
    ``runs_saved_value_backward``, ``runs_product_backward``), the output gradient's moves
    counted there, once per read."""
    return (runs_elementwise_backward(decision, grad, made) or runs_saved_value_backward(decision, grad, made)
            or runs_product_backward(decision, grad, made))


def module_table(found: Counter, axis_names: tuple[str, ...]) -> dict:
    """``step_collectives``' counter as the plan's table (``plan.collective_table``)."""
    return collective_table(((module, axis_names[axis], kind, nbytes), count) for (module, kind, axis, nbytes), count in found.items())

