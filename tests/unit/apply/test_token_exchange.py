"""``apply/token_exchange.py`` on a fake process group: with the router's load even, what each
rank sends and receives, and the bytes its all_to_alls move (the even-load price)."""

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from autoplan.apply.token_exchange import combine, dispatch, even_counts
from autoplan.plan.expert_parallel import even_load_all_to_all_bytes
from autoplan.verify.observe import CollectiveCounter


def test_even_counts_spread_the_rows_as_whole_rows_go():
    assert even_counts(32, 8) == [4] * 8
    assert even_counts(10, 4) == [3, 3, 2, 2]


def test_a_dry_run_exchange_moves_the_even_load(fake_mesh_2x4):
    experts, tokens, top_k, hidden = 8, 16, 2, 64
    group = fake_mesh_2x4.get_group(1)  # the 4 ranks of the second axis
    with FakeTensorMode(allow_non_fake_inputs=True):  # as a dry run's fake twin holds them
        rows = torch.empty(tokens * top_k, hidden, requires_grad=True)
        counts = torch.empty(experts, dtype=torch.int64)
    with CollectiveCounter(nn.Module(), fake_mesh_2x4) as counter:
        received, exchange = dispatch(rows, counts, group, experts)
        back = combine(received * 2, exchange)
        back.sum().backward()
    assert exchange.send_splits == exchange.recv_splits == [8, 8, 8, 8]
    assert exchange.local_counts == [16, 16]  # each of this rank's 2 experts: 4 rows from each of 4 ranks
    assert tuple(received.shape) == (32, hidden) and tuple(back.shape) == (32, hidden)
    table = counter.table()["<root>"]["tp"]["all_to_all"]
    assert table["count"] == 5  # counts, dispatch, combine; the two reverse exchanges of the backward
    row_bytes = tokens * top_k * hidden * 4
    assert table["bytes"] == experts * 8 + 4 * row_bytes
    # what the price charges per row exchange: the buffer's share that leaves the rank
    assert even_load_all_to_all_bytes(tokens, top_k, hidden, 4, 4) == row_bytes * 3 / 4
