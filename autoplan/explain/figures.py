"""The report's figures, drawn with matplotlib's Agg canvas and returned as PNG bytes.

``Figure`` + ``FigureCanvasAgg`` draw without pyplot: no global backend is chosen and no
figure registry is touched, so a report made inside someone's notebook changes nothing
of theirs. Each function takes plain numbers (``report.py`` gathers them) and returns PNG.
"""

from __future__ import annotations

import io

COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]


def _figure(width: float = 8.0, height: float = 4.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def block_time_png(blocks: list[str], compute_ms: list[float], comm_ms: dict[str, list[float]]) -> bytes:
    """Horizontal stacked bars per block: compute, then communication per mesh axis."""
    figure = _figure(8.0, max(2.5, 0.45 * len(blocks) + 1.2))
    axes = figure.add_subplot()
    left = [0.0] * len(blocks)
    series = [("compute", compute_ms)] + [(f"communication on {axis}", values) for axis, values in comm_ms.items()]
    for i, (label, values) in enumerate(series):
        axes.barh(blocks, values, left=left, color=COLORS[i % len(COLORS)], label=label)
        left = [a + b for a, b in zip(left, values)]
    axes.invert_yaxis()
    axes.set_xlabel("ms per step")
    axes.set_title("predicted time per block")
    axes.legend(loc="lower right", fontsize=8)
    return _png(figure)


def memory_png(parts: dict[str, float], budget: float | None, others: dict[str, float] | None = None) -> bytes:
    """The plan's memory per device stacked (GiB), beside other layouts' peaks, and the budget."""
    figure = _figure(8.0, 3.6)
    axes = figure.add_subplot()
    bottom = 0.0
    for i, (label, value) in enumerate(parts.items()):
        axes.bar(["the plan"], [value], bottom=bottom, color=COLORS[i % len(COLORS)], label=label)
        bottom += value
    for name, peak in (others or {}).items():
        axes.bar([name], [peak], color="#bbbbbb")
    tallest = max([bottom, *(others or {}).values()])
    if budget and budget <= 3 * tallest:
        axes.axhline(budget, color="#c44e52", linestyle="--", label=f"budget {budget:.3g} GiB")
    elif budget:  # a line far above the bars would flatten them to nothing
        axes.set_ylim(0, tallest * 1.25)
        axes.set_title(f"memory per device (budget {budget:.3g} GiB, off the scale)")
    axes.set_ylabel("GiB per device")
    if not axes.get_title():
        axes.set_title("memory per device")
    axes.tick_params(axis="x", labelsize=7, labelrotation=20)
    axes.legend(fontsize=8)
    return _png(figure)


def comm_volume_png(volume: dict[str, dict[str, float]]) -> bytes:
    """Bytes per mesh axis (MiB), stacked by collective kind."""
    figure = _figure(6.0, 3.4)
    axes = figure.add_subplot()
    axis_names = list(volume)
    kinds = sorted({kind for per_kind in volume.values() for kind in per_kind})
    bottom = [0.0] * len(axis_names)
    for i, kind in enumerate(kinds):
        values = [volume[a].get(kind, 0.0) for a in axis_names]
        axes.bar(axis_names, values, bottom=bottom, color=COLORS[i % len(COLORS)], label=kind)
        bottom = [a + b for a, b in zip(bottom, values)]
    axes.set_ylabel("MiB per step, per device")
    axes.set_xlabel("mesh axis")
    axes.set_title("communication volume per axis")
    if kinds:
        axes.legend(fontsize=8)
    else:
        axes.text(0.5, 0.5, "no communication", ha="center", va="center", transform=axes.transAxes)
    return _png(figure)


def fidelity_png(points: dict[str, list[tuple[float, float, str]]]) -> bytes:
    """Predicted against measured step time (ms, log-log), one colour per model, y = x dashed."""
    figure = _figure(6.0, 5.0)
    axes = figure.add_subplot()
    values = []
    for i, (model, rows) in enumerate(sorted(points.items())):
        axes.scatter([r[0] for r in rows], [r[1] for r in rows], color=COLORS[i % len(COLORS)], label=model)
        values += [v for r in rows for v in r[:2]]
    if values:
        low, high = min(values) * 0.8, max(values) * 1.25
        axes.plot([low, high], [low, high], "k--", linewidth=0.8, label="predicted = measured")
        axes.set_xscale("log")
        axes.set_yscale("log")
    axes.set_xlabel("predicted ms")
    axes.set_ylabel("measured ms")
    axes.set_title("prediction against measurement")
    axes.legend(fontsize=8)
    return _png(figure)
