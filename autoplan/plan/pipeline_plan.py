"""The pipeline part of a plan: which modules each stage holds, the schedule, the microbatches.

A plan with pipeline stages is made for a mesh with one pipeline axis (``pp``, say) next
to the axes a layout splits over (``dp``, ``tp``). The rest of the plan (parameters,
modules, inputs, recompute) is the layout on one stage's mesh, the full mesh less the
pipeline axis: ``Plan.mesh_shape`` and ``Plan.axis_names`` name that stage mesh, and
``PipelinePlan.axis_index`` says where the pipeline axis sits in the full mesh
(``full_mesh``). Every stage runs the same layout on its own modules; the batch layout is
that of one microbatch (``Plan.inputs`` keep the whole batch's shape, split into
``microbatches`` along dim 0 before the layout applies).

Stages are listed in model order. With ``virtual`` stages per rank (interleaved
schedules) there are ``size * virtual`` of them; ``Stage.rank`` says which index on the
pipeline axis runs each (stage i on rank i % size for looped schedules, the V shape for
ZBV). Stage modules are module FQNs whose subtrees the stage owns whole; every parameter
lies under exactly one stage (``check_pipeline_data``).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.tree_paths import fqn_within

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
"""The schedules a plan may name: the classes of ``torch.distributed.pipelining.schedules``
(``Schedule<name>``), which the apply engine builds."""
MULTI_STAGE_SCHEDULES = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
"""Schedules that run more than one stage per rank."""


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: the modules it holds and its predicted share of the step."""

    modules: tuple[str, ...]
    """Module FQNs, in model order, whose whole subtrees the stage holds."""
    rank: int
    """The index on the pipeline axis whose ranks run this stage."""
    forward_s: float = 0.0
    """Predicted forward time of one microbatch through the stage."""
    backward_s: float = 0.0
    """Predicted backward time of one microbatch (input and weight gradients together)."""
    peak_memory_bytes: int = 0
    """Predicted peak per device of the ranks running the stage: its parameters, gradients
    and optimizer state as the layout stores them, plus the activations of the
    microbatches the schedule keeps in flight at that stage."""


@dataclass(frozen=True)
class Alternative:
    """Another way the planner priced: what fewer or more stages (or another mesh shape,
    schedule or microbatch count) would have cost."""

    mesh: str
    """The full mesh in words ("pp 4 x dp 8 x tp 4")."""
    stages: int
    """Stages in all (pipeline size x stages per rank); 1: no pipeline."""
    schedule: str
    microbatches: int
    step_time_s: float
    peak_memory_bytes: int
    fits: bool

    def to_dict(self) -> dict:
        return {"mesh": self.mesh, "stages": self.stages, "schedule": self.schedule, "microbatches": self.microbatches,
                "step_time_s": self.step_time_s, "peak_memory_bytes": self.peak_memory_bytes, "fits": self.fits}

    @classmethod
    def from_dict(cls, data: dict) -> Alternative:
        return cls(data["mesh"], int(data["stages"]), data["schedule"], int(data["microbatches"]),
                   float(data["step_time_s"]), int(data["peak_memory_bytes"]), bool(data["fits"]))


