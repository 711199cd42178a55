"""Where a parameter's module gathers it: the layout each parameter is computed with.

A parameter stored split and computed with in another layout is moved by its module's
hook just before use (``Plan.parameter_uses``, ``apply/engine.py``), where every use asks
for the same layout; one whose uses disagree arrives at each op as stored, and DTensor
moves it there as that op's strategy asks (``plan/collectives.py``). The prediction reads
the hooks' moves from here too: which hook moves a parameter for a read (the outermost
around it, ``outermost_hook``), and how often (``hook_gather``).
"""

from __future__ import annotations

from collections import Counter

from autoplan.choices.graph import PARAMETER
from autoplan.cost.estimate import is_view
from autoplan.plan.module_plan import ROOT_MODULE as ROOT
from autoplan.plan.views import layouts_after_views, spec_before_views, view_chain, within


def parameter_uses(choices, choice: dict[str, int], storage: dict) -> tuple[dict, dict]:
    """(FQN -> the layout its module computes with, where that differs from how it is
    stored; FQN -> the other modules that read it, ``Plan.parameter_readers``).

    A parameter stored sharded and used replicated (FSDP-style) is gathered by its module
    just before use; recording the planned use layout lets the apply engine do that
    gather itself rather than leave it to DTensor's runtime choice, which may differ from
    the plan (and, for some ops, ignores a sharded weight: DTensor's convolution rule runs
    the local shard of a depthwise filter). A tied parameter used by two modules gets an
    entry under each module's own FQN. One read in another module's own code (Mamba's
    mixer convolving with ``self.conv1d.weight``) is keyed by the parameter's first name,
    and that module gathers it too: the owner's forward never runs around that read.
    """
    traced = choices.traced
    found: dict[str, set] = {}
    read_by: dict[str, set] = {}
    for node, fqns in traced.parameters.items():
        for consumer, spec in _uses(choices, choice, node):
            reader = traced.node_modules.get(consumer, "")
            fqn = next((f for f in fqns if f.rpartition(".")[0] == reader), None)
            if fqn is None:
                fqn = fqns[0]
                # read in code the owner's forward does not wrap, and not by an opaque region
                # (which gathers all it reads itself: ``apply/engine._run_replicated``)
                outside = not within(reader, fqn.rpartition(".")[0])
                if outside and not any(within(reader, region) for region in traced.opaque_modules):
                    read_by.setdefault(fqn, set()).add(reader)
            found.setdefault(fqn, set()).add(spec)
    uses = {
        fqn: next(iter(specs))
        for fqn, specs in sorted(found.items())
        if len(specs) == 1 and next(iter(specs)) != storage[fqn]
    }
    return uses, {fqn: tuple(sorted(read_by[fqn])) for fqn in uses if fqn in read_by}


def _uses(choices, choice: dict[str, int], node: str):
    """(consumer, spec) for each use of parameter ``node``: the layout the parameter itself
    must have for that use (``through_views``). A view of it that nothing reads is no use:
    no op computes with it, so its layout must not stop the parameter's one real use from
    being gathered (Zamba2's mixer takes ``self.conv1d.weight.squeeze(1)`` once more than
    it convolves with, and DTensor's convolution runs a depthwise filter's local shard as is)."""
    graph = choices.graph
    for _, consumer, key in graph.out_edges(node, keys=True):
        found = through_views(graph, choice, consumer, key)
        if found is not None and not _unread_view(graph, found[0]):
            yield found


def _unread_view(graph, name: str) -> bool:
    """Whether ``name`` is a view whose value no op reads (a dead end of the traced step)."""
    return is_view(graph.decision(name)) and graph.out_degree(name) == 0


def through_views(graph, choice: dict[str, int], consumer: str, key: int, inside=lambda node: True):
    """(op, spec): the first non-view op down the views from input ``key`` of ``consumer``
    (``views.view_chain``), and the layout the chain's input must have to give that op the
    spec its strategy asks for. A value laid out so is what the op computes with; laid out
    as the view's own strategy takes it, DTensor would be free to choose another strategy
    for the op. None if no view strategy gives it."""
    chain = view_chain(graph, consumer, key, inside)
    last, last_key = chain[-1]
    wanted = spec_before_views(graph, chain, graph.decision(last).strategies[choice[last]].inputs[last_key])
    return None if wanted is None else (last, wanted)


