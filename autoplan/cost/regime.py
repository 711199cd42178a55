"""The regime a step runs in: eager DTensor, or under ``torch.compile`` per block or whole.

Eagerly, every op of a plan pays DTensor's fixed host costs (dispatch, sharding
propagation, wrapping, autograd recording; ``profile.DispatchCost``), forward and
backward: ~20 + 45 us an op on an H100 host, most of a small model's step. Compiled,
dynamo and AOTAutograd run all of that once, at compile time, and inductor fuses runs of
elementwise ops into single kernels; what remains per step is each kernel's call, each
compiled graph's call, and the fused ops' reduced traffic (``profile.CompiledCost``):

    none    every op eager (the apply engine's plan as ``docs/training.md`` runs it)
    block   each layer of the repeated stack compiled on its own (torchtitan's per-block
            compile; ``verify/compiled.py``): its ops priced compiled, one graph call per
            layer (graph breaks at the layer boundaries); the rest (embedding, head,
            loss) eager. A model without a repeated stack is compiled whole.
    whole   the model compiled as one graph: every op priced compiled, one graph call

The optimizer step is not compiled in any regime (torchtitan steps it eagerly), and
collectives cost what they cost. The solver sees the regime through the costs of every
op (``estimate.py``): with DTensor's fixed costs gone, a layout that splits work finely
over many small ops (tensor parallelism) pays less for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoplan.errors import OptionError

if TYPE_CHECKING:  # the command line imports REGIMES without loading torch
    from autoplan.trace.repeats import RepeatedBlocks

REGIMES = ("none", "block", "whole")
DEFAULT_REGIME = "none"
"""The regime ``suggest`` prices for unless told: the training recipe of docs/training.md
(``apply_plan``, then an eager loop) runs eagerly."""

_WORDS = {
    "none": "eager DTensor (no torch.compile)",
    "block": "torch.compile per block",
    "whole": "torch.compile of the whole model",
}


def check_regime(name) -> str:
    """``name`` if it is a regime, else an OptionError with the fix."""
    if name not in REGIMES:
        raise OptionError(f"expected compile regime one of {list(REGIMES)}, got {name!r}",
                          "pass compile='none' (eager), 'block' (each repeated block compiled) or 'whole'")
    return name


def regime_words(name: str) -> str:
    """The regime in words, as ``show`` prints it."""
    return _WORDS.get(name, name)


@dataclass(frozen=True)
class Regime:
    """Which traced ops run inside a compiled graph, and how many graph calls a step makes."""

    name: str
    """One of ``REGIMES``: what the plan records (the effective regime)."""
    blocks: RepeatedBlocks | None = None
    """For "block": the repeated stack whose layers are compiled one by one."""

    @property
    def compiles(self) -> bool:
        return self.name != "none"

    def compiled(self, module_fqn: str | None) -> bool:
        """Whether an op of the module ``module_fqn`` ("" or None: the model's own forward)
        runs inside a compiled graph."""
        if self.name == "whole":
            return True
        if self.name == "block" and self.blocks is not None:
            return self.blocks.layer_of(module_fqn or "") is not None
        return False

    def graph_of(self, module_fqn: str | None) -> int | None:
        """The compiled graph an op of ``module_fqn`` belongs to (its layer's index; 0 for
        the one graph of "whole"), None if it runs eagerly: each graph pays one call."""
        if self.name == "whole":
            return 0
        if self.name == "block" and self.blocks is not None:
            return self.blocks.layer_of(module_fqn or "")
        return None


EAGER = Regime("none")


def regime_for(name: str, blocks: RepeatedBlocks | None) -> tuple[Regime, str | None]:
    """The regime to price for, and a warning where it differs from the one asked: "block"
    on a model without a repeated stack compiles it whole (as ``compile_table`` runs it)."""
    check_regime(name)
    if name == "block" and blocks is None:
        return Regime("whole"), ("--compile block: the model has no repeated stack of blocks "
                                 "(an nn.ModuleList of 3 or more alike layers); priced compiled whole")
    return Regime(name, blocks if name == "block" else None), None


def regime_mismatch(planned: str, run: str) -> str | None:
    """The warning ``verify`` prints where a step runs in another regime than its plan was
    priced for (the collectives are the same; the predicted step time is not this step's)."""
    if planned == run:
        return None
    again = "" if run == "none" else f" --compile {run}"
    return (f"the plan's step is priced for {regime_words(planned)}, this step runs {regime_words(run)}: its predicted "
            f"step time is not this step's (plan for it with `autoplan suggest{again}`)")
