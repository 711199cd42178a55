"""``diff``: what differs between two plans of one model, per module in words, and their
predicted totals side by side.

Two plans of the same model made with another profile, budget or mesh: each module is
compared by its whole layout phrase with the axes named ("column-parallel (dp) + FSDP
(tp)") and its placements, so plans on meshes of different shapes compare too. Modules
compared per layer first, then folded: "model.layers.0-31" differs alike in every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.explain.patterns import fold, natural_key, unfolded_rows
from autoplan.explain.show import Summary, _short, ms, nbytes, summarize
from autoplan.tree_paths import readable_path


@dataclass(frozen=True)
class ModuleChange:
    name: str
    a: str
    """Plan A's layout: phrase and placements ("-" where A has no such module)."""
    b: str
    count: int = 1


@dataclass(frozen=True)
class PlanDiff:
    a: Summary
    b: Summary
    changes: tuple[ModuleChange, ...]
    same: int
    """Modules laid out alike in both."""
    batch: tuple[tuple[str, str, str], ...]
    """(input, A's placements, B's) where they differ."""
    recompute: tuple[tuple[str, str, str], ...] = ()
    """(module, A's recompute, B's: "full", "selective" or "-") where they differ, folded."""

    def to_dict(self) -> dict:
        return {
            "changes": [vars(c) for c in self.changes],
            "same_modules": self.same,
            "batch": [list(b) for b in self.batch],
            "recompute": [list(r) for r in self.recompute],
            "totals": [list(row) for row in totals(self.a, self.b)],
        }


def diff_plans(plan_a, plan_b, profile=None) -> PlanDiff:
    a, b = summarize(plan_a, profile), summarize(plan_b, profile)
    rows_a = {r.name: r for r in unfolded_rows(plan_a)}
    rows_b = {r.name: r for r in unfolded_rows(plan_b)}
    changes, same = [], 0
    for name in sorted(set(rows_a) | set(rows_b), key=natural_key):
        ra, rb = rows_a.get(name), rows_b.get(name)
        text_a = _describe(ra, plan_a.axis_names)
        text_b = _describe(rb, plan_b.axis_names)
        if text_a == text_b:
            same += 1
        else:
            changes.append(ModuleChange(name, text_a, text_b))
    batch = tuple(
        (key, _spec(plan_a, key), _spec(plan_b, key))
        for key in sorted(set(plan_a.inputs) | set(plan_b.inputs))
        if _spec(plan_a, key) != _spec(plan_b, key)
    )
    folded = fold(changes, key=lambda c: (c.a, c.b))
    recompute = [
        ModuleChange(fqn, plan_a.recompute.get(fqn, "-"), plan_b.recompute.get(fqn, "-"))
        for fqn in sorted(set(plan_a.recompute) | set(plan_b.recompute), key=natural_key)
        if plan_a.recompute.get(fqn) != plan_b.recompute.get(fqn)
    ]
    recompute_rows = tuple((c.name, c.a, c.b) for c in fold(recompute, key=lambda c: (c.a, c.b)))
    return PlanDiff(a, b, tuple(folded), same, batch, recompute_rows)


def _describe(row, axis_names) -> str:
    if row is None:
        return "-"
    words = [f"{_short(w)} ({n})" for w, n in zip(row.words, axis_names)]
    used = f" computed with {row.used}" if row.used else ""
    return f"{'; '.join(words)}: {row.stored}{used}"


def _spec(plan, key: str) -> str:
    from autoplan.placements import format_spec

    batch = plan.inputs.get(key)
    return format_spec(batch.placements) if batch else "-"


def totals(a: Summary, b: Summary) -> list[tuple[str, str, str, str]]:
    """(what, A, B, B against A) rows of the predicted totals."""

    def change(x, y):
        if x is None or y is None:
            return ""
        if x == 0:
            return "same" if y == 0 else "new"
        return f"{(y - x) / x:+.1%}"

    def comm_by_axis(s: Summary) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in s.comm:
            out[r.axis] = out.get(r.axis, 0.0) + (r.seconds or 0.0)
        return out

    rows = [
        ("mesh", "x".join(map(str, a.mesh)) + f" ({', '.join(a.axis_names)})",
         "x".join(map(str, b.mesh)) + f" ({', '.join(b.axis_names)})", ""),
        ("profile", a.profile, b.profile, ""),
        ("step time, ms", ms(a.step_time_s), ms(b.step_time_s), change(a.step_time_s, b.step_time_s)),
        ("compute, ms", ms(a.compute_s), ms(b.compute_s), change(a.compute_s, b.compute_s)),
        ("communication, ms", ms(a.comm_s), ms(b.comm_s), change(a.comm_s, b.comm_s)),
    ]
    ca, cb = comm_by_axis(a), comm_by_axis(b)
    for axis in sorted(set(ca) | set(cb)):
        rows.append((f"  collectives on {axis}, ms", ms(ca.get(axis)), ms(cb.get(axis)), change(ca.get(axis), cb.get(axis))))
    ma, mb = a.memory, b.memory
    rows += [
        ("peak memory per device", nbytes(ma.peak), nbytes(mb.peak), change(ma.peak, mb.peak)),
        ("  model state", nbytes(ma.model_state), nbytes(mb.model_state), change(ma.model_state, mb.model_state)),
        ("  activations", nbytes(ma.activations), nbytes(mb.activations), change(ma.activations, mb.activations)),
        ("MFU", _pct(a.mfu), _pct(b.mfu), ""),
        ("solver", a.solver, b.solver, ""),
    ]
    return rows


def _pct(value):
    return "-" if value is None else f"{value:.1%}"


def diff_sections(d: PlanDiff, name_a: str = "A", name_b: str = "B") -> list:
    from autoplan.explain.render import Section

    sections = [Section(f"A = {name_a}\nB = {name_b}" if name_a != "A" else "plans A and B")]
    if d.changes:
        sections.append(Section(
            f"modules laid out differently ({sum(c.count for c in d.changes)}; {d.same} alike; repeated blocks folded)",
            ("module", "A", "B"),
            tuple((c.name, c.a, c.b) for c in d.changes),
        ))
    else:
        sections.append(Section(f"every module laid out alike ({d.same})"))
    if d.batch:
        sections.append(Section("batch laid out differently", ("input", "A", "B"), tuple((readable_path(k), a, b) for k, a, b in d.batch)))
    if d.recompute:
        sections.append(Section("recomputed differently (activation checkpointing)", ("module", "A", "B"), d.recompute))
    sections.append(Section("predicted totals", ("", "A", "B", "B against A"), tuple(totals(d.a, d.b)), right=(1, 2, 3)))
    return sections
