"""What autoplan changes in DTensor, installed only while autoplan plans or runs a planned model.

Importing autoplan changes nothing in torch. The changes below are put in place by
``install()`` (or ``with installed():``) and taken out again by the matching
``uninstall()``; installs nest (a count), so the planner's stages and a planned model's
forward and backward can each hold them without knowing about the others:

- sharding rules DTensor lacks (``rules.py``), and the replicate fallback for ops a plan
  lists in ``fallback_ops`` (only while an install that names them holds: a planned model's
  run, not the planner's stages, which must see DTensor's registry without them to find
  such ops at all): added to DTensor's registry, deleted again;
- DTensor's rules for the reshaping views, wrapped (``view_rules.py``);
- DTensor's strategy functions, wrapped to also offer the layout that keeps every input's
  split (``merged_inputs.py``);
- DTensor's per-op strategy selection, wrapped (``strategy_choice.py``);
- DTensor's rule for ``unbind``, wrapped to gather a split of the unbound dim where it
  refuses one (``unbind_split.py``);
- DTensor's rules for ``masked_fill``, wrapped so that a fill with zeros keeps a partial
  value partial (``zero_fill.py``);
- DTensor's ``redistribute_local_tensor`` as its dispatcher calls it, wrapped so that the
  backward reuses a forward move autograd saved (``saved_inputs.py``) and a moved shard is
  laid out in the order of its DTensor's strides (``local_strides.py``), as is the result
  of an op autoplan runs itself (``_run_here``, below);
- fake-tensor kernels for what the device kernels accept, and a convolution's result on
  the meta device laid out as the device kernels lay it out (``fake_kernels.py``);
- cross-entropy on logits split by class (``loss_parallel.py``): DTensor custom op handlers;
- ``as_strided`` DTensor cannot express (made by ``torch.compile``), run on the gathered
  tensor, replicated, in a planned step (``restrided.py``);
- an in-place op run replicated for want of a rule, on a self that arrives split: a custom
  op handler that writes the result back into self's shard (``replicated_in_place.py``);
- DTensor's convolution handlers, set aside so that its ordinary dispatch runs the
  convolution strategies the planner reads (``convolution.py``);
- where DTensor refuses a rule row that lays out an output the op was asked not to make
  (torch 2.14, a bias-free convolution's backward), that output left out of every row
  (``masked_outputs.py``).

Sharding decisions DTensor caches depend on these rules, so each side keeps its own. The
Python-level propagation (cached and uncached entry points alike) answers from autoplan's
own cache while installed, so both sides' Python caches stay warm. DTensor's C++ fast-path
cache cannot be swapped, so autoplan keeps its own decisions out of it: where autoplan's
rules decide an op otherwise than DTensor's would (a view kept unstrided, a strategy that
keeps a replicated axis whole, a rule DTensor lacks), the op is run from Python
(``_run_here``) instead of handing the decision back to the C++ dispatcher, which would
cache it. What that cache holds is then DTensor's own decision either way, and nobody's
cache is ever cleared. (A caveat: an op that DTensor code outside autoplan ran with exactly
the same shapes and layouts is answered from that cache with DTensor's own decision.)

Every internal name is looked up at install time; if the running torch has moved one, the
install fails with one line naming it, before anything is changed.
"""

from __future__ import annotations

import functools
import threading
import warnings
from contextlib import contextmanager

import torch

from autoplan.errors import AutoplanError

_lock = threading.RLock()
_depth = 0
_fallback_counts: dict = {}
"""op -> how many installs in force name it as a fallback op."""
_restore: list = []
"""(container, key, old value or _ABSENT) for each change in force, in the order made."""
_own_cache = None
_ABSENT = object()
_deciding = threading.local()
"""Per thread: whether the propagation under way decided otherwise than DTensor would."""


class DTensorInternalsError(AutoplanError):
    """The running torch's DTensor lacks an internal autoplan changes while it runs."""


