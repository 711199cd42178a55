"""Stage 6: execute a plan with DTensor on an N-D DeviceMesh.

- Parameters become DTensors with the plan's placements (tied parameters stay tied;
  FQNs are unchanged). Their gradients are redistributed to the same placements after
  accumulation: that is the gradient all-reduce / reduce-scatter of data parallelism.
- Module inputs and outputs are redistributed by forward hooks to the plan's layouts.
- The root module turns each rank's local batch (from ``shard_batch``) into DTensors,
  runs under implicit replication (tensors the model builds itself, such as masks and
  position ids, are the same on every rank), and returns the loss as a plain tensor
  holding the global-batch loss: in the output where the model returns one (a new output
  object, rebuilt as ``trace/loss.py`` says), or, given ``loss_fn``, the loss alone,
  computed from the output and the batch under the same plan, as it was planned.

This module must not import the cost model or the solver: a plan applies on a machine
that never planned.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.distributed.tensor.experimental import implicit_replication
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from autoplan.apply.expert_parallel import install_expert_parallel
from autoplan.apply.materialize import initialize, materialize_buffers
from autoplan.apply.parameters import distribute_parameters, gather_parameters_for_use
from autoplan.apply.recompute import check_recompute, checkpoint_modules
from autoplan.apply.unreached_parts import layout_of, with_unreached_gradients, zeros_laid_out
from autoplan.dtensor import context_attention, overrides
from autoplan.dtensor.fused_attention import contiguous_operands, mask_placed_like_query, sharded_dropout_attention
from autoplan.dtensor.rules import op_by_name
from autoplan.dtensor.saved_inputs import remember_saved_moves
from autoplan.errors import PlanError
from autoplan.model_file import model_call_kwargs
from autoplan.placements import Spec, to_placements
from autoplan.plan.module_plan import Plan
from autoplan.trace.loss import batch_of, check_loss_fn, computed_loss, loss_slot, plain, value_at, with_value_at
from autoplan.trace.training_call import training_kwargs
from autoplan.tree_paths import keyed_leaves, map_keyed_leaves, tensor_leaves


def apply_plan(model: nn.Module, plan: Plan, device_mesh: DeviceMesh, init=None, loss_fn=None):
    """Distribute ``model`` in place per ``plan``; returns the same module.

    A model built on the meta device gets only its local shards, filled by ``init``
    (``"reset_parameters"`` or a callable ``init(module)``; see ``apply/materialize.py``).
    With ``loss_fn`` (the model file's ``compute_loss``, which the plan was made for), a
    call of the model returns ``loss_fn(output, batch)`` as a plain scalar holding the
    global-batch loss: ``loss = model(**local_batch); loss.backward()``. A ``LossWithInputs``
    names batch keys only the loss reads: the model's forward is called without them.

    A plan with pipeline stages (``plan.pipeline``) is applied on the full mesh, pipeline axis
    included: the rank keeps its stages' modules, and the result is a ``Pipelined``
    (``apply/pipelined.py``) whose ``step(batch)`` runs the plan's schedule.
    """
    check_loss_fn(loss_fn)
    if plan.pipeline is not None:
        from autoplan.apply.pipelined import apply_pipelined  # torch.distributed.pipelining, only for pipelines

        return apply_pipelined(model, plan, device_mesh, _apply_layout, init, loss_fn)
    _apply_layout(model, plan, device_mesh, init, loss_fn)
    return model


def _apply_layout(model: nn.Module, plan: Plan, device_mesh: DeviceMesh, init=None, loss_fn=None) -> None:
    _check_mesh(plan, device_mesh)
    _check_model(model, plan)
    fallbacks = _fallback_ops(plan)
    with overrides.installed(fallbacks):
        _apply(model, plan, device_mesh, fallbacks, init, loss_fn)


def _fallback_ops(plan: Plan) -> frozenset:
    """The ops the plan runs replicated, for want of a DTensor rule (``Plan.fallback_ops``):
    their fallback rule is in force while this plan's model runs, not for anyone else."""
    return frozenset(op_by_name(name) for name in plan.fallback_ops)


def _apply(model: nn.Module, plan: Plan, device_mesh: DeviceMesh, fallbacks: frozenset, init, loss_fn) -> None:
    born_meta = distribute_parameters(model, plan, device_mesh)
    born_meta |= materialize_buffers(model, device_mesh)
    initialize(model, born_meta, init)
    modules = dict(model.named_modules())
    gather_parameters_for_use(modules, plan, device_mesh)
    for fqn in plan.opaque_modules:
        _run_replicated(modules[fqn])
    running = _Running()
    install_expert_parallel(modules, plan, device_mesh, running.paused)
    for fqn, layout in plan.modules.items():
        module = modules[fqn]
        if layout.inputs:
            module.register_forward_pre_hook(_redistribute_inputs(layout.inputs, device_mesh, running), with_kwargs=True)
        if layout.outputs:
            module.register_forward_hook(_redistribute_outputs(layout.outputs, device_mesh, running))
    axis = _context_axis(plan)
    checkpoint_modules(modules, plan.recompute, lambda: running.inside(_recompute_execution(device_mesh, fallbacks, axis)))
    _wrap_root(model, plan, device_mesh, fallbacks, loss_fn, running)


class _Running:
    """How many calls of the planned model are in progress: its forwards, and the reruns of
    its checkpointed modules in the backward. The plan's module hooks act only inside one.
    A module object can belong to other models too: transformers keeps activation modules
    (``ACT2FN``, OpenAI-GPT's ``ACT_FNS``) as module-level instances that every model built
    in the process holds, so hooks on one stay there for a model traced or run later,
    which must run as if this plan had never been applied."""

    def __init__(self) -> None:
        self.depth = 0

    @contextmanager
    def paused(self):
        """The hooks stand aside: code run on plain local tensors (an expert-parallel
        module's local experts, ``apply/expert_parallel.py``)."""
        depth, self.depth = self.depth, 0
        try:
            yield
        finally:
            self.depth = depth

    @contextmanager
    def inside(self, context):
        self.depth += 1
        try:
            with context:
                yield
        finally:
            self.depth -= 1


def shard_batch(batch, plan: Plan, device_mesh: DeviceMesh):
    """This rank's slice of a global batch, in the same form (tuple or dict) as given. With a
    context axis, the plan's sequence inputs are first put in its load-balanced order."""
    _check_mesh(plan, device_mesh)
    args, kwargs, rebuild = _split(batch)
    spec = tree_flatten((args, kwargs))[1]
    out = []
    context = plan.context_parallel
    for path, leaf in keyed_leaves((args, kwargs)):
        layout = plan.inputs.get(path)
        if context is not None and isinstance(leaf, torch.Tensor) and path in context.sequence_inputs:
            leaf = context_attention.load_balanced(leaf, 1, context.size)
        if isinstance(leaf, torch.Tensor) and layout is not None:
            leaf = _local_slice(leaf, layout.placements, device_mesh)
        out.append(leaf)
    args, kwargs = tree_unflatten(out, spec)
    return rebuild(args, kwargs)


def _split(batch):
    if isinstance(batch, dict):
        return (), dict(batch), lambda a, k: k
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}, lambda a, k: type(batch)(a)
    return (batch,), {}, lambda a, k: a[0]


