"""The mesh shapes ``suggest --devices N`` considers: N factorised into pp x dp x tp.

Ranks are laid out row-major over the mesh, nodes holding consecutive ranks
(``cost/comm.py``), so the innermost axis is the fastest. The order considered is
``(pp, dp, tp)``, torchtitan's: tensor parallelism inside a node (its size divides the
devices per node: it moves activations every layer), data parallelism around it (one
gradient reduction per step), and the pipeline axis outermost, on the slowest links (it
sends one activation per microbatch and stage boundary). With the pipeline axis outermost,
the stage mesh (dp, tp) has the strides it has in the full mesh, so its links are priced
as they run. A pipeline of more stages than blocks, or of one, is no pipeline axis:
pp runs from 2 to the number of blocks; pp = 1 is the plain (dp, tp) mesh.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class MeshShape:
    pp: int
    dp: int
    tp: int

    @property
    def devices(self) -> int:
        return self.pp * self.dp * self.tp

    def words(self) -> str:
        return f"pp {self.pp} x dp {self.dp} x tp {self.tp}"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def mesh_shapes(devices: int, devices_per_node: int, max_stages: int) -> tuple[MeshShape, ...]:
    """Every (pp, dp, tp) with pp * dp * tp == ``devices``, tp dividing ``devices_per_node``
    and pp at most ``max_stages``, sorted."""
    shapes = []
    for tp in divisors(devices_per_node):
        if devices % tp:
            continue
        for pp in divisors(devices // tp):
            if pp <= max(1, max_stages):
                shapes.append(MeshShape(pp, devices // (tp * pp), tp))
    return tuple(sorted(shapes))
