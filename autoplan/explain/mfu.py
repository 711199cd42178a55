"""The predicted MFU, and why it is what it is: the step split into the model's FLOPs at peak and the rest.

MFU is the model's FLOPs (6 x parameters outside embedding tables x tokens, the usual
training estimate; tokens from the 2-D batch input; plus attention's score and value
products where the plan counted them, ``Plan.attention_flops``: at long sequences most of
the step) over the step time times every device's peak for the parameters' dtype (none
where the dtype is unknown). So the first row of the split, ``model FLOPs at peak`` (the
model's FLOPs over devices x peak), is exactly MFU's share of the step. The other rows are the rest of the step, from the plan's own
prediction (``predicted.compute_split``, the cost stage's per-op figures added up over
the chosen strategies, ``cost/estimate.py``'s ``COMPUTE_PARTS``) and ``predicted.comm_s``:

- other FLOPs at peak: the FLOPs the cost stage priced beyond the model's (attention's
  products where the plan does not count them, ops every device of an axis runs whole), at peak;
- matmuls below peak: what the profile's matmul efficiency adds to those FLOPs;
- memory-bound kernels: kernels bound by their traffic (norms, activations, casts,
  masks, the loss), at the profile's memory bandwidth;
- kernel launches, and the host's eager-DTensor dispatch beyond what the kernels hide;
- the optimizer step, and the forward of checkpointed layers run again;
- communication: all of it, as the cost stage counts it (added to compute, no overlap).

They add up to the step time (each row is rounded as the plan stores it). A plan written
before plans split their compute gets two rows: its compute whole, and communication.
"""

from __future__ import annotations

from autoplan.explain.patterns import parameter_numel

DTYPE_OF_SIZE = {2: "bfloat16", 4: "float32", 8: "float64"}
"""Element size -> the dtype assumed, for plan files that record no dtypes."""

COMPUTE_ROWS = (
    ("below_peak_s", "matmuls below peak (the profile's matmul efficiency)"),
    ("memory_bound_s", "memory-bound kernels (norms, activations, casts, masks, loss)"),
    ("launch_s", "kernel launches"),
    ("dispatch_s", "host dispatch beyond the kernels (eager DTensor, per op)"),
    ("optimizer_s", "optimizer step (AdamW)"),
    ("recompute_s", "forward rerun of checkpointed layers"),
)
"""``predicted.compute_split`` keys after the FLOPs, in the order shown, with their words."""


def parameter_dtype(plan) -> str | None:
    """The dtype most parameter elements have, where the plan records dtypes (plans made
    before it did: None)."""
    counts: dict[str, int] = {}
    for fqn, dtype in plan.parameter_dtypes.items():
        counts[dtype] = counts.get(dtype, 0) + parameter_numel(plan, fqn)
    return max(counts, key=lambda dtype: counts[dtype]) if counts else None


def model_flops(plan) -> tuple[float | None, str]:
    """6 x parameters outside embedding tables x tokens, and how it was counted.

    Tokens: a model with an embedding table reads token ids, a 2-D (batch x sequence) input;
    a model without one reads features, every row of its first input (all dims but the last)
    a token. The plan does not record dtypes, so this is told from the modules."""
    embeds = "Embedding" in plan.module_types.values()
    tokens = None
    for batch in plan.inputs.values():
        if embeds and len(batch.shape) == 2:
            tokens = batch.shape[0] * batch.shape[1]
            break
        if not embeds and len(batch.shape) >= 2:
            tokens = 1
            for size in batch.shape[:-1]:
                tokens *= size
            break
    if tokens is None:
        return None, "MFU needs tokens: no batch x sequence (ids) or rows x features input"
    params = 0
    for fqn in plan.parameter_shapes:
        if plan.module_types.get(fqn.rpartition(".")[0]) == "Embedding":
            continue  # a lookup, no matmul
        params += parameter_numel(plan, fqn)
    experts = any(len(shape) == 3 and "expert" in fqn.lower() for fqn, shape in plan.parameter_shapes.items())
    note = "; counts every expert, though each token uses only its top-k: an upper bound" if experts else ""
    attention = getattr(plan, "attention_flops", 0.0)
    if attention:
        note = f"; with attention's products, {attention:.3g} FLOPs ({attention / (6.0 * params * tokens + attention):.0%})" + note
    return 6.0 * params * tokens + attention, note


