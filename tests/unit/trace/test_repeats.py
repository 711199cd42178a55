"""Repeated-block detection on module lists with empty slots."""

from torch import nn

from autoplan.trace.repeats import find_repeated_blocks


class _Layer(nn.Module):
    """One layer with its norms kept as x-transformers keeps them: ``[norm, None, None]``."""

    def __init__(self):
        super().__init__()
        self.norms = nn.ModuleList([nn.LayerNorm(8), None, None])
        self.proj = nn.Linear(8, 8)


def test_a_list_with_empty_slots_is_no_stack_but_the_layers_around_it_are():
    model = nn.Module()
    model.layers = nn.ModuleList([_Layer() for _ in range(3)])
    blocks = find_repeated_blocks(model)
    assert blocks is not None and (blocks.fqn, blocks.count, blocks.layer_class) == ("layers", 3, "_Layer")


def test_a_list_of_none_and_modules_alone_is_no_stack():
    model = nn.Module()
    model.norms = nn.ModuleList([nn.LayerNorm(8), None, nn.LayerNorm(8), nn.LayerNorm(8)])
    assert find_repeated_blocks(model) is None
