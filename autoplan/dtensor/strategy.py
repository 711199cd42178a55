"""``Strategy``: one way to run an op on the mesh, as placements of its inputs and outputs.

Its own module because both the strategy registry (``strategies.py``) and the rules that
add strategies to it (``loss_parallel.py``) build them; the registry imports those rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.placements import Spec


@dataclass(frozen=True, slots=True)
class Strategy:
    """One way to run an op on the mesh."""

    outputs: tuple[Spec | None, ...]
    """Placement of each tensor output (None where the op returns no tensor there)."""
    inputs: tuple[Spec, ...]
    """Required placement of each tensor input, in flattened argument order."""

    def output(self, index: int) -> Spec | None:
        """Placement of output ``index`` (as ``getitem`` reads it); a strategy that lists
        fewer outputs than the op has gives its first for the rest."""
        return self.outputs[index] if index < len(self.outputs) else self.outputs[0]
