"""Values a model reads back to Python from a sum over ranks (``tolist()``, ``item()``).

JetMoE routes its tokens with ``tolist()`` of the tokens per expert, and splits the routed
tokens by those sizes. Where the plan splits the tokens, the counts are a partial sum over
the ranks holding them: the apply engine reads the whole sum (one all_reduce), which the
prediction must count (``plan/runtime_choice.read_whole``), and on a fake process group the
sum must add up to the tokens it splits (``verify/symmetric_ranks.py``), or the planned
step fails where a real one runs.
"""

import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor, Shard

from autoplan.verify.symmetric_ranks import SymmetricSums

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def test_a_partial_sum_on_a_fake_group_reads_as_if_every_rank_held_this_ranks_values(fake_mesh_2x4):
    tp = fake_mesh_2x4["tp"]
    tokens = DTensor.from_local(torch.ones(2, 3), tp, [Shard(0)], run_check=False)  # 8 rows over 4 ranks
    per_column = tokens.sum(0)  # a partial sum on tp
    assert per_column.full_tensor().tolist() == [2.0, 2.0, 2.0]  # the fake group alone: one rank's rows
    with SymmetricSums():
        counts = per_column.full_tensor().tolist()
        averaged = tokens.mean(0).full_tensor().tolist()
    assert counts == [8.0, 8.0, 8.0]  # as many as the rows the global tensor has
    assert averaged == [1.0, 1.0, 1.0]  # an average over ranks is already right


@pytest.mark.slow  # plans JetMoE twice and steps it
def test_jetmoe_steps_with_its_expert_sizes_read_whole(fake_mesh_2x4, tmp_path):
    import hf_row

    model_file = tmp_path / "jetmoe.py"
    model_file.write_text(hf_row.hf_model_file_text("causal_lm", "jetmoe"))
    plan = hf_row._plan(model_file, torch.float32, "after the default plan", {})  # the forcing budget
    verification = hf_row._step(model_file, torch.float32, plan, fake_mesh_2x4)  # used to fail in the split
    routers = [row for row in verification.rows if row.module.endswith(".router")]
    assert any(row.kind == "all_reduce" and row.observed[0] for row in routers), "no count read whole"
    assert all(row.matches for row in routers), [row for row in routers if not row.matches]