def _local_slice(tensor: torch.Tensor, spec: Spec, mesh: DeviceMesh) -> torch.Tensor:
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, mesh, to_placements(spec))
    index = tuple(slice(o, o + n) for o, n in zip(offset, shape))
    return tensor[index].contiguous()


def _check_mesh(plan: Plan, mesh: DeviceMesh) -> None:
    if tuple(mesh.shape) != tuple(plan.mesh_shape):
        raise PlanError(
            f"the plan is for a {'x'.join(map(str, plan.mesh_shape))} mesh, got a DeviceMesh of shape {'x'.join(map(str, mesh.shape))}",
            hint="build the DeviceMesh with the plan's mesh shape, or re-plan for this mesh",
        )


def _check_model(model: nn.Module, plan: Plan) -> None:
    names = {fqn for fqn, _ in model.named_parameters(remove_duplicate=False)}
    unknown = sorted(set(plan.parameters) - names)
    missing = sorted(names - set(plan.parameters))
    if unknown or missing:
        what = f"plan parameters not in the model: {unknown[:3]}" if unknown else f"model parameters missing from the plan: {missing[:3]}"
        raise PlanError(f"the plan does not match the model ({what})", hint="re-plan this model with `autoplan suggest`")
    stray_uses = sorted(set(plan.parameter_uses) - names)
    if stray_uses:
        raise PlanError(f"plan parameter_uses name parameters not in the model: {stray_uses[:3]}",
            hint="re-plan this model with `autoplan suggest`")
    modules = dict(model.named_modules())
    stray_readers = sorted({m for readers in plan.parameter_readers.values() for m in readers} - set(modules))
    if stray_readers:
        raise PlanError(f"plan parameter_readers name modules not in the model: {stray_readers[:3]}",
            hint="re-plan this model with `autoplan suggest`")
    stray = sorted((set(plan.modules) | set(plan.opaque_modules)) - set(modules))
    if stray:
        raise PlanError(f"plan modules not in the model: {stray[:3]}", hint="re-plan this model with `autoplan suggest`")
    check_recompute(plan.recompute, modules)
    for fqn, param in model.named_parameters(remove_duplicate=False):
        planned = plan.parameter_shapes.get(fqn)
        if planned is not None and tuple(param.shape) != tuple(planned):
            raise PlanError(
                f"the plan does not match the model: {fqn} has shape {list(param.shape)}, the plan was made for {list(planned)}",
                hint="apply the plan to the model (and config) it was made for, or re-plan this model with `autoplan suggest`",
            )
    for fqn, name in plan.module_types.items():
        if fqn in modules and type(modules[fqn]).__name__ != name:
            raise PlanError(
                f"the plan does not match the model: module {fqn or '<root>'} is a {type(modules[fqn]).__name__}, "
                    f"the plan was made for a {name}",
                hint="apply the plan to the model it was made for, or re-plan this model with `autoplan suggest`",
            )


