"""``solve/linear_model.py`` builds the model MathOpt's own expressions build: the same
proto, term for term, for rows with repeated variables, zero sums, constants on either
side and infinite bounds (what ``solve/ilp.py`` writes)."""

import math

from hypothesis import given
from hypothesis import strategies as st
from ortools.math_opt.python import mathopt

from autoplan.solve.linear_model import LinearModel

coefficients = st.one_of(st.integers(-5, 5).map(float), st.floats(-1e3, 1e3, allow_nan=False, width=32).map(float))
rows = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(0, 5), coefficients), max_size=8),  # may repeat a variable, or sum to zero
        st.sampled_from(["<=", "==", "<= var"]),
        st.floats(-10, 10, allow_nan=False),  # the bound
        st.floats(-3, 3, allow_nan=False),  # a constant on the left
    ),
    min_size=1, max_size=6,
)


def _mathopt_model(variables: int, model_rows, objective, offset) -> mathopt.Model:
    model = mathopt.Model(name="m")
    xs = [model.add_binary_variable(name=f"x{i}") if i % 2 else model.add_variable(lb=0.0, ub=1.0) for i in range(variables)]
    peak = model.add_variable(lb=0.0, name="peak")
    for terms, kind, bound, constant in model_rows:
        if not terms:
            continue  # MathOpt refuses a row of no variables (a bool); ilp.py never writes one
        expr = mathopt.fast_sum(xs[i] * c for i, c in terms) + constant
        row = expr <= bound if kind == "<=" else expr == bound if kind == "==" else expr <= peak
        model.add_linear_constraint(row)
    model.minimize(mathopt.fast_sum(xs[i] * c for i, c in objective) + offset)
    return model


def _linear_model(variables: int, model_rows, objective, offset) -> mathopt.Model:
    model = LinearModel(name="m")
    xs = [model.binary(f"x{i}") if i % 2 else model.variable() for i in range(variables)]
    peak = model.variable(0.0, math.inf, name="peak")
    for terms, kind, bound, constant in model_rows:
        if not terms:
            continue
        row = [(xs[i], c) for i, c in terms]
        if kind == "<=":
            model.row(row, upper=bound, constant=constant)
        elif kind == "==":
            model.row(row, bound, bound, constant=constant)
        else:
            model.row([*row, (peak, -1.0)], upper=0.0, constant=constant)
    model.minimize([(xs[i], c) for i, c in objective], offset)
    return model.build()


@given(model_rows=rows, objective=st.lists(st.tuples(st.integers(0, 5), coefficients), max_size=8),
       offset=st.floats(-5, 5, allow_nan=False))
def test_the_bulk_model_is_the_expressions_model(model_rows, objective, offset):
    expected = _mathopt_model(6, model_rows, objective, offset).export_model()
    assert _linear_model(6, model_rows, objective, offset).export_model() == expected


def test_a_solve_reads_values_by_variable_id():
    model = LinearModel()
    x, y = model.binary("x"), model.binary("y")
    model.row([(x, 1.0), (y, 1.0)], lower=1.0)
    model.minimize([(x, 3.0), (y, 2.0)], 1.0)
    result = mathopt.solve(model.build(), mathopt.SolverType.HIGHS)
    assert {v.id: round(value) for v, value in result.variable_values().items()} == {x: 0, y: 1}
    assert result.objective_value() == 3.0
