"""Run under torchrun: every rank calls ``autoplan.suggest`` and records what it got.

    torchrun --standalone --nproc-per-node 8 suggest_every_rank.py MODEL.py OUT_DIR

Each rank writes ``OUT_DIR/rank<N>.json``: the SHA-256 of its plan's JSON bytes and the
cache outcome ``autoplan.suggest`` logged (rank 0's, shared with every rank).
"""

import hashlib
import json
import logging
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import autoplan
from autoplan._files import write_atomic
from autoplan._process_group import process_group
from autoplan.model_file import load_model_file


class CacheOutcome(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.outcomes = []

    def emit(self, record):
        if hasattr(record, "autoplan_cache"):
            self.outcomes.append(record.autoplan_cache)


def main(model_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    handler = CacheOutcome()
    logger = logging.getLogger("autoplan")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    with process_group("gloo"):
        loaded = load_model_file(model_file)
        plan = autoplan.suggest(loaded.model, loaded.example_inputs, mesh=(2, 4), axis_names=("dp", "tp"))
        record = {
            "rank": dist.get_rank(),
            "plan_sha256": hashlib.sha256(plan.to_json().encode()).hexdigest(),
            "cache": handler.outcomes,
        }
        write_atomic(Path(out_dir) / f"rank{dist.get_rank()}.json", json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:3])