def install(fallback_ops=()) -> None:
    """Put autoplan's DTensor changes in place (nested installs only count). ``fallback_ops``:
    ops DTensor runs replicated (and their backward ops, where those lack a rule) until the
    matching ``uninstall(fallback_ops)`` (a plan's ``fallback_ops``)."""
    global _depth
    with _lock:
        added = _count_fallbacks(fallback_ops, +1)
        if _depth == 0:
            _apply(_changes())
        elif added:  # already in force: re-install with the ops included
            _undo()
            _apply(_changes())
        _depth += 1


def uninstall(fallback_ops=()) -> None:
    """Undo one ``install(fallback_ops)``; the last one restores torch exactly."""
    global _depth
    with _lock:
        if _depth == 0:
            raise RuntimeError("autoplan's DTensor changes are not installed")
        _depth -= 1
        dropped = _count_fallbacks(fallback_ops, -1)
        if _depth == 0:
            _undo()
        elif dropped:  # still in force: re-install without the ops no install names now
            _undo()
            _apply(_changes())


def _count_fallbacks(ops, step: int) -> bool:
    """Count ``ops`` in (+1) or out (-1); whether the set of fallback ops changed."""
    changed = False
    for op in ops:
        count = _fallback_counts.get(op, 0) + step
        changed |= count == (1 if step > 0 else 0)  # the first install naming it, or the last
        if count:
            _fallback_counts[op] = count
        else:
            del _fallback_counts[op]
    return changed


@contextmanager
def installed(fallback_ops=()):
    """``install(fallback_ops)`` for the duration of the block."""
    install(fallback_ops)
    try:
        yield
    finally:
        uninstall(fallback_ops)


def _diverged() -> None:
    """Called by autoplan's rules whenever they decide otherwise than DTensor would."""
    _deciding.diverged = True


