"""Ops whose sharding decision is autoplan's own run under dynamo with symbolic shapes
(``dtensor/overrides.py``: ``_run_here`` reads whether a decision was autoplan's from a
schema that holds symbolic sizes, which cannot be hashed). A model that runs one block at
several resolutions (a UNet) makes dynamo mark its sizes dynamic after the second."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from autoplan.dtensor.overrides import installed


@pytest.fixture
def mesh():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    torch._dynamo.reset()
    with installed():
        yield init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    torch._dynamo.reset()
    dist.destroy_process_group()


def _zeroed(value, mask):
    return value.masked_fill(mask, 0.0) * 2  # autoplan's own rule: a partial value stays partial


def test_an_own_decision_compiles_with_dynamic_shapes(mesh):
    compiled = torch.compile(_zeroed, backend="aot_eager", dynamic=True)
    for rows in (4, 2):  # two sizes, as a UNet's block at two resolutions
        local = torch.randn(rows, 5, 1)
        value = DTensor.from_local(local, mesh, [Partial(), Shard(0)], run_check=False)
        mask = DTensor.from_local(local > 0, mesh, [Replicate(), Shard(0)], run_check=False)
        eager = _zeroed(value, mask)
        out = compiled(value, mask)
        assert tuple(out.placements) == tuple(eager.placements) == (Partial(), Shard(0))
        assert torch.equal(out.to_local(), local.masked_fill(local > 0, 0.0) * 2)


def test_a_schema_with_a_symbolic_size_is_decided_outside_the_cache(mesh):
    """Asked through the cached entry point (DTensor's test of tracing did not say so) with a
    schema that holds a symbolic size, the decision is made uncached instead of failing on
    the schema's hash ("unhashable type: non-nested SymInt": timm's CrossViT compiled whole)."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._op_schema import OpSchema
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from autoplan.dtensor import overrides

    rows = ShapeEnv().create_unbacked_symint()
    spec = DTensorSpec(mesh, (Replicate(), Shard(1)), TensorMeta(torch.Size([rows, 8]), (8, 1), torch.float32))
    schema = OpSchema(torch.ops.aten.relu.default, (spec,), {})
    with pytest.raises(TypeError, match="unhashable"):
        hash(schema)
    seen = []
    cache = overrides._PropagationCache(lambda s: seen.append(s) or "decided", are_we_tracing=lambda: False)
    assert cache(schema) == "decided"
    assert cache.uncached_entry(schema) == "decided"
    assert seen == [schema, schema]
    assert not cache.decided_by_autoplan(OpSchema(torch.ops.aten.relu.default, (spec,), {}))
