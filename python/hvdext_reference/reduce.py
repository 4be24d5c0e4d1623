"""The order in which every implementation adds float64 statistics (TernGrad's sum and sum of squares, top-k's
|g_ef|^2), so that the NumPy reference, the CPU kernels and the GPU kernels give the same bits:

1. Cut the values into blocks of BLOCK = 4096 elements (the last one padded with zeros).
2. In each block, lane j (j = 0..7) adds the block's elements i = j mod 8 in order (512 sequential additions).
3. The lanes of a block are combined as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
4. The block results are combined pairwise, level by level: p'[i] = p[2i] + p[2i+1], an odd last one carried to
   the next level as it is, until one is left (0.0 for no elements).

Up to 4096 elements this is one block: 8 interleaved lanes. A GPU computes step 2 with one thread per (block,
lane), step 3 with three warp shuffles and step 4 with one pass per level, in the same order.
"""
import math

import numpy as np

LANES = 8
BLOCK = 4096


def combine_lanes(x):
    """((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)) over the last axis."""
    x = np.asarray(x, dtype=np.float64)
    return ((x[..., 0] + x[..., 1]) + (x[..., 2] + x[..., 3])) + ((x[..., 4] + x[..., 5]) + (x[..., 6] + x[..., 7]))


def pairwise(partials):
    """Step 4: the block results combined pairwise, level by level."""
    p = np.asarray(partials, dtype=np.float64)
    while p.size > 1:
        half = p.size // 2
        p = np.concatenate([p[0:2 * half:2] + p[1:2 * half:2], p[2 * half:]])
    return float(p[0]) if p.size else 0.0


def block_lane_sums(values):
    """Steps 1-2: (blocks, 8) lane sums, each sequential."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    blocks = max(1, math.ceil(values.size / BLOCK))
    padded = np.zeros(blocks * BLOCK, dtype=np.float64)
    padded[:values.size] = values
    # rows of (blocks * 8) columns, one column per (block, lane); reducing over the outer axis of a C-contiguous
    # array adds the rows in order, so each column is a sequential sum
    rows = np.ascontiguousarray(padded.reshape(blocks, BLOCK // LANES, LANES).transpose(1, 0, 2)).reshape(
        BLOCK // LANES, blocks * LANES)
    return np.add.reduce(rows, axis=0).reshape(blocks, LANES)


def block_tree_sum(values):
    """The sum of float64 values in the order above."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if values.size == 0:
        return 0.0
    return pairwise(combine_lanes(block_lane_sums(values)))
