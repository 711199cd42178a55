"""A MathOpt model written straight into its ModelProto, for models of many small rows.

MathOpt's Python expressions (``var * c``, ``fast_sum``, ``<=``) make an object per term
and normalise each constraint in Python; on the ILPs autoplan solves that was most of the
solve stage (an 8B model on 8x8: about 80 % of it, the solver's search the rest). Here a
variable is its id, a row is a list of ``(id, coefficient)`` terms, and the proto's
repeated fields are filled in bulk, then handed to MathOpt whole
(``Model.from_model_proto``). The model is the one the expressions would build: duplicate
terms summed in the order given, zero coefficients dropped, a row's constant moved into its
bounds (``tests/unit/solve/test_linear_model.py`` compares the two protos).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ortools.math_opt import model_pb2
from ortools.math_opt.python import mathopt

Term = tuple[int, float]
"""A variable's id and its coefficient."""


class LinearModel:
    """Variables, rows and a minimised objective, collected as plain numbers."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._lower: list[float] = []
        self._upper: list[float] = []
        self._integer: list[bool] = []
        self._names: list[str] = []
        self._row_lower: list[float] = []
        self._row_upper: list[float] = []
        self._matrix_rows: list[int] = []
        self._matrix_columns: list[int] = []
        self._matrix_values: list[float] = []
        self._objective: list[Term] = []
        self._offset = 0.0

    @property
    def variable_count(self) -> int:
        return len(self._lower)

    @property
    def row_count(self) -> int:
        return len(self._row_lower)

    def variable(self, lower: float = 0.0, upper: float = 1.0, integer: bool = False, name: str = "") -> int:
        """A new variable's id (continuous in [0, 1] unless told otherwise)."""
        self._lower.append(float(lower))
        self._upper.append(float(upper))
        self._integer.append(integer)
        self._names.append(name)
        return len(self._lower) - 1

    def binary(self, name: str = "") -> int:
        return self.variable(0.0, 1.0, True, name)

    def row(self, terms: Iterable[Term], lower: float = -math.inf, upper: float = math.inf, constant: float = 0.0) -> int:
        """``lower <= sum(terms) + constant <= upper``; returns the row's id."""
        row = len(self._row_lower)
        for column, value in _merged(terms):
            self._matrix_rows.append(row)
            self._matrix_columns.append(column)
            self._matrix_values.append(value)
        self._row_lower.append(lower - constant)
        self._row_upper.append(upper - constant)
        return row

    def equal(self, terms: Iterable[Term], value: float) -> int:
        return self.row(terms, value, value)

    def minimize(self, terms: Iterable[Term], offset: float = 0.0) -> None:
        self._objective = list(terms)
        self._offset = float(offset)

    def proto(self) -> model_pb2.ModelProto:
        proto = model_pb2.ModelProto(name=self.name)
        count = len(self._lower)
        variables = proto.variables
        variables.ids.extend(range(count))
        variables.lower_bounds.extend(self._lower)
        variables.upper_bounds.extend(self._upper)
        variables.integers.extend(self._integer)
        variables.names.extend(self._names)
        objective = proto.objective
        objective.maximize = False
        objective.offset = self._offset
        merged = _merged(self._objective)
        objective.linear_coefficients.ids.extend(i for i, _ in merged)
        objective.linear_coefficients.values.extend(v for _, v in merged)
        rows = proto.linear_constraints
        rows.ids.extend(range(len(self._row_lower)))
        rows.lower_bounds.extend(self._row_lower)
        rows.upper_bounds.extend(self._row_upper)
        rows.names.extend([""] * len(self._row_lower))
        matrix = proto.linear_constraint_matrix
        matrix.row_ids.extend(self._matrix_rows)  # row by row, columns sorted within each: MathOpt's order
        matrix.column_ids.extend(self._matrix_columns)
        matrix.coefficients.extend(self._matrix_values)
        return proto

    def build(self) -> mathopt.Model:
        """The MathOpt model (its variables are ``model.get_variable(id)``)."""
        return mathopt.Model.from_model_proto(self.proto())


def _merged(terms: Iterable[Term]) -> list[Term]:
    """Terms by variable id, each variable's coefficients summed in the order given (as
    MathOpt's expressions sum them), zeros left out (MathOpt stores none)."""
    sums: dict[int, float] = {}
    for column, value in terms:
        sums[column] = sums.get(column, 0.0) + value * 1.0
    return [(column, value) for column, value in sorted(sums.items()) if value != 0.0]