def _changes() -> list[tuple[object, object, object]]:
    """(container, key, new value) for every change, every internal looked up first."""
    from autoplan.dtensor import (
        convolution,
        fake_kernels,
        local_strides,
        loss_parallel,
        masked_outputs,
        merged_inputs,
        replicated_in_place,
        restrided,
        rules,
        saved_inputs,
        strategy_choice,
        unbind_split,
        uninitialised,
        view_rules,
        zero_fill,
    )

    propagator = _internal(lambda: torch.distributed.tensor.DTensor._op_dispatcher.sharding_propagator,
        "DTensor._op_dispatcher.sharding_propagator")
    sharding_prop = _internal(lambda: __import__("torch.distributed.tensor._sharding_prop", fromlist=["_"]),
        "torch.distributed.tensor._sharding_prop")
    dispatch = _internal(lambda: __import__("torch.distributed.tensor._dispatch", fromlist=["_"]), "torch.distributed.tensor._dispatch")
    redistribute = _internal(lambda: __import__("torch.distributed.tensor._redistribute", fromlist=["_"]),
        "torch.distributed.tensor._redistribute")
    api = _internal(lambda: __import__("torch.distributed.tensor._api", fromlist=["_"]), "torch.distributed.tensor._api")
    fake_impls = _internal(lambda: __import__("torch._subclasses.fake_impls", fromlist=["_"]).op_implementations_dict,
        "fake_impls.op_implementations_dict")
    for owner, name in (
        (sharding_prop, "_select_min_cost_strategy"), (dispatch, "redistribute_local_tensor"),
        (propagator, "op_strategy_funcs"), (propagator, "op_single_dim_strategy_funcs"),
        (propagator, "op_to_schema_info"), (propagator, "propagate_op_sharding"),
        (propagator, "propagate_op_sharding_non_cached"), (sharding_prop, "_are_we_tracing"),
        (dispatch.OpDispatcher, "_propagate_op_sharding_dispatch_slow_path"),
        (dispatch.OpDispatcher, "_dispatch_get_local_results_slow_path"), (dispatch.OpDispatcher, "_dispatch_fast_path_python_tail"),
        (dispatch.OpDispatcher, "wrap"), (dispatch.OpDispatcher, "unwrap_to_op_info"),
        (torch.distributed.tensor.DTensor._op_dispatcher, "_custom_op_handlers"),
    ):
        _internal(lambda: getattr(owner, name), f"{getattr(owner, '__name__', type(owner).__name__)}.{name}")  # noqa: B023 - called in this iteration

    def has_rule(op) -> bool:
        return op in propagator.op_strategy_funcs or op in propagator.op_single_dim_strategy_funcs

    changes = []
    added = {}
    for op, strategy, schema_info in [*rules.builtin_rules(), *rules.fallback_rules(_fallback_counts, has_rule)]:
        if op not in added and not has_rule(op):  # never replace a rule torch has
            added[op] = (strategy, schema_info)
    for op, (strategy, schema_info) in added.items():
        changes.append((propagator.op_strategy_funcs, op, _own_rule(strategy)))
        changes.append((propagator.op_to_schema_info, op, schema_info))
    changes.extend(_borrowed_rules(propagator, rules.SAME_RULE_AS, has_rule))
    for op in view_rules.RESHAPING_VIEWS:
        rule = propagator.op_strategy_funcs.get(op)
        if rule is not None:
            changes.append((propagator.op_strategy_funcs, op, view_rules.unstrided(rule, _diverged)))
    for op, rule in list(propagator.op_strategy_funcs.items()):
        if op in uninitialised.EMPTY_LIKES:  # torch 2.13 writes their rule as a strategy function
            rule = uninitialised.not_partial_specs(rule, _diverged)
        if op == unbind_split.UNBIND:
            rule = unbind_split.gathering_split_dim(rule, _diverged)
        if op not in view_rules.RESHAPING_VIEWS:
            changes.append((propagator.op_strategy_funcs, op, merged_inputs.merged(rule, _diverged)))
    for op in uninitialised.EMPTY_LIKES:  # torch 2.14 as a single-axis rule
        info = propagator.op_single_dim_strategy_funcs.get(op)
        if info is not None:
            changes.append((propagator.op_single_dim_strategy_funcs, op, uninitialised.not_partial_rows(info, _diverged)))
    for op in zero_fill.MASKED_FILLS:
        info = propagator.op_single_dim_strategy_funcs.get(op)
        if info is not None:
            changes.append((propagator.op_single_dim_strategy_funcs, op, zero_fill.with_zero_fill_partials(info, _diverged)))
    if masked_outputs.refuses_mixed_outputs():  # torch 2.14: asked of DTensor, before any change is in force
        for op in masked_outputs.OUTPUT_MASKS:
            info = propagator.op_single_dim_strategy_funcs.get(op)
            if info is not None:
                changes.append((propagator.op_single_dim_strategy_funcs, op,
                                masked_outputs.without_masked_outputs(op, info, _diverged)))
    changes.append((sharding_prop, "_select_min_cost_strategy",
        strategy_choice.selection(sharding_prop._select_min_cost_strategy, _diverged)))
    move = local_strides.laid_out_as_global(dispatch.redistribute_local_tensor)
    changes.append((dispatch, "redistribute_local_tensor", saved_inputs.reusing(move)))
    for module in (redistribute, api):  # ``DTensor.redistribute`` and ``from_local``'s backward
        own = _internal(lambda: module.redistribute_local_tensor, f"{module.__name__}.redistribute_local_tensor")  # noqa: B023 - called in this iteration
        changes.append((module, "redistribute_local_tensor", local_strides.laid_out_as_global(own)))
    for op, kernel in fake_kernels.KERNELS.items():
        if op not in fake_impls:  # never replace a kernel torch registered
            changes.append((fake_impls, op, kernel))
    for op in fake_kernels.DEVICE_LAYOUTS:
        if op in fake_impls:
            changes.append((fake_impls, op, fake_kernels.laid_out_as_on_device(fake_impls[op])))
    handlers = torch.distributed.tensor.DTensor._op_dispatcher._custom_op_handlers
    for op, handler in loss_parallel.HANDLERS.items():
        if op not in handlers:  # never replace a handler torch (or its loss_parallel()) has
            changes.append((handlers, op, handler))
    for op in convolution.set_aside(handlers, has_rule):
        changes.append((handlers, op, _ABSENT))
    if restrided.AS_STRIDED in handlers:
        changes.append((handlers, restrided.AS_STRIDED,
                        restrided.replicated_where_refused(handlers[restrided.AS_STRIDED], lambda: _planned_steps > 0)))
    for op, (strategy, _) in added.items():
        if strategy is rules.replicate_everything and replicated_in_place.applies_to(op) and op not in handlers:
            changes.append((handlers, op, replicated_in_place.handler))
    cache = _autoplan_cache(propagator, sharding_prop._are_we_tracing)
    changes.append((propagator, "propagate_op_sharding", cache))
    changes.append((propagator, "propagate_op_sharding_non_cached", cache.uncached_entry))
    dispatcher = torch.distributed.tensor.DTensor._op_dispatcher
    changes.append((dispatcher, "_propagate_op_sharding_dispatch_slow_path", _run_here(dispatcher, cache)))
    return changes


