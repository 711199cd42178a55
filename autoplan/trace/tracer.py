"""Stage 1: trace a model to an ATen-level torch.fx graph on fake tensors.

``make_fx`` traces one training-step forward (model call plus loss) with parameters,
buffers and inputs as placeholders, so no weight memory is used. Module forward hooks,
active only while tracing, record which module owns each node and which graph values
enter and leave each module call; the plan's module-level layouts come from them.

The step is the one the device runs: the model is called as a training step calls it
(``trace/training_call.py``: no inference cache), ``scaled_dot_product_attention`` is recorded as
the fused kernel (``dtensor/fused_attention.py``), fake kernels accept what device kernels
accept (``dtensor/fake_kernels.py``), an autocast region on the meta device is a recorded
no-op (``trace/meta_autocast.py``), and the loss is the model file's or the model's own
(``trace/loss.py``).
"""

from __future__ import annotations

import functools
import hashlib
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot, make_fx
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.hooks import RemovableHandle

from autoplan.dtensor.fused_attention import FusedAttention
from autoplan.dtensor.overrides import installed as dtensor_overrides
from autoplan.errors import AutoplanError, LossError, TraceError
from autoplan.model_file import check_loss_inputs, model_call_kwargs
from autoplan.trace import opaque
from autoplan.trace.experts import ROUTED, find_experts
from autoplan.trace.grad_leaves import record_grad_leaves
from autoplan.trace.known_values import known_values
from autoplan.trace.loss import batch_of, check_loss_fn, computed_loss, find_loss, summed_warning
from autoplan.trace.meta_autocast import meta_autocast
from autoplan.trace.no_grad import no_grad_ops
from autoplan.trace.saved import record_saved, savers
from autoplan.trace.training_call import training_kwargs
from autoplan.tree_paths import keyed_leaves


@dataclass(frozen=True, slots=True)
class ModuleCall:
    """One call of a module during the traced step."""

    fqn: str
    """Module name as in ``named_modules()`` ("" is the root)."""
    inputs: tuple[tuple[str, str], ...]
    """(key path into ``(args, kwargs)``, graph node) for each tensor the call received."""
    outputs: tuple[tuple[str, str], ...]
    """(key path into the output, graph node) for each tensor the call returned."""


@dataclass(frozen=True)
class TracedGraph:
    """The traced training-step forward and what autoplan needs to know about it."""

    graph_module: fx.GraphModule
    """ATen graph; every tensor node has a FakeTensor in ``meta["val"]``."""
    parameters: dict[str, tuple[str, ...]]
    """Placeholder node -> parameter FQNs (more than one when parameters are tied)."""
    trainable: frozenset[str]
    """Parameter placeholder nodes that require a gradient."""
    buffers: dict[str, str]
    """Placeholder node -> buffer FQN."""
    inputs: dict[str, str]
    """Placeholder node -> key path of the batch tensor it stands for."""
    node_modules: dict[str, str]
    """Node -> FQN of the innermost module whose call created it."""
    module_calls: tuple[ModuleCall, ...]
    """Every module call, in the order the calls finished."""
    module_types: dict[str, str]
    """Module FQN -> class name."""
    batch_is_kwargs: bool
    """True when the example batch is a dict of keyword arguments."""
    fingerprint: str
    """Hash of the graph, parameter shapes and input shapes."""
    opaque_modules: dict[str, str] = field(default_factory=dict)
    """FQN -> class name of each module traced as one opaque region (``trace/opaque.py``)."""
    opaque_reasons: dict[str, str] = field(default_factory=dict)
    """FQN -> why it is opaque (``opaque.DATA_DEPENDENT`` or ``opaque.LOCAL_SHARDS``)."""
    opaque_flops: dict[str, float] = field(default_factory=dict)
    """Opaque-region node -> its forward FLOPs (an upper bound)."""
    saved: frozenset[str] = frozenset()
    """Nodes whose value autograd saves for the backward (``trace/saved.py``): what stays
    alive from the forward to the backward, besides parameters and the batch."""
    saved_by: frozenset[tuple[str, str]] = frozenset()
    """(saved node, the op that saved it); "" where no op could be told."""
    grad_leaves: frozenset[str] = frozenset()
    """Nodes the forward made into leaves that need a gradient (``trace/grad_leaves.py``)."""
    no_grad: frozenset[str] = frozenset()
    """Op nodes the forward ran without autograd (``trace/no_grad.py``): they get no gradient."""
    warnings: tuple[str, ...] = ()
    """Where the traced step is not exactly the step the user trains (a loss taken as the
    sum of the output, autocast regions traced in the model's own dtypes): for the plan."""

    def value_of(self, node: str) -> tuple[str, int]:
        """(producer, output index) of the value graph node ``node`` stands for: a getitem
        of a multi-output op names that op and the index; any other node is its output 0."""
        return self._getitems.get(node, (node, 0))

    @functools.cached_property
    def loss_value(self) -> tuple[str, int] | None:
        """(producer, output index) of the value the traced step returns: the loss (a
        multi-output op's loss comes out through ``getitem``); None where it is no node."""
        output = next(n for n in reversed(self.graph_module.graph.nodes) if n.op == "output")
        value = output.args[0]
        value = value[0] if isinstance(value, (tuple, list)) and value else value
        name = getattr(value, "name", None)
        return self.value_of(name) if name is not None else None

    @functools.cached_property
    def _getitems(self) -> dict[str, tuple[str, int]]:
        return {
            node.name: (node.args[0].name, node.args[1])
            for node in self.graph_module.graph.nodes
            if node.op == "call_function" and node.target is operator.getitem
        }


