"""The tiles of the tensor-core decode kernel (:mod:`.decode_tc`): a launch configuration
and the shared memory it takes.
"""

from ..attention.staging import PAD, up16
from .decode_tc import ROWS

# shared memory besides the tiles, at most: the fold's and the merge's arrays (13.1 KB at
# 16 rows; compiled for sm_90)
STATIC_SHARED = 16 * 1024


class Tiles:
    """A launch configuration: ``warps`` W, ``block_k`` Bc keys per warp tile (a multiple
    of 16), ``stages`` copies in flight per warp (2 … 4).  (The launcher's choice:
    :func:`.decode_launch.tiles_for`.)"""

    def __init__(self, d, dv, warps=4, block_k=32, stages=2, small=False):
        if small:  # the simulator: two warps, one 16-key tile each
            warps, block_k, stages = 2, 16, 2
        if warps not in (1, 2, 4, 8) or block_k not in (16, 32, 64) or stages not in (2, 3, 4):
            raise ValueError(f"warps must be 1, 2, 4 or 8, block_k 16, 32 or 64 and stages "
                             f"2, 3 or 4; got {warps}, {block_k}, {stages}")
        self.warps, self.block_k, self.stages = warps, block_k, stages
        tile = block_k * (up16(d) + up16(dv) + 2 * PAD) * 2  # K_j and V_j, 16-bit
        fold = warps * ROWS * up16(dv) * 4  # the warps' O for the fold, float32
        self.shared = max(warps * stages * tile, fold)