def _run_replicated(module: nn.Module) -> None:
    """Run a data-dependent region (see ``trace/opaque.py``) on whole tensors, the same on every rank.

    Its inputs, parameters and buffers are gathered to full plain tensors (differentiably:
    gradients flow back to the sharded originals), the module's own forward runs on them
    outside DTensor, and its tensor outputs re-enter as replicated DTensors.
    """
    from torch.nn.utils.stateless import _reparametrize_module

    original = module.forward

    def forward(*args, **kwargs):
        mesh = None
        leaves, spec = tree_flatten((args, kwargs))
        for leaf in leaves:
            if isinstance(leaf, DTensor):
                mesh = leaf.device_mesh
        state = dict(module.named_parameters())
        state.update(dict(module.named_buffers()))
        for value in state.values():
            if isinstance(value, DTensor):
                mesh = value.device_mesh
        if mesh is None:
            return original(*args, **kwargs)
        args, kwargs = tree_unflatten([_whole(x) for x in leaves], spec)
        with _reparametrize_module(module, {name: _whole(v) for name, v in state.items()}):
            output = original(*args, **kwargs)
        out_leaves, out_spec = tree_flatten(output)
        return tree_unflatten([_as_dtensor(x, mesh) if isinstance(x, torch.Tensor) else x for x in out_leaves], out_spec)

    module.forward = forward


def _whole(value):
    return value.full_tensor() if isinstance(value, DTensor) else value


def _as_dtensor(value, mesh: DeviceMesh):
    if isinstance(value, DTensor):
        return value
    return DTensor.from_local(value, mesh, [Replicate()] * mesh.ndim, run_check=False)


def _redistribute_tree(tree, layouts: dict[str, tuple], mesh: DeviceMesh, settle_gradients: bool = False):
    """``tree`` with each tensor the plan lays out (by pytree path, to DTensor placements)
    in that layout. A tensor found at several paths is moved once per layout: Funnel's
    layers take their hidden states as query, key and value, one tensor three times, and
    the plan prices one move of the value (its gradients, summed, go back once too)."""
    # (leaf, placements, moved), matched by identity: keyed by ``id(leaf)`` instead, dynamo
    # guards a compiled model's hook on the input's object id, and every step (a new
    # batch) compiles the model again until its cache limit.
    placed_once: list[tuple[torch.Tensor, tuple, torch.Tensor]] = []

    def place(key: str, leaf):
        # Integer tensors too: position ids the model makes (plain, the same on every rank)
        # and looks up split, as planned, so that the embedding's gradient is partial there.
        placements = layouts.get(key)
        if placements is None or not isinstance(leaf, torch.Tensor):
            return leaf
        for seen, where, moved in placed_once:
            if seen is leaf and where == placements:
                return moved
        moved = _as_dtensor(leaf, mesh)
        if tuple(moved.placements) != placements:
            moved = moved.redistribute(mesh, placements)
        if settle_gradients and moved.requires_grad:
            moved.register_hook(_settle_gradient(placements, mesh))
        placed_once.append((leaf, placements, moved))
        return moved

    placed = map_keyed_leaves(tree, place)
    if placed is not None:
        return placed
    leaves = keyed_leaves(tree)  # a container the fast walk does not know
    out = [place(path, leaf) for path, leaf in leaves]
    spec = tree_flatten(tree)[1]
    return tree if all(new is old for new, (_, old) in zip(out, leaves)) else tree_unflatten(out, spec)