def _borrowed_rules(propagator, same_rule_as: dict, has_rule) -> list[tuple[object, object, object]]:
    """Changes giving each op of ``same_rule_as`` without a rule the rule of its twin (as
    DTensor registered it: a strategy function or a single-axis rule), marked autoplan's own."""
    import dataclasses

    single = getattr(propagator, "op_single_dim_strategy_funcs", {})
    single_info = getattr(propagator, "op_to_schema_info_for_single_dim_strategy", None)
    changes: list[tuple[object, object, object]] = []
    for op, twin in same_rule_as.items():
        if has_rule(op):
            continue
        if twin in propagator.op_strategy_funcs:
            changes.append((propagator.op_strategy_funcs, op, _own_rule(propagator.op_strategy_funcs[twin])))
            if twin in propagator.op_to_schema_info:
                changes.append((propagator.op_to_schema_info, op, propagator.op_to_schema_info[twin]))
        elif twin in single:
            info = single[twin]
            changes.append((single, op, dataclasses.replace(info, func=_own_rule(info.func))))
            if single_info is not None and twin in single_info:
                changes.append((single_info, op, single_info[twin]))
    return changes


def _internal(lookup, name: str):
    try:
        return lookup()
    except (AttributeError, ImportError) as err:
        raise DTensorInternalsError(
            f"this torch ({torch.__version__}) has no {name}, which autoplan changes while it plans and runs plans",
            hint="use a torch version autoplan supports (see docs/getting-started.md#install)",
        ) from err


def _own_rule(strategy):
    """A rule DTensor lacks: whatever it decides, DTensor alone would have failed."""

    @functools.wraps(strategy)
    def rule(*args, **kwargs):  # a strategy function's (op_schema) or a single-axis rule's (op, args, kwargs)
        _diverged()
        return strategy(*args, **kwargs)

    return rule


class _PropagationCache:
    """autoplan's own cache of DTensor's propagation, made once so that it stays warm
    between installs, with the decisions where autoplan's rules answered otherwise than
    DTensor's would. DTensor asks its uncached entry point whenever its C++ cache misses;
    that one answers from here too, except while tracing (symbolic shapes)."""

    def __init__(self, propagate_uncached, are_we_tracing):
        self._propagate = propagate_uncached
        self._are_we_tracing = are_we_tracing
        self._cached = functools.lru_cache(None)(self._decide)
        self.autoplans_own: set = set()
        """The op schemas whose decision is autoplan's own."""

    def _propagate_or_replicate(self, op_schema):
        """DTensor's propagation; an op a planned step meets with no rule runs replicated
        (``_replicate_unplanned``), eager or traced by ``torch.compile`` alike."""
        try:
            return self._propagate(op_schema)
        except NotImplementedError as err:
            if _NO_RULE not in str(err) or not _replicate_unplanned(op_schema.op):
                raise
            return self._propagate(op_schema)

    def _decide(self, op_schema):
        outer = getattr(_deciding, "diverged", False)
        _deciding.diverged = False
        try:
            result = self._propagate_or_replicate(op_schema)
            if _deciding.diverged:
                self.autoplans_own.add(op_schema)
        finally:
            _deciding.diverged = outer or _deciding.diverged
        return result

    def __call__(self, op_schema):
        if not _hashable(op_schema):  # symbolic sizes, met outside what DTensor calls tracing
            return self._decide_symbolic(op_schema)
        return self._cached(op_schema)

    def uncached_entry(self, op_schema):
        if not self._are_we_tracing() and _hashable(op_schema):
            return self._cached(op_schema)
        return self._decide_symbolic(op_schema)

    def _decide_symbolic(self, op_schema):
        # While tracing, shapes may be symbolic (dynamo's dynamic shapes), and a schema with
        # a symbolic size cannot be hashed: neither cached nor kept in ``autoplans_own``.
        # Whether the decision was autoplan's own is kept for this schema object alone, on
        # this thread, for ``decided_by_autoplan`` to read right after.
        outer = getattr(_deciding, "diverged", False)
        _deciding.diverged = False
        try:
            result = self._propagate_or_replicate(op_schema)
            _deciding.traced = (op_schema, _deciding.diverged)
        finally:
            _deciding.diverged = outer or _deciding.diverged
        return result

    def decided_by_autoplan(self, op_schema) -> bool:
        """Whether the decision on ``op_schema`` just made was autoplan's own rather than
        DTensor's: from the cache's record, or, for a schema decided while tracing, from
        the record of that very schema object."""
        traced = getattr(_deciding, "traced", None)
        if traced is not None and traced[0] is op_schema:
            return traced[1]
        return _hashable(op_schema) and op_schema in self.autoplans_own


