"""``report``: one self-contained HTML file to look at a plan: the ``show`` and ``explain``
tables and four figures, PNGs embedded as base64 (no network, no files beside it).

Figures:
- time per block: the cost stage's compute of the plan's solution per block
  (``explain.block_compute``), and communication per mesh axis: the plan's collective
  table per module (``predicted.module_collectives``) priced as ``show`` prices it;
- memory per device: the plan's split (``show.memory_split``) against the budget, beside
  the peaks of the alternatives of its largest block;
- communication volume per axis, by collective kind (``predicted.collectives``);
- with ``fidelity``, a ``benchmarks/fidelity.py`` result: predicted against measured.
"""

from __future__ import annotations

import base64
import html
import json
import math

from autoplan.errors import OptionError
from autoplan.explain.explain import Explanation, block_of, explain_sections
from autoplan.explain.figures import block_time_png, comm_volume_png, fidelity_png, memory_png
from autoplan.explain.patterns import natural_key
from autoplan.explain.render import to_html
from autoplan.explain.show import GIB, Summary, show_sections

_STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; max-width: 1400px; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f0f0f0; }
h3 { margin-bottom: 0.2em; }
ul { font-size: 13px; color: #444; }
.figures img { display: block; margin: 1em 0; border: 1px solid #ddd; }
"""


def block_comm_ms(plan, summary: Summary, profile) -> dict[str, dict[str, float]]:
    """Block -> mesh axis -> ms of the plan's collectives there, priced with ``profile``."""
    from autoplan.cost.comm import bus_factor, link_cost

    mesh = tuple(plan.mesh_shape)
    out: dict[str, dict[str, float]] = {}
    for module, per_axis in plan.predicted.module_collectives.items():
        block = block_of("" if module == "<root>" else module, plan)
        for axis, kinds in per_axis.items():
            a = plan.axis_names.index(axis)
            for kind, entry in kinds.items():
                cost = link_cost(profile, kind, mesh, a)
                seconds = entry["count"] * cost.latency_s + bus_factor(kind, mesh[a]) * entry["bytes"] / cost.bus_bandwidth_bytes_per_s
                into = out.setdefault(block, {})
                into[axis] = into.get(axis, 0.0) + seconds * 1e3
    return out


def figures_for(plan, summary: Summary, explanation: Explanation, profile, fidelity: dict | None) -> list[tuple[str, bytes]]:
    comm = block_comm_ms(plan, summary, profile)
    compute = {b: s * 1e3 for b, s in explanation.block_compute_s.items()}
    blocks = sorted(set(compute) | set(comm), key=natural_key)
    blocks = [b for b in blocks if compute.get(b, 0.0) + sum(comm.get(b, {}).values()) > 0]
    axes = list(plan.axis_names)
    figures = [(
        "predicted time per block: compute and communication per mesh axis",
        block_time_png(blocks, [compute.get(b, 0.0) for b in blocks],
                       {a: [comm.get(b, {}).get(a, 0.0) for b in blocks] for a in axes}),
    )]
    m = summary.memory
    if m.parameters is not None:
        assert m.gradients is not None and m.optimizer is not None  # memory_split gives the three together
        parts = {"parameters": m.parameters, "gradients": m.gradients, "optimizer state": m.optimizer}
    else:
        parts = {"model state": m.model_state}
    parts["activations"] = m.activations
    if m.temporaries is not None:
        parts["temporaries and buffers"] = m.temporaries
    largest = max({a.unit for a in explanation.alternatives},
                  key=lambda u: sum(1 for a in explanation.alternatives if a.unit == u), default=None)
    others = {
        f"{a.unit}: {a.name}"[:48]: peak / GIB
        for a in explanation.alternatives
        if a.unit == largest and (peak := a.peak_memory_bytes) is not None and not a.name.startswith("the plan's own")
    }
    figures.append((
        "memory per device against the budget (grey: peaks of the alternatives of the largest block)",
        memory_png({k: v / GIB for k, v in parts.items()}, explanation.budget_bytes / GIB, others),
    ))
    volume = {
        axis: {kind: entry["bytes"] / 2**20 for kind, entry in kinds.items()}
        for axis, kinds in plan.predicted.collectives.items()
    }
    figures.append(("communication volume per mesh axis, by collective", comm_volume_png(volume or {a: {} for a in axes})))
    if fidelity is not None:
        figures.append(("predicted against measured step time (benchmarks/fidelity.py)", fidelity_png(fidelity)))
    return figures


def read_fidelity(path) -> dict[str, list[tuple[float, float, str]]]:
    """``benchmarks/fidelity.py``'s ``fidelity.json``: model -> [(predicted ms, measured ms, label)]."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as err:
        raise OptionError(f"cannot read the --fidelity file {path}: {err}",
            hint="pass benchmarks/results/fidelity.json from benchmarks/fidelity.py") from None
    plans = data.get("plans") if isinstance(data, dict) else None
    if not isinstance(plans, list):
        raise OptionError(f"--fidelity file {path}: expected an object with a \"plans\" list, got {type(data).__name__}",
                          hint="pass the fidelity.json benchmarks/fidelity.py writes")
    points: dict[str, list] = {}
    for entry in plans:
        predicted, measured = entry.get("predicted_s"), entry.get("measured_s")
        if isinstance(predicted, (int, float)) and isinstance(measured, (int, float)) and math.isfinite(measured) and measured > 0:
            points.setdefault(str(entry.get("model", "?")), []).append((predicted * 1e3, measured * 1e3, str(entry.get("label", ""))))
    if not points:
        raise OptionError(f"--fidelity file {path} has no measured plans", hint="run benchmarks/fidelity.py to measure some")
    return points


def render_report(title: str, plan, summary: Summary, explanation: Explanation, profile, fidelity=None) -> str:
    """The whole HTML page as text."""
    figures = figures_for(plan, summary, explanation, profile, fidelity)
    images = "\n".join(
        f"<h3>{html.escape(caption)}</h3>\n"
        f'<img alt="{html.escape(caption)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        for caption, png in figures
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_STYLE}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<section class="figures" id="figures">
<h2>Figures</h2>
{images}
</section>
<section id="show"><h2>The plan (autoplan show)</h2>
{to_html(show_sections(summary))}
</section>
<section id="explain"><h2>Why (autoplan explain)</h2>
{to_html(explain_sections(explanation))}
</section>
</body></html>
"""
