"""Pipeline parallelism planned with the layout: stages, schedule, microbatches and the mesh shape.

Not to be confused with ``autoplan/pipeline/`` (the ``suggest`` orchestration). Files:
``schedules.py`` (each schedule's makespan, bubble and microbatches in flight),
``partition.py`` (contiguous runs of the repeated blocks, balanced by price),
``mesh_shapes.py`` (the factorisations of a device count into pp x dp x tp),
``parts.py`` (a solved layout's price, split into the part before the stack, one block,
and the part after it), ``search.py`` (every schedule, microbatch count and stage split
priced on one layout), ``stage_mesh.py`` (one stage mesh's layout solved, then searched),
``microbatch_collectives.py`` (the layout's collectives for one microbatch: the prediction
verify checks), ``assemble.py`` (the pipelined plan), ``planner.py`` (``suggest_pipelined`` for a mesh with
a pp axis, ``suggest_devices`` choosing the mesh too). docs/pipeline.md tells it whole.
"""
