"""On a CPU mesh DTensor all-gathers where it would all_to_all; an expert-parallel module's
token exchange calls all_to_all itself, and ``verify`` holds it to that (``step_check.as_on_cpu``)."""

from autoplan.verify.step_check import as_on_cpu


def test_an_experts_exchange_stays_an_all_to_all_and_dtensor_moves_become_all_gathers():
    table = {
        "layers.0.experts": {"ep": {"all_to_all": {"count": 5, "bytes": 100}}},
        "layers.0.attn": {"ep": {"all_to_all": {"count": 1, "bytes": 10}}},
    }
    got = as_on_cpu(table, {"dp": 2, "ep": 4}, {"layers.0.experts": "ep"})
    assert got == {
        "layers.0.experts": {"ep": {"all_to_all": {"count": 5, "bytes": 100}}},
        "layers.0.attn": {"ep": {"all_gather": {"count": 1, "bytes": 40}}},
    }
    assert as_on_cpu(table, {"dp": 2, "ep": 4})["layers.0.experts"] == {"ep": {"all_gather": {"count": 5, "bytes": 400}}}