def split_batch(batch) -> tuple[tuple, dict]:
    """A global batch as ``(args, kwargs)``: a dict is keyword arguments, anything else positional."""
    if isinstance(batch, dict):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    return (batch,), {}


def trace_model(model: nn.Module, example_inputs, loss_fn=None, expert_regions: bool = False) -> TracedGraph:
    """Trace one training step of ``model`` on ``example_inputs`` (meta or real tensors);
    its loss is ``loss_fn(output, batch)``, or the model's own (``trace/loss.py``).
    ``expert_regions``: each routed experts module (``trace/experts.py``) is traced as one
    region (``opaque.EXPERTS``) whose layout the solver chooses: split over a mesh axis
    (expert parallel) or whole (``choices/expert_layouts.py``)."""
    check_loss_fn(loss_fn)
    check_loss_inputs(loss_fn, example_inputs)
    args, kwargs = split_batch(example_inputs)
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    params, buffers, args, kwargs = _on_one_device((params, buffers, args, kwargs))
    aliases = _tied_parameter_names(model)
    was_training = model.training
    recorder = _CallRecorder(model)
    summed: list[str] = []  # where the loss was taken as a sum of the output, per attempt
    no_grad: set[str] = set()  # ops run without autograd, per attempt

    def step(params, buffers, args, kwargs):
        # a mask of ones the eager step skips is skipped here too; what runs without autograd is noted
        with known_values(), no_grad_ops(no_grad):
            # the batch keys only the loss reads are inputs of the step, not of the model
            model_kwargs = training_kwargs(model, model_call_kwargs(kwargs, loss_fn))
            output = torch.func.functional_call(model, {**params, **buffers}, args, model_kwargs)
            if loss_fn is not None:
                return _loss_of(loss_fn, output, batch_of(args, kwargs))
            found = find_loss(output)
        if found.summed:
            summed.append(found.where)
        return found.tensor

    # Class -> why its modules are traced as opaque regions (``trace/opaque.py``).
    opaque_classes = {
        type(m): opaque.LOCAL_SHARDS for m in model.modules() if m is not model and opaque.takes_local_shards(type(m))
    }
    if expert_regions:
        for found in find_experts(model):
            if found.call == ROUTED:
                opaque_classes.setdefault(type(model.get_submodule(found.fqn)), opaque.EXPERTS)
    while True:
        model.train()
        regions = opaque.install(model, opaque_classes)
        summed.clear()
        no_grad.clear()
        try:
            with recorder, dtensor_overrides(), FusedAttention(), meta_autocast() as autocasts, record_saved() as saved, \
                    record_grad_leaves() as grad_leaves:
                # Tensors the forward builds from Python data on the meta device (``torch.tensor``
                # in a module's forward) become graph constants instead of failing the trace.
                gm = make_fx(step, tracing_mode="fake", _allow_non_fake_inputs=True)(params, buffers, args, kwargs)
            # Traced, but with sizes no cost can be put on, or with an op no layout runs.
            culprit, reason = _module_to_isolate(gm, recorder, model)
            if culprit is not None and type(culprit) not in opaque_classes:
                opaque_classes[type(culprit)] = reason
                recorder.reset()
                continue
            break
        except AutoplanError:  # already one line with its fix (a loss that is not a scalar)
            raise
        except Exception as err:  # tracing errors come from anywhere in user code
            culprit = opaque.failing_module(err, model) if opaque.is_data_dependent(err) else None
            if culprit is not None and type(culprit) not in opaque_classes and culprit is not model:
                opaque_classes[type(culprit)] = opaque.DATA_DEPENDENT  # trace again with that region opaque
                recorder.reset()
                continue
            raise TraceError(
                f"could not trace the model: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                hint="the model must run on meta tensors with the example inputs; try it with "
                "model(**example_inputs()) under torch.device('meta') (--debug shows the traceback)",
            ) from err
        finally:
            opaque.uninstall(regions)
            model.train(was_training)

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    n_params, n_buffers = len(params), len(buffers)
    param_nodes = {
        node.name: aliases.get(fqn, (fqn,)) for node, fqn in zip(placeholders[:n_params], params)
    }
    buffer_nodes = {node.name: fqn for node, fqn in zip(placeholders[n_params:n_params + n_buffers], buffers)}
    batch_paths = [path for path, leaf in keyed_leaves((args, kwargs))]
    input_nodes = {node.name: path for node, path in zip(placeholders[n_params + n_buffers:], batch_paths)}

    node_modules = recorder.node_owners(gm.graph)
    return TracedGraph(
        graph_module=gm,
        parameters=param_nodes,
        trainable=frozenset(
            node.name for node, param in zip(placeholders[:n_params], params.values()) if param.requires_grad
        ),
        buffers=buffer_nodes,
        inputs=input_nodes,
        node_modules=node_modules,
        module_calls=tuple(recorder.calls),
        module_types={fqn: type(m).__name__ for fqn, m in model.named_modules()},
        batch_is_kwargs=isinstance(example_inputs, dict),
        fingerprint=_fingerprint(gm.graph, params, buffers, frozenset(no_grad), frozenset(grad_leaves)),
        opaque_modules={fqn: type(m).__name__ for fqn, m in model.named_modules() if type(m) in opaque_classes},
        opaque_reasons={fqn: opaque_classes[type(m)] for fqn, m in model.named_modules() if type(m) in opaque_classes},
        opaque_flops={
            node.name: opaque.region_flops(node.args[0])
            for node in gm.graph.nodes if node.target is opaque.OPAQUE_OP
        },
        saved=frozenset(name for name, _ in saved),
        saved_by=savers(gm.graph, saved),
        grad_leaves=frozenset(grad_leaves),
        no_grad=frozenset(no_grad),
        warnings=tuple(summed_warning(where) for where in summed[:1]) + _autocast_warnings(autocasts),
    )