@dataclass(frozen=True)
class PipelinePlan:
    """How the model is cut into stages over the pipeline axis and how they are scheduled."""

    axis: str
    """The pipeline axis's name in the full mesh."""
    size: int
    """The pipeline axis's size: how many ranks the stages are spread over."""
    axis_index: int
    """Where the pipeline axis sits among the full mesh's axes."""
    schedule: str
    """One of ``SCHEDULES``."""
    microbatches: int
    """How many microbatches the batch is cut into (along dim 0)."""
    stages: tuple[Stage, ...]
    """In model order; ``size * virtual`` of them."""
    bubble_share: float = 0.0
    """Predicted share of the step the pipeline axis's ranks spend idle (the schedule's bubble)."""
    p2p_s: float = 0.0
    """Predicted time of the step's point-to-point sends of activations and gradients that is not hidden."""
    alternatives: tuple[Alternative, ...] = ()
    """What the planner priced besides: the best of each other stage count and mesh shape,
    fastest first (``show`` and ``explain`` print them); () where it priced none."""

    @property
    def virtual(self) -> int:
        """Stages per rank."""
        return len(self.stages) // self.size

    def full_mesh(self, stage_shape: tuple[int, ...], stage_names: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The whole mesh: the stage mesh with the pipeline axis put back at ``axis_index``."""
        shape, names = list(stage_shape), list(stage_names)
        shape.insert(self.axis_index, self.size)
        names.insert(self.axis_index, self.axis)
        return tuple(shape), tuple(names)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """Indices (into ``stages``) of the stages the pipeline rank ``rank`` runs, in model order."""
        return tuple(i for i, stage in enumerate(self.stages) if stage.rank == rank)

    def to_dict(self) -> dict:
        alternatives = {"alternatives": [a.to_dict() for a in self.alternatives]} if self.alternatives else {}
        return alternatives | {
            "axis": self.axis,
            "size": self.size,
            "axis_index": self.axis_index,
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "bubble_share": self.bubble_share,
            "p2p_s": self.p2p_s,
            "stages": [
                {"modules": list(s.modules), "rank": s.rank, "forward_s": s.forward_s, "backward_s": s.backward_s,
                 "peak_memory_bytes": s.peak_memory_bytes}
                for s in self.stages
            ],
        }

    @classmethod
    def from_dict(cls, data: dict) -> PipelinePlan:
        return cls(
            axis=data["axis"],
            size=int(data["size"]),
            axis_index=int(data["axis_index"]),
            schedule=data["schedule"],
            microbatches=int(data["microbatches"]),
            bubble_share=float(data.get("bubble_share", 0.0)),
            p2p_s=float(data.get("p2p_s", 0.0)),
            alternatives=tuple(Alternative.from_dict(a) for a in data.get("alternatives", ())),
            stages=tuple(
                Stage(tuple(s["modules"]), int(s["rank"]), float(s.get("forward_s", 0.0)), float(s.get("backward_s", 0.0)),
                      int(s.get("peak_memory_bytes", 0)))
                for s in data["stages"]
            ),
        )


def check_pipeline_data(pipeline: dict, data: dict) -> str | None:
    """What the schema cannot say about a plan's ``pipeline`` (``data`` is the whole plan's
    data): None where it holds, else what is wrong, in words."""
    size, stages, names = pipeline["size"], pipeline["stages"], data["mesh"]["axis_names"]
    if pipeline["axis"] in names:
        return f"pipeline.axis {pipeline['axis']!r} is also a layout axis in mesh.axis_names {names}"
    if not 0 <= pipeline["axis_index"] <= len(names):
        return f"pipeline.axis_index {pipeline['axis_index']} is outside the {len(names) + 1}-axis mesh"
    if len(stages) % size:
        return f"pipeline has {len(stages)} stages, not a multiple of its size {size}"
    virtual = len(stages) // size
    if virtual > 1 and pipeline["schedule"] not in MULTI_STAGE_SCHEDULES:
        return f"pipeline.schedule {pipeline['schedule']} runs one stage per rank, but {len(stages)} stages are on {size} ranks"
    ranks = sorted(s["rank"] for s in stages)
    if ranks != sorted(list(range(size)) * virtual):
        return f"pipeline stages' ranks {ranks} do not give each of the {size} ranks {virtual} stage(s)"
    owners: dict[str, int] = {}
    for index, stage in enumerate(stages):
        for module in stage["modules"]:
            if module in owners:
                return f"pipeline: module {module!r} is in stages {owners[module]} and {index}"
            owners[module] = index
    for fqn in data["parameters"]:
        holders = [m for m in owners if fqn_within(fqn, m)]
        if len(holders) != 1:
            where = "no stage" if not holders else f"several stages ({', '.join(holders)})"
            return f"pipeline: parameter {fqn} lies under {where}"
    return None