def mfu_of(plan, cluster, element_bytes):
    """(model FLOPs, MFU, how it was counted, the model FLOPs at every device's peak in
    seconds); MFU and the seconds are None where they cannot be told."""
    flops, note = model_flops(plan)
    if flops is None or cluster is None:
        return flops, None, note, None
    dtype = parameter_dtype(plan) or DTYPE_OF_SIZE.get(element_bytes or 0)
    if dtype is None:
        return flops, None, "MFU needs the parameters' dtype: this plan file records none and its model state tells none", None
    devices = 1
    for size in plan.mesh_shape:
        devices *= size
    if getattr(plan, "pipeline", None) is not None:  # the plan's mesh is one stage's: the pipeline axis runs them all
        devices *= plan.pipeline.size
    at_peak = flops / (cluster.flops_for(dtype) * devices)
    step = plan.predicted.step_time_s
    if step <= 0:
        return flops, None, note, None
    counted = "6·N·tokens + attention" if getattr(plan, "attention_flops", 0.0) else "6·N·tokens"
    return flops, at_peak / step, f"{counted} over {devices} x {cluster.flops_for(dtype):.3g} FLOP/s ({dtype}){note}", at_peak


def mfu_line(s) -> str:
    if s.mfu is None:
        return f"MFU not computed: {s.mfu_note}"
    return f"predicted MFU {s.mfu:.1%} ({s.model_flops:.3g} model FLOPs per step, {s.mfu_note})"


def step_rows(s) -> tuple[tuple[str, float], ...]:
    """(what, seconds) rows of a ``show.Summary``'s step, adding up to its step time."""
    split = s.compute_split
    if not split:
        # A pipelined plan's compute is told per stage (its stage table); other plans without a
        # split were written before plans recorded one.
        why = "a pipelined plan's compute is in its stage table" if s.stage_sections else "the plan file predates the split"
        return ((f"compute (not split: {why})", s.compute_s),
                ("communication (exposed: not overlapped with compute)", s.comm_s))
    rows = []
    if s.model_flops_at_peak_s is not None:
        if getattr(s, "attention_flops", 0.0):  # attention's products are the model's FLOPs here
            counted, other = "(6·N·tokens + attention)", "ops run whole on an axis"
        else:
            counted, other = "6·N·tokens", "attention scores, ops run whole on an axis"
        rows.append((f"model FLOPs at peak ({counted} / (devices x peak)): the MFU", s.model_flops_at_peak_s))
        rows.append((f"other FLOPs at peak ({other})", split["arithmetic_s"] - s.model_flops_at_peak_s))
    else:
        rows.append(("FLOPs at peak (every op's)", split["arithmetic_s"]))
    rows.extend((words, split[key]) for key, words in COMPUTE_ROWS)
    rows.append(("communication (exposed: not overlapped with compute)", s.comm_s))
    return tuple(rows)


def mfu_section(s):
    """The "model FLOPs utilisation" section: the MFU line, then the step split that explains it."""
    from autoplan.explain.render import Section
    from autoplan.units import ms

    def share(seconds: float) -> str:
        return "-" if s.step_time_s <= 0 else f"{seconds / s.step_time_s:.1%}"

    rows = step_rows(s)
    table = [(what, ms(seconds), share(seconds)) for what, seconds in rows]
    table.append(("step", ms(s.step_time_s), share(s.step_time_s)))
    notes = [mfu_line(s)]
    notes.extend(_why(s, rows))
    return Section("model FLOPs utilisation: where the step goes", ("part", "ms", "of step"), tuple(table),
                   notes=tuple(notes), right=(1, 2))


def _why(s, rows) -> list[str]:
    """The largest part of the step beside the model's FLOPs, in words, and what a negative
    "other FLOPs" row means."""
    notes = []
    others = [(what, seconds) for what, seconds in rows if not what.startswith("model FLOPs")]
    if s.step_time_s > 0 and others:
        what, seconds = max(others, key=lambda row: row[1])
        notes.append(f"the largest part beside the model's FLOPs: {what.split(' (')[0]}, "
                     f"{seconds / s.step_time_s:.0%} of the step")
    if s.model_flops_at_peak_s is not None and s.compute_split:
        other = s.compute_split["arithmetic_s"] - s.model_flops_at_peak_s
        if other < -1e-3 * s.step_time_s:  # not a rounding residue (attention counted both ways)
            notes.append("other FLOPs is negative: the model's FLOPs count more than the ops the cost stage priced "
                         "(every expert of a mixture, a matmul its FLOP counter does not know)")
    return notes
