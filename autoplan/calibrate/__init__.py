"""``autoplan calibrate``: measure a cluster and write its profile.

One concern per module, in the order a run uses them:

    sizes          what to measure (the sweep: message sizes, matmul shapes, repeats)
    timing         how one op is timed on every rank at once
    sweep          the measurements: collectives per mesh axis (DTensor redistribute),
                   matmuls, memory-bound ops, per-op overhead
    host           hosts (hashed), device name and memory, library versions
    fit            least-squares fits: latency + bandwidth, Saturation efficiency curves
    profile_writer measurements + fits -> profile JSON with provenance
    progress       the plain-text progress bar
    launch         process groups under torchrun or spawned here; rank 0's atomic write
"""

from autoplan.calibrate.launch import CalibrateConfig, calibrate_rank, spawn_calibration

__all__ = ["CalibrateConfig", "calibrate_rank", "spawn_calibration"]