def gathered_parameters(choices, choice: dict[str, int]) -> dict[str, dict[str, tuple]]:
    """The parameter nodes a module's hook moves to the layout their uses ask for (one
    layout for every use, not the stored one), each with the modules whose hooks move it
    (its owner and its ``Plan.parameter_readers``) and the layout each moves it to; the
    others arrive at each op as stored."""
    traced = choices.traced
    storage = {fqn: choices.graph.decision(node).strategies[choice[node]].output(0)
               for node, fqns in traced.parameters.items() for fqn in fqns}
    uses, readers = parameter_uses(choices, choice, storage)
    found: dict[str, dict[str, tuple]] = {}
    for node, fqns in traced.parameters.items():
        for fqn in fqns:
            if fqn in uses:
                for module in (fqn.rpartition(".")[0], *readers.get(fqn, ())):
                    found.setdefault(node, {})[module] = tuple(uses[fqn])
    return found


def hooked_reads(graph, owners: dict, made, gathered: dict) -> dict[tuple[str, str, int], tuple]:
    """``(value, reader, input index) -> (arrived, read)`` for the reads of a parameter a
    module's hook moves, and of the views between it and its compute op.

    The hook around the read (``outermost_hook``) moves it to the layout the compute op
    reads (``Plan.parameter_uses``), and each view on the way runs on what the hook made,
    whatever view strategy the plan picked: no view strategy takes a multi-axis layout,
    and a view the plan runs on the stored split hands on a split the hook has gathered
    already (Gemma 4 takes a row of its embedding, gathered whole for its lookup, as
    ``weight[pad]``). ``gathered``: parameter -> {module: the layout its hook moves it
    to} (``parameter_uses.gathered_parameters``); ``owners``: node -> its module."""
    found = {}
    for decision in graph.decisions():
        hooks = gathered.get(decision.name) if decision.kind == PARAMETER else None
        if hooks is None:
            continue
        stored = made(decision.name, 0)
        for _, v, k in graph.out_edges(decision.name, keys=True):
            hook = outermost_hook(hooks, owners.get(v) or "")
            if hook is None:
                continue
            chain = view_chain(graph, v, k)
            layouts = layouts_after_views(graph, chain, hooks[hook])
            if layouts is None:
                continue
            found[(decision.name, v, k)] = (stored, layouts[0])
            for (view, _), (after, after_key), layout in zip(chain, chain[1:], layouts[1:]):
                found[(view, after, after_key)] = (layout, layout)
    return found


def outermost_hook(hooks, module: str) -> str | None:
    """The outermost of ``hooks``' modules around ``module`` (None: none is): its hook moves
    the parameter, and an inner one, called inside it, finds it moved already
    (``apply/parameters.gather_parameters_for_use``)."""
    around = [m for m in hooks if m == "" or within(module, m)]
    return min(around, key=len) if around else None  # nested names are prefixes


def hook_gather(parameter, hooks, module, stored, calls: Counter, counted: set) -> list | None:
    """The move of ``parameter`` by the hook around an op in ``module``, as a forward leg
    ``(before, after, where, charged module, times)`` in a list; [] where that move is
    counted already; None where no hook is around the op.

    The hook moves it once per call of its module, for every read inside: Gemma 4's model
    gathers its embedding's weight once for the embedding's lookup and its own ``weight[pad]``."""
    hook = outermost_hook(hooks, module)
    if hook is None:
        return None
    if (parameter, hook) in counted:
        return []
    counted.add((parameter, hook))
    charged = hook or ROOT
    return [(stored, hooks[hook], ("gather", charged), charged, calls[hook])]


def hook_calls(
    graph, owners: dict, gathered: dict, calls: Counter, order: dict[str, int]
) -> dict[tuple[str, str, int], tuple[str, int]]:
    """``(parameter, reader, input index) -> (hook module, which of its calls)``: the call of
    the hook (``outermost_hook``) whose move a read of a parameter goes through.

    A hook moves the parameter once per call of its module, for every read inside, so the
    gradients of one call's reads are summed before that move's backward brings them back
    to the storage: NeoMME's model gathers its embedding projection, tied to the head's
    unembedding, for the embedding's product and its own, and reduce-scatters the sum once.
    The reads of a hook are dealt to its calls in forward order, as many to each (a module's
    code reads the same in every call: ALBERT's one layer, run twice, one read a call);
    where they do not divide evenly, each read is taken for a call of its own. ``order``:
    node -> its position in the graph."""
    found = {}
    for parameter, hooks in gathered.items():
        by_hook: dict[str, list] = {}
        for _, v, k in graph.out_edges(parameter, keys=True):
            hook = outermost_hook(hooks, owners.get(v) or "")
            if hook is not None:
                by_hook.setdefault(hook, []).append((order[v], v, k))
        for hook, reads in by_hook.items():
            times = max(1, calls[hook])
            per_call = len(reads) // times if len(reads) % times == 0 else 1
            for index, (_, v, k) in enumerate(sorted(reads)):
                found[(parameter, v, k)] = (hook, index // per_call)
    return found


def parameter_module(choices, node: str) -> str:
    fqns = choices.traced.parameters.get(node, ())
    return fqns[0].rpartition(".")[0] if fqns else ROOT