def _hashable(op_schema) -> bool:
    """Whether ``op_schema`` can be hashed: not where a size is symbolic ("unhashable type:
    non-nested SymInt"; dynamo makes a shape dynamic once it meets a second one, and DTensor's
    own test of tracing does not always say so: timm's CrossViT compiled whole)."""
    try:
        hash(op_schema)
    except TypeError:
        return False
    return True


_NO_RULE = "does not have a sharding strategy registered"
_unplanned_warned: set = set()
"""Ops run replicated for want of a rule that no plan listed, each warned about once."""
_planned_steps = 0
"""How many planned steps (forwards, backwards) are under way: only they replicate an op
without a rule (``autoplan calibrate`` skips such an op instead)."""


def enter_planned_step() -> None:
    """A planned model's forward or backward starts: an op it meets with no DTensor rule
    runs replicated (``_replicate_unplanned``) instead of failing."""
    global _planned_steps
    with _lock:
        _planned_steps += 1


def leave_planned_step() -> None:
    global _planned_steps
    with _lock:
        _planned_steps -= 1


@contextmanager
def planned_step():
    """``enter_planned_step`` for the duration of the block."""
    enter_planned_step()
    try:
        yield
    finally:
        leave_planned_step()


def _replicate_unplanned(op) -> bool:
    """Run ``op``, met in a planned step with no DTensor rule and not in the plan's
    ``fallback_ops`` (the trace never saw it: a kernel on the device that the meta kernels
    did not run), replicated from now until the changes are undone, as a plan's fallback
    op runs; a warning names it once. False where it is no op to add a rule for."""
    if not isinstance(op, torch._ops.OpOverload) or _depth == 0 or _planned_steps == 0:
        return False
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

    from autoplan.dtensor import replicated_in_place, rules

    dispatcher = torch.distributed.tensor.DTensor._op_dispatcher
    propagator = dispatcher.sharding_propagator
    if op in propagator.op_strategy_funcs:
        return False
    changes = [
        (propagator.op_strategy_funcs, op, _own_rule(rules.replicate_everything)),
        (propagator.op_to_schema_info, op, RuntimeSchemaInfo(needs_pytree=True)),
    ]
    if replicated_in_place.applies_to(op) and op not in dispatcher._custom_op_handlers:
        # From its next call on; this one is already being propagated (its self moved, not written back).
        changes.append((dispatcher._custom_op_handlers, op, replicated_in_place.handler))
    _apply(changes)
    if op not in _unplanned_warned:
        _unplanned_warned.add(op)
        warnings.warn(
            f"autoplan: {op} has no DTensor sharding rule and the plan did not list it (the trace did not "
            "run it): it runs replicated (its inputs gathered), which the plan's prediction does not count",
            stacklevel=2,
        )
    return True


def propagate_uncached(op_schema):
    """DTensor's propagation of ``op_schema`` with autoplan's rules, kept out of every
    cache: for queries on a planning mesh, which compares equal to the mesh it stands for,
    so a cached answer would hand a run specs on a mesh without process groups."""
    if not _depth or _own_cache is None:
        raise RuntimeError("autoplan's DTensor overrides are not installed")
    return _own_cache._propagate(op_schema)