def _settle_gradient(placements, mesh: DeviceMesh):
    """A gradient hook on a module output: bring its gradient, once autograd has summed
    what every reader sent back, to the layout the value was made in (Replicate where it
    was made partial), where the plan prices it. Left to itself DTensor carries a partial
    gradient on through ops that accept it and reduces it wherever a later op or
    parameter does not, many times over; and a gradient split another way than its value
    (a batch split only for the loss, say) stays split through every layer behind it."""
    def hook(grad):
        if not isinstance(grad, DTensor):
            return None
        if torch.compiler.is_compiling():
            # Dynamo traces this body once, ahead of the backward, against a gradient guessed
            # in the value's own placements: a move chosen for that guess (keep a partial one
            # partial) would be asked of the real gradient, and a replicated one (a mean loss
            # read whole) cannot become partial ("Can not redistribute from R to P(avg)").
            # Left opaque to dynamo, the move is chosen when the backward is traced, from
            # the real gradient's placements.
            return _settled_gradient(grad, mesh, placements)
        target = _settled_placements(grad, placements)
        return None if target == tuple(grad.placements) else grad.redistribute(mesh, target)

    return hook


def _settled_placements(grad: DTensor, placements) -> tuple:
    """Where ``_settle_gradient`` wants ``grad``: Replicate where the value was made partial,
    unless the gradient is partial there itself; elsewhere the value's own placement."""
    return tuple(
        held if held.is_partial() and own.is_partial() else Replicate() if own.is_partial() else own
        for held, own in zip(grad.placements, placements)
    )


@torch._dynamo.allow_in_graph
def _settled_gradient(grad: DTensor, mesh: DeviceMesh, placements) -> DTensor:
    """``grad`` moved to ``_settled_placements`` (a new DTensor even where nothing moves)."""
    return grad.redistribute(mesh, _settled_placements(grad, placements))


def _redistribute_inputs(layouts: dict[str, Spec], mesh: DeviceMesh, running: _Running):
    placements = {key: to_placements(spec) for key, spec in layouts.items()}  # not in the traced hook

    def hook(module, args, kwargs):
        if not running.depth:
            return None  # another model's call of a module it shares with this one
        return _redistribute_tree((args, kwargs), placements, mesh)

    return hook


def _redistribute_outputs(layouts: dict[str, Spec], mesh: DeviceMesh, running: _Running):
    placements = {key: to_placements(spec) for key, spec in layouts.items()}  # not in the traced hook

    def hook(module, args, output):
        if not running.depth:
            return None
        # The trace keys a single-tensor output as "" and a structure by its paths.
        return _redistribute_tree(output, placements, mesh, settle_gradients=True)

    return hook


