"""Device counts factorised into pp x dp x tp."""

from autoplan.pipeline_parallel.mesh_shapes import MeshShape, mesh_shapes


def test_every_factorisation_with_tp_inside_a_node():
    shapes = mesh_shapes(16, 8, max_stages=16)
    assert all(s.devices == 16 for s in shapes)
    assert all(8 % s.tp == 0 for s in shapes)
    assert MeshShape(2, 1, 8) in shapes and MeshShape(1, 16, 1) in shapes and MeshShape(16, 1, 1) in shapes
    assert len(shapes) == len(set(shapes)) == 5 + 4 + 3 + 2  # tp 1, 2, 4, 8: pp over the divisors of 16 / tp


def test_no_more_stages_than_allowed():
    shapes = mesh_shapes(128, 8, max_stages=4)
    assert max(s.pp for s in shapes) == 4
    assert MeshShape(4, 4, 8) in shapes


def test_an_odd_node_size():
    assert {s.tp for s in mesh_shapes(12, 6, max_stages=12)} == {1, 2, 3, 6}
