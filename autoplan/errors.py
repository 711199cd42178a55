"""User-facing errors. Each names the problem and carries a hint of the fix.

Errors about a bad value are also ``ValueError`` and errors about a wrong type also
``TypeError``, so that code written against Python's conventions catches them too.
"""

from __future__ import annotations


class AutoplanError(Exception):
    """Base class: ``str(err)`` is one line with the problem and, after it, the fix."""

    def __init__(self, problem: str, hint: str | None = None):
        self.problem = problem
        self.hint = hint
        super().__init__(problem if not hint else f"{problem}; fix: {hint}")


class ModelFileError(AutoplanError):
    """The model file is missing or does not define what autoplan needs."""


class MeshError(AutoplanError, ValueError):
    """The mesh shape or axis names are malformed or inconsistent."""


class ProfileError(AutoplanError, ValueError):
    """A cluster profile is missing, malformed or incomplete."""


class InfeasibleError(AutoplanError):
    """No plan fits the per-device memory budget."""

    smallest_bytes: float | None = None
    """The least per-device memory any plan needs, where the solver worked it out."""


class PlanError(AutoplanError, ValueError):
    """A plan file is malformed, or does not match the model or mesh it is applied to."""


class OptionError(AutoplanError, ValueError):
    """An option (memory budget, time limit, output path) is out of range or conflicts with another."""


class ArgumentTypeError(AutoplanError, TypeError):
    """An API argument has the wrong type (a path where a model is expected, a float mesh size)."""


class TraceError(AutoplanError):
    """The model could not be traced."""


class LossError(AutoplanError):
    """The training loss cannot be told from the model's output, or ``compute_loss`` did not
    return one scalar tensor."""


class NotApplicableError(AutoplanError):
    """A baseline layout does not apply to this model or mesh."""


class StepError(AutoplanError):
    """A planned model's training step failed (an op that cannot run as the plan lays it out)."""
