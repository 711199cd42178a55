"""Other tools' formats: PyTorch's ParallelStyles and ``fully_shard`` (``export_torch.py``), veScale
(``export_vescale.py``), and torch.distributed.checkpoint (``checkpoint.py``).
"""
