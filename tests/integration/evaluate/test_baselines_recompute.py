"""Baselines scored with their recipe's checkpointing, at a batch that needs it.

A stack of alike MLP blocks with a batch whose activations outweigh the weights, on a 1-D
mesh of 2 (dp): under a budget between what FSDP holds with every block checkpointed and
what it holds without, the baseline fits only with its recipe's recompute ("full" for
FSDP, ``RECIPE_RECOMPUTE``), which then names every block; ``benchmarks/baselines.py``
prints that comparison (autoplan's plan solved with recompute, as ``suggest`` solves it)
instead of stopping with "no plan fits".
"""

import sys
import textwrap

import pytest
from conftest import ROOT

from autoplan.evaluate.baselines import RECIPE_RECOMPUTE, baseline_for_problem
from autoplan.model_file import load_model_file
from autoplan.pipeline.problem import prepare_problem

pytestmark = pytest.mark.slow

MODEL = textwrap.dedent('''
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.up = nn.Linear(d, 4 * d)
            self.down = nn.Linear(4 * d, d)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))


    class Stack(nn.Module):
        def __init__(self, d=64, layers=4):
            super().__init__()
            self.layers = nn.ModuleList(Block(d) for _ in range(layers))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x.pow(2).mean()


    def build_model():
        return Stack()


    def example_inputs():
        return (torch.randn(4096, 64),)
''')


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "stack.py"
    path.write_text(MODEL)
    return path


def _fsdp(model_file, memory_gb=None, recompute=None):
    loaded = load_model_file(str(model_file))
    problem = prepare_problem(loaded.model, loaded.example_inputs, (2,), ("dp",), "cpu-gloo", memory_gb)
    return baseline_for_problem("fsdp", problem, recompute=recompute)


def test_a_baseline_fits_a_training_batch_only_with_its_recipes_recompute(model_file, capsys):
    assert RECIPE_RECOMPUTE["fsdp"] == "full" and RECIPE_RECOMPUTE["torchtitan"] == "full"
    kept, checkpointed = _fsdp(model_file).plan, _fsdp(model_file, recompute="full").plan
    held, freed = kept.predicted.peak_memory_bytes, checkpointed.predicted.peak_memory_bytes
    assert freed < 0.8 * held
    budget_gb = (held + freed) / 2 / 1e9
    without = _fsdp(model_file, budget_gb)
    assert not without.fits
    recipe = _fsdp(model_file, budget_gb, RECIPE_RECOMPUTE["fsdp"])
    assert recipe.fits
    assert recipe.plan.recompute == {f"layers.{i}": "full" for i in range(4)}

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import baselines as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert bench.main([str(model_file), "--mesh", "2", "--axis-names", "dp", "--profile", "cpu-gloo",
                       "--memory-gb", f"{budget_gb:.9f}"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.split()}
    assert " yes " in rows["autoplan"]
    assert " yes " in rows["fsdp"] and "full x4" in rows["fsdp"]