def _wrap_root(model: nn.Module, plan: Plan, mesh: DeviceMesh, fallbacks: frozenset, loss_fn, running: _Running) -> None:
    calls: list[list] = []  # per call in progress: [its plan_execution, the batch as DTensors]
    batch_layouts = {key: to_placements(b.placements) for key, b in plan.inputs.items()}  # not in the traced hook
    axis = _context_axis(plan)

    def enter(module, args, kwargs):
        stack = ExitStack()
        stack.enter_context(running.inside(plan_execution(mesh, fallbacks)))
        stack.enter_context(overrides.planned_step())  # an op the plan never saw runs replicated, not failing
        stack.enter_context(context_attention.active(axis))
        call = [stack, None]
        calls.append(call)  # before anything can fail: leave closes it
        spec = tree_flatten((args, kwargs))[1]
        out = []
        for path, leaf in keyed_leaves((args, kwargs)):
            layout = batch_layouts.get(path)
            if isinstance(leaf, torch.Tensor) and not isinstance(leaf, DTensor) and layout is not None:
                leaf = DTensor.from_local(leaf, mesh, layout, run_check=False)
            out.append(leaf)
        args, kwargs = tree_unflatten(out, spec)
        call[1] = batch_of(args, kwargs)  # what loss_fn gets: the batch, without the cache flag added below
        # the model gets the batch without the keys only loss_fn reads (LossWithInputs)
        return args, training_kwargs(module, model_call_kwargs(kwargs, loss_fn))

    def leave(module, args, kwargs, output):
        stack, batch = calls.pop() if calls else (None, None)
        try:
            # Inside the plan's execution: the loss's own reduction runs as it was planned.
            if loss_fn is not None and output is not None:  # None: the forward raised
                output = plain(computed_loss(loss_fn, output, batch))
            else:
                output = _plain_loss(output)
        finally:
            if stack is not None:
                stack.close()
        _overrides_for_backward(output, fallbacks)
        return _tangents_for_compiled_outputs(output)

    # Under torch.compile of the whole model these run as they are, outside any graph: they
    # enter and leave the plan's execution (overrides, modes) around the traced forward,
    # and a graph of their own would return the model's DTensor loss, which the backward
    # never reaches, as an output that needs a gradient.
    model.register_forward_pre_hook(torch.compiler.disable(enter), with_kwargs=True, prepend=True)
    model.register_forward_hook(torch.compiler.disable(leave), with_kwargs=True, always_call=True)


@contextmanager
def plan_execution(mesh: DeviceMesh, fallback_ops=frozenset()):
    """What a planned model's forward runs under (entered by the root module's pre-hook, left
    by its forward hook): autoplan's DTensor changes (``dtensor/overrides.py``) with the
    plan's ``fallback_ops``, DTensor's implicit replication, ``_ReplicatePlainOperands`` and
    ``saved_inputs.remember_saved_moves``. ``autoplan calibrate`` times its DTensor ops under
    it too, so that they pay what a step's ops pay."""
    with overrides.installed(fallback_ops), implicit_replication(), _ReplicatePlainOperands(mesh), remember_saved_moves():
        yield


@contextmanager
def _recompute_execution(mesh: DeviceMesh, fallback_ops=frozenset(), context_axis: int | None = None):
    """What a checkpointed module's rerun (in the backward) runs under: ``plan_execution``
    without ``remember_saved_moves``, whose saved-tensor hooks would take the place of the
    checkpoint's own (those collect the rerun's tensors for the backward); with the plan's
    context axis, as its forward ran."""
    with overrides.installed(fallback_ops), implicit_replication(), _ReplicatePlainOperands(mesh), context_attention.active(context_axis):
        yield


def _context_axis(plan: Plan) -> int | None:
    return None if plan.context_parallel is None else plan.context_parallel.axis_index


def _overrides_for_backward(output, fallback_ops=frozenset()) -> None:
    """autoplan's DTensor changes, installed again for the backward of ``output``: from the
    moment autograd reaches the model's outputs to the end of that backward pass.

    Between the forward and the backward (the user's own loss code, say) torch is as it
    was; an output nobody calls backward on leaves nothing installed, and neither does a
    backward that raises (a device out of memory, a hook's error): autograd drops the
    callbacks of a failed pass unrun, and dropping this one uninstalls."""
    if not torch.is_grad_enabled():
        return
    tensors = [t for t in _tensors_in(output) if t.requires_grad]
    if not tensors:
        return

    def reached(_grad):
        overrides.install(fallback_ops)
        overrides.enter_planned_step()
        torch.autograd.Variable._execution_engine.queue_callback(_UninstallOnce(fallback_ops))

    torch.autograd.graph.register_multi_grad_hook(tensors, reached, mode="any")


class _UninstallOnce:
    """``overrides.uninstall`` as the backward's final callback: called when the pass ends,
    or, where it failed and autograd drops its callbacks unrun, when dropped."""

    def __init__(self, fallback_ops=frozenset()):
        self._pending = True
        self._fallback_ops = fallback_ops

    def __call__(self):
        if self._pending:
            self._pending = False
            overrides.leave_planned_step()
            overrides.uninstall(self._fallback_ops)

    def __del__(self):
        self()


