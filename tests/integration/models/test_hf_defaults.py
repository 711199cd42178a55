"""HuggingFace models with their configs as shipped (only sizes changed) plan, train and match.

Their defaults used to break the trace: the key/value cache on, ``return_dict`` on, the
default ``sdpa`` attention and Mixtral's ``grouped_mm`` experts in float32 (and GraniteMoE,
whose causal LM passes ``use_cache`` on to its inner model only through ``**kwargs``). Each model
below (``tests/models/hf_defaults.py``) is planned on 2x4 under a budget that forces
sharding, runs one training step on a fake process group with exactly the predicted
collectives, and matches one device on 8 gloo processes.
"""

import sys

import pytest
import torch
from conftest import ROOT
from zoo import forced_plan, verify_on_fake_world

from autoplan.model_file import import_model_file
from autoplan.trace.training_call import training_kwargs
from autoplan.verify.numerics import NumericsJob, build_seeded, check_numerics, seeded_batch

MODELS = ("llama", "qwen2", "mixtral", "gpt_neox", "t5", "bart", "granitemoe")
MODEL_FILE = ROOT / "tests" / "models" / "hf_defaults.py"
MESH, AXIS_NAMES = (2, 4), ("dp", "tp")
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def plans():
    return {name: forced_plan(f"{MODEL_FILE}:{name}", MESH, AXIS_NAMES) for name in MODELS}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.slow  # plans seven models twice
def test_plan_shards_and_a_step_runs_the_predicted_collectives(plans, name):
    plan = plans[name]
    assert any(p.startswith("S(") for spec in plan.parameters.values() for p in spec), f"{name}: nothing sharded"
    model_file = import_model_file(MODEL_FILE)
    model, batch = build_seeded(model_file, name, 0), seeded_batch(model_file, 1)
    result = verify_on_fake_world(model, batch, plan)
    assert result.passed, "\n" + result.summary()


@pytest.fixture(scope="module")
def numerics(plans):
    jobs = [NumericsJob(str(MODEL_FILE), name, plans[name].to_json()) for name in MODELS]
    return dict(zip(MODELS, check_numerics(jobs, world=8)))


@pytest.mark.gloo
@pytest.mark.parametrize("name", MODELS)
def test_matches_one_device_on_gloo(numerics, name):
    result = numerics[name]
    assert result.loss <= TOLERANCE, result.loss
    worst = max(result.gradients.items(), key=lambda item: item[1])
    assert worst[1] <= TOLERANCE, worst


def test_the_cache_stays_on_outside_training():
    model = import_model_file(MODEL_FILE).llama()
    assert training_kwargs(model.train(), {}) == {"use_cache": False}
    assert training_kwargs(model.train(), {"use_cache": True}) == {"use_cache": True}  # the caller's word wins
    assert training_kwargs(model.eval(), {}) == {}
    assert training_kwargs(torch.nn.Linear(2, 2).train(), {}) == {}  # no such argument: nothing added
    # A forward that passes **kwargs on, of a model whose config has the flag: it reaches the inner model.
    assert training_kwargs(import_model_file(MODEL_FILE).granitemoe().train(), {}) == {"use_cache": False}


def test_the_cache_goes_off_where_a_nested_config_has_the_flag():
    """MOSS-Transcribe's forward passes ``**kwargs`` on to its language model, whose flag is
    in ``config.text_config``: its cache's empty start failed DTensor's ``cat`` under a plan
    that splits the keys."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from hf_tiny import build_tiny_model

    model = build_tiny_model("causal_lm", "moss_transcribe_diarize")
    assert getattr(model.config, "use_cache", None) is None and model.config.text_config.use_cache
    assert training_kwargs(model.train(), {}) == {"use_cache": False}
