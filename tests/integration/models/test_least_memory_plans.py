"""Plans squeezed to the least memory any plan needs run exactly their predicted collectives.

Such a plan shards nearly every weight and activation on both mesh axes, so DTensor meets
layouts it must reconcile op by op: a residual add of a value split on dim 2 with one
split on dim 0 (DTensor moves whichever input comes first at equal cost), a gradient a
slice further on left split, flowing back through views and adds. The prediction
follows what DTensor runs (``plan/runtime_choice.py``); this checks it on models written
as users write them (``tests/models/hf_defaults.py``), in float32 on a fake process
group of 8.
"""

import pytest
from conftest import ROOT
from zoo import verify_on_fake_world

import autoplan
from autoplan.errors import InfeasibleError
from autoplan.model_file import import_model_file, load_model_file
from autoplan.verify.numerics import build_seeded, seeded_batch

MODELS = ("qwen2", "gpt_neox", "phi")
MODEL_FILE = ROOT / "tests" / "models" / "hf_defaults.py"
MESH, AXIS_NAMES = (2, 4), ("dp", "tp")
SLACK = 1 / 64
"""Above the leanest plan's need, a sixty-fourth of the replicated model state (parameters,
gradients, two AdamW moments). With the loss computed on logits split by class
(``dtensor/loss_parallel.py``), a sixteenth left room for Phi's layers to stay whole on dp."""


def _tight_plan(name: str):
    loaded = load_model_file(f"{MODEL_FILE}:{name}")
    with pytest.raises(InfeasibleError) as refused:  # a budget no plan meets says what the leanest needs
        autoplan.suggest(loaded.model, loaded.example_inputs, mesh=MESH, axis_names=AXIS_NAMES, memory_gb=1e-9, cache=False)
    state = 4 * sum(p.numel() * p.element_size() for p in loaded.model.parameters())
    budget = (refused.value.smallest_bytes + SLACK * state) / 2**30
    return autoplan.suggest(loaded.model, loaded.example_inputs, mesh=MESH, axis_names=AXIS_NAMES, memory_gib=budget, cache=False)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.slow  # plans each model twice
def test_the_leanest_plans_run_their_predicted_collectives(name):
    plan = _tight_plan(name)
    model_file = import_model_file(MODEL_FILE)
    model, batch = build_seeded(model_file, name, 0), seeded_batch(model_file, 1)
    sizes = {fqn: p.numel() for fqn, p in model.named_parameters()}
    split = sum(n for fqn, n in sizes.items() if all(p.startswith("S(") for p in plan.parameters[fqn]))
    assert split >= sum(sizes.values()) / 2, f"{name}: most weights not split on both axes"
    result = verify_on_fake_world(model, batch, plan)
    assert result.passed, "\n" + result.summary()