def _tangents_for_compiled_outputs(output):
    """``output`` with its loss tied to the other outputs a compiled graph made (logits):
    their gradients are DTensor zeros when the backward starts from the loss alone.

    AOTAutograd guesses the gradient of each differentiable output of a compiled graph to
    be a DTensor laid out as the output is; an output the backward never reaches gets a
    plain zero tensor from autograd instead, and the compiled backward refuses it ("Expected
    a DTensor tangent but got a plain Tensor"). The zeros, in each output's own placements,
    cost no communication; eagerly run outputs are left alone."""
    where = loss_slot(output)
    if where is None:
        return output
    loss = value_at(output, where)
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return output
    others = [
        t for t in _tensors_in(output)
        if t is not loss and isinstance(t, DTensor) and t.requires_grad and _made_by_compiled_graph(t)
    ]
    if not others:
        return output
    return with_value_at(output, where, _ZeroTangents.apply(loss, *others))


def _made_by_compiled_graph(tensor: torch.Tensor) -> bool:
    node = tensor.grad_fn
    while node is not None and type(node).__name__ in ("ViewBackward0", "AliasBackward0", "AsStridedBackward0"):
        node = node.next_functions[0][0] if node.next_functions else None
    return node is not None and "CompiledFunction" in type(node).__name__


class _ZeroTangents(torch.autograd.Function):
    """The loss, unchanged; its backward also hands each of ``others`` a zero gradient."""

    @staticmethod
    def forward(ctx, loss, *others):
        ctx.others = [layout_of(o) for o in others]
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx, grad):
        return (grad, *(zeros_laid_out(layout) for layout in ctx.others))


class _ReplicatePlainOperands(TorchFunctionMode):
    """Plain tensors passed to a torch function together with DTensors become replicated DTensors.

    DTensor's implicit replication does the same at dispatch time, but that is below
    autograd: autograd would save the plain tensor (position ids, a mask, BatchNorm's
    running statistics) for the backward, where implicit replication is no longer in
    force, and a backward op such as ``embedding_dense_backward`` would fail on a plain
    tensor next to a DTensor gradient. Converting at the torch-function level makes
    autograd save the DTensor. Calls that involve only plain tensors (code that works
    on ``to_local()`` shards) are left alone. Such tensors are identical on every rank,
    so replicating them is exactly what the planner assumed.
    """

    def __init__(self, mesh: DeviceMesh):
        super().__init__()
        self.mesh = mesh

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _TO_PYTHON and isinstance(args[0], DTensor):
            # A Python value read from a tensor steers control flow (``if mask.all():``):
            # every rank must read the global value, or ranks take different branches and
            # their collectives no longer match.
            return func(args[0].full_tensor(), *args[1:], **kwargs)
        if _mixes_plain_and_dtensors((args, kwargs)):
            leaves, spec = tree_flatten((args, kwargs))
            args, kwargs = tree_unflatten([_as_dtensor(x, self.mesh) if _is_plain(x) else x for x in leaves], spec)
        if func is F.scaled_dot_product_attention:
            split = context_attention.split_attention(args, kwargs)
            if split is not None:
                return with_unreached_gradients(func, split)
            sharded = sharded_dropout_attention(args, kwargs)
            if sharded is not None:
                return sharded
            args, kwargs = contiguous_operands(*mask_placed_like_query(args, kwargs))
        return with_unreached_gradients(func, func(*args, **kwargs))


_TO_PYTHON = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
    torch.Tensor.__float__, torch.Tensor.__index__,
}


def _is_plain(value) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, DTensor)


def _is_dtensor(value) -> bool:
    return isinstance(value, DTensor)


def _tensors_in(tree) -> list:
    """The tensors among ``tree``'s leaves: the fast walk, or pytree where it does not know a container."""
    tensors = tensor_leaves(tree)
    if tensors is None:
        tensors = [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]
    return tensors


def _mixes_plain_and_dtensors(tree) -> bool:
    """Whether ``tree`` holds both a DTensor and a plain tensor (most calls hold one kind)."""
    tensors = _tensors_in(tree)
    return any(_is_dtensor(x) for x in tensors) and any(_is_plain(x) for x in tensors)


def _plain_loss(output):
    """``output`` with the model's own loss (``trace/loss.py``) as a plain tensor holding the
    global value; a new output object where the loss changed, the model's own untouched."""
    where = loss_slot(output)
    if where is None:
        return output
    loss = value_at(output, where)
    return with_value_at(output, where, loss.full_tensor()) if isinstance(loss, DTensor) else output
