"""Where the stages split the model: contiguous runs of the repeated blocks, balanced by price.

The modules before the stack (the embedding) go with the first stage and those after it
(final norm, head, loss) with the last; each stage between holds at least one block. A
stage's price is what the caller says it is (``stage_seconds(stage, blocks)``, non-decreasing
in ``blocks``, infinite where the stage cannot fit in memory), so a heavy embedding or head
takes blocks away from its stage. The split minimises the most expensive stage: a binary
search over the prices a stage can have, each tried by filling the stages in order with as
many blocks as keep them under it (optimal for contiguous runs of a monotone price); at
the least such price, the fill from the back is kept instead where its stages add up to
less (the leftovers then go to the first stage, not the last).
"""

from __future__ import annotations

import math
from collections.abc import Callable


def split_blocks(blocks: int, stages: int, stage_seconds: Callable[[int, int], float],
                 empty_ends: tuple[bool, bool] = (True, True)) -> tuple[int, ...] | None:
    """Blocks per stage, in model order, minimising the largest ``stage_seconds(stage, count)``;
    None where no split has every stage finite (or there are too few blocks). ``empty_ends``:
    whether the first and the last stage may hold no block (they hold the modules before and
    after the stack; a model with none there gives them a block too)."""
    ends = (stages > 1 and not empty_ends[0]) + (not empty_ends[1])
    if stages < 1 or blocks < max(0, stages - 2) + ends:
        return None
    table = [[stage_seconds(s, k) for k in range(blocks + 1)] for s in range(stages)]
    prices = sorted({t for row in table for t in row if math.isfinite(t)})
    best, limit = None, math.inf
    lo, hi = 0, len(prices) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        counts = _fill(blocks, table, prices[mid], empty_ends)
        if counts is None:
            lo = mid + 1
        else:
            best, limit, hi = counts, prices[mid], mid - 1
    if best is None:
        return None
    # Filled from the front, the last stage takes what is left; filled from the back, the
    # first does. Both keep every stage under the limit: keep the one of least total price
    # (the fill and drain of a schedule add up the stages, the busiest bounds the rest).
    backwards = _fill(blocks, table[::-1], limit, empty_ends[::-1])
    if backwards is not None:
        backwards = backwards[::-1]
        if _total(table, backwards) < _total(table, best):
            best = backwards
    return best


def _total(table: list[list[float]], counts: tuple[int, ...]) -> float:
    return sum(table[s][k] for s, k in enumerate(counts))


def _fill(blocks: int, table: list[list[float]], limit: float, empty_ends: tuple[bool, bool]) -> tuple[int, ...] | None:
    stages = len(table)
    counts, left = [], blocks
    for s in range(stages):
        if s == stages - 1:
            if table[s][left] > limit or (left == 0 and not empty_ends[1]):
                return None
            counts.append(left)
            break
        fewest = 0 if s == 0 and empty_ends[0] else 1
        needed_after = max(0, stages - 2 - s) + (not empty_ends[1])  # later stages that need a block
        most = left - needed_after
        k = most
        while k >= fewest and table[s][k] > limit:
            k -= 1
        if k < fewest:
            return None
        counts.append(k)
        left -= k
    return tuple(counts)

