"""Pipeline parallelism planned with the layout: stages, schedule, microbatches and the mesh shape.

Not to be confused with ``autoplan/pipeline/`` (the ``suggest`` orchestration). Files:
``schedules.py`` (each schedule's makespan, bubble and microbatches in flight),
``partition.py`` (contiguous runs of the repeated blocks, balanced by price),
``mesh_shapes.py`` (the factorisations of a device count into pp x dp x tp),
``parts.py`` (a solved layout's price per microbatch, split into the part before the
stack, one block, and the part after it), ``search.py`` (every stage count, schedule and
microbatch count priced on one layout), ``planner.py`` (the search over meshes and the plan).
"""