def _on_one_device(trees: tuple) -> tuple:
    """The step's parameters, buffers and inputs, on the meta device where they lie on
    several. A model built under ``torch.device("meta")`` can hold tensors its code put on
    the CPU regardless (XLNet's attention weights come from ``torch.FloatTensor(...)``,
    which ignores the default device), and a forward that makes tensors on its input's
    device then meets them in one op. The trace needs their shapes only."""
    tensors = [x for x in tree_flatten(trees)[0] if isinstance(x, torch.Tensor)]
    if len({x.device for x in tensors}) < 2:
        return trees
    leaves, spec = tree_flatten(trees)
    return tree_unflatten([_meta_copy(x) if isinstance(x, torch.Tensor) else x for x in leaves], spec)


def _meta_copy(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.is_meta:
        return tensor
    copy = tensor.detach().to("meta")
    return copy.requires_grad_() if tensor.requires_grad else copy


def _loss_of(loss_fn, output, batch) -> torch.Tensor:
    """``loss_fn``'s loss; its own errors, one line naming it (they are not the model's)."""
    try:
        return computed_loss(loss_fn, output, batch)
    except AutoplanError:
        raise
    except Exception as err:
        if opaque.is_data_dependent(err):
            raise
        name = getattr(loss_fn, "__name__", "loss_fn")
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise LossError(
            f"{name}(output, batch) raised {type(err).__name__}: {first}",
            f"fix {name}: it gets the model's output and the batch the model was called with "
            "(the dict of keyword arguments, or the tuple of positional ones) (--debug shows the traceback)",
        ) from err


def _autocast_warnings(enabled: list[bool]) -> tuple[str, ...]:
    """One line when a region on the meta device asked for autocast (``trace/meta_autocast.py``)."""
    count = sum(enabled)
    if not count:
        return ()
    return (
        (f"{count} autocast region(s) on the meta device (torch.autocast(device_type=x.device.type)) were traced "
        "in the model's own dtypes: the plan's costs do not include their lower precision"),
    )


def _module_to_isolate(gm: fx.GraphModule, recorder: _CallRecorder, model: nn.Module):
    """(the innermost module to trace again as an opaque region, why), or (None, None):
    one that made a value whose size depends on the data (``torch.where`` traced with an
    unbacked size), as one whose trace fails on such a size is; or one that restrides a
    tensor (``opaque.RESTRIDING_OPS``) other than to the strides it has. Never the model
    itself: a value of unknown size made by no module's node leaves the trace as it is."""
    owners = recorder.node_owners(gm.graph)
    for node in gm.graph.nodes:
        fqn = owners.get(node.name, "")
        values = [v for v in tree_flatten(node.meta.get("val"))[0] if isinstance(v, torch.Tensor)]
        if any(not isinstance(size, int) for v in values for size in v.shape):
            return (model.get_submodule(fqn), opaque.DATA_DEPENDENT) if fqn else (None, None)
        if fqn and node.target in opaque.RESTRIDING_OPS and not _restrides_as_it_is(node):
            return model.get_submodule(fqn), opaque.RESTRIDES
    return None, None


def _restrides_as_it_is(node: fx.Node) -> bool:
    """Whether an ``as_strided`` node asks for the size, strides and offset its input has
    (DTensor runs that as an alias)."""
    args: tuple[Any, ...] = node.args  # as_strided(Tensor, SymInt[], SymInt[], SymInt?): fx types them loosely
    source, size, stride = args[0].meta.get("val"), args[1], args[2]
    offset = args[3] if len(args) > 3 else None
    return isinstance(source, torch.Tensor) and (tuple(source.shape), source.stride()) == (tuple(size), tuple(stride)) \
        and offset in (None, source.storage_offset())


def _tied_parameter_names(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """Canonical FQN -> every FQN of the same parameter, for parameters tied under several names."""
    by_id: dict[int, list[str]] = {}
    for fqn, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(fqn)
    return {names[0]: tuple(names) for names in by_id.values() if len(names) > 1}


class _CallRecorder:
    """Forward hooks that map module calls to graph nodes while ``make_fx`` traces."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.calls: list[ModuleCall] = []
        self._ranges: list[tuple[str, int, int]] = []
        self._stack: list[tuple[str, int, tuple]] = []
        self._handles: list[RemovableHandle] = []

    def __enter__(self):
        for fqn, module in self.model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._pre(fqn), with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post(fqn), always_call=True))
        return self

    def reset(self) -> None:
        self.calls.clear()
        self._ranges.clear()
        self._stack.clear()

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    @staticmethod
    def _tracer_graph():
        mode = get_proxy_mode()
        return (mode.tracer, mode.tracer.graph) if mode is not None else (None, None)

    @staticmethod
    def _tensor_nodes(tree, tracer) -> tuple[tuple[str, str], ...]:
        found = []
        for path, leaf in keyed_leaves(tree):  # registered containers with keys or without
            if isinstance(leaf, torch.Tensor):
                proxy = get_proxy_slot(leaf, tracer, None)
                if proxy is not None:
                    found.append((path, proxy.proxy.node.name))
        return tuple(found)

    def _pre(self, fqn):
        def hook(module, args, kwargs):
            tracer, graph = self._tracer_graph()
            if tracer is not None:
                self._stack.append((fqn, len(graph.nodes), self._tensor_nodes((args, kwargs), tracer)))

        return hook

    def _post(self, fqn):
        def hook(module, args, output):
            tracer, graph = self._tracer_graph()
            if tracer is None or not self._stack or self._stack[-1][0] != fqn:
                return
            _, start, inputs = self._stack.pop()
            self._ranges.append((fqn, start, len(graph.nodes)))
            self.calls.append(ModuleCall(fqn, inputs, self._tensor_nodes(output, tracer)))

        return hook

    def node_owners(self, graph: fx.Graph) -> dict[str, str]:
        nodes = list(graph.nodes)
        owners: dict[str, str] = {}
        for fqn, start, end in self._ranges:  # inner calls finish first, so they win
            for node in nodes[start:end]:
                owners.setdefault(node.name, fqn)
        for node in nodes:
            owners.setdefault(node.name, "")
        return owners


def _fingerprint(graph: fx.Graph, params: dict, buffers: dict, no_grad=frozenset(), grad_leaves=frozenset()) -> str:
    digest = hashlib.sha256()
    # which ops get a gradient is not in the graph (``trace/no_grad.py``, ``trace/grad_leaves.py``)
    for kind, names in (("no_grad", no_grad), ("grad_leaves", grad_leaves)):
        if names:
            digest.update(f"{kind}|{sorted(names)}\n".encode())
    for node in graph.nodes:
        val = node.meta.get("val")
        shape = tuple(val.shape) if isinstance(val, torch.Tensor) else None
        dtype = str(val.dtype) if isinstance(val, torch.Tensor) else None
        digest.update(f"{node.op}|{node.name}|{node.target}|{node.args}|{shape}|{dtype}\n".encode())
    for fqn, tensor in list(params.items()) + list(buffers.items()):
        digest.update(f"{fqn}|{tuple(tensor.shape)}|{tensor.dtype}\n".encode())
    return "sha256:" + digest.hexdigest()[:32]