def forget_cached_decisions() -> None:
    """Drop autoplan's cached propagation decisions (a rule's answers changed: the context
    axis of ``context_attention.active``); DTensor's own caches are left as they are."""
    if _own_cache is not None:
        _own_cache._cached.cache_clear()


def forget_decisions() -> None:
    """Empty every cache of sharding decisions: DTensor's (C++ and Python) and autoplan's own.

    Called when a process group autoplan made for itself (a dry run's fake world) is torn
    down. A device mesh compares equal to any mesh of the same shape and axis names, so a
    decision cached on the torn-down mesh would be the answer to the same op on the user's
    own mesh later in the process, and hand that run specs whose mesh has no process group
    any more ("Group ... is not registered", seen where a plan's compiled step followed its
    planning in one process)."""
    from torch.distributed.tensor import DTensor

    clear_native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear_native is not None:
        clear_native()
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    if _own_cache is not None:
        with _lock:
            _own_cache._cached.cache_clear()
            _own_cache.autoplans_own.clear()


def _autoplan_cache(propagator, are_we_tracing) -> _PropagationCache:
    global _own_cache
    if _own_cache is None:
        _own_cache = _PropagationCache(propagator.propagate_op_sharding_non_cached, are_we_tracing)
    return _own_cache


def _run_here(dispatcher, cache: _PropagationCache):
    """DTensor's sharding step of its C++ dispatch, which runs an op whose decision is
    autoplan's own to the end in Python, so that the C++ cache never stores it. A result
    that is no view is laid out in the order of its DTensor's strides (``local_strides.py``)."""
    from torch.utils._python_dispatch import return_and_correct_aliasing

    from autoplan.dtensor import local_strides

    decide = type(dispatcher)._propagate_op_sharding_dispatch_slow_path.__get__(dispatcher)

    def slow_path(op_call, args, kwargs, op_info, try_cache):
        sharding = decide(op_call, args, kwargs, op_info, try_cache)
        if not hasattr(sharding, "output_spec") or not cache.decided_by_autoplan(op_info.schema):
            return sharding  # DTensor's own decision (or the op's result, decomposed)
        op_info.output_sharding = sharding
        mesh = op_info.compute_mesh
        participating = mesh.get_coordinate() is not None
        local = dispatcher._dispatch_get_local_results_slow_path(op_call, args, op_info)
        inplace, out_variant = op_info.schema.is_inplace_op(), op_info.schema.is_out_variant_op()
        if inplace or out_variant or sharding.output_spec is None:
            return dispatcher._dispatch_fast_path_python_tail(
                op_call, args, kwargs, mesh, sharding, local, participating, inplace, out_variant
            )
        is_view = op_call._schema._is_view_op()
        if not is_view:  # DTensor's strides come from the fake kernel, the shard's from the device's
            local = local_strides.results_laid_out_as_global(local, sharding.output_spec)
        result = dispatcher.wrap(local, sharding.output_spec)
        if participating and is_view:
            return return_and_correct_aliasing(op_call, args, kwargs, result)
        return result

    return slow_path


def _apply(changes) -> None:
    for container, key, value in changes:
        _restore.append((container, key, _get(container, key)))
        _set(container, key, value)


def _undo() -> None:
    while _restore:
        container, key, old = _restore.pop()
        _set(container, key, old)


def _get(container, key):
    """The value in force, or _ABSENT where none is set on ``container`` itself (a dict
    without the key; an object whose attribute comes from its class)."""
    if isinstance(container, dict):
        return container.get(key, _ABSENT)
    return vars(container).get(key, _ABSENT)


def _set(container, key, value) -> None:
    if isinstance(container, dict):
        if value is _ABSENT:
            container.pop(key, None)
        else:
            container[key] = value
    elif value is _ABSENT:
        delattr(container, key)
    else:
        setattr(container, key, value)


def while_installed(function):
    """``function`` run with the changes installed (a stage entry point that needs them)."""

    @functools.wraps(function)
    def run(*args, **kwargs):
        with installed():
            return function(*args, **kwargs)

    return run
