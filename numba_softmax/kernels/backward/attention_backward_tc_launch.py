"""The host side of b3 (:mod:`.attention_backward_tc`): its tiles, fitted to the device,
and its launch.
"""

from ...runtime import launcher
from ...runtime.sim import simulator_enabled
from ..attention import score_mods
from ..attention.staging import PAD, aligned, up16
from ..hw.mma import for_dtype
from . import attention_backward_io as io
from .attention_backward_tc import kernel

MAX_HEAD_DIM = 128


class Tiles:
    """A launch configuration: ``warps`` W (Bc = 16·W keys a block, 16 a warp) and
    ``block_q`` Br query rows a tile (a multiple of 16 with Br/16 dividing W: each warp
    takes one 16-row slice of dQ).  Default: the first of :data:`DEFAULTS` whose shared
    memory the device allows — W = 8, Br = 64 on sm_80 and sm_90 (one block of 8
    warps a multiprocessor: 244–254 registers a thread; 155 KB at D 128), smaller tiles
    where a block gets less (99 KB on sm_86/sm_89: W = 4, Br = 32 at D 128); the
    simulator's: W = 1, Br = 16."""

    DEFAULTS = ((8, 64), (8, 32), (4, 32), (4, 16), (2, 16), (1, 16))

    def __init__(self, d, dv, warps=None, block_q=None, small=False):
        if small:
            warps, block_q = warps or 1, block_q or 16
        room = None if simulator_enabled() else launcher.device_limits().shared_optin
        if warps is None and block_q is None and room is not None:
            warps, block_q = self.fitting(d, dv, room)
        self.warps, self.block_q = warps or 8, block_q or 64
        w, br = self.warps, self.block_q
        if w not in (1, 2, 4, 8) or br % 16 or br < 16 or w % (br // 16):
            raise ValueError(f"warps must be 1, 2, 4 or 8 and block_q a multiple of 16 whose "
                             f"16-row slices divide the warps; got warps={w}, block_q={br}")
        self.block_k = 16 * w
        self.dp, self.dvp = up16(d), up16(dv)
        self.shared = self.bytes(d, dv, w, br) - 16 * br
        if room is not None and self.shared + 16 * br > room:
            raise ValueError(f"tiles warps={w}, block_q={br} need {self.shared + 16 * br} bytes "
                             f"of shared memory; this device allows {room} a block")

    @classmethod
    def fitting(cls, d, dv, room):
        """The first of :data:`DEFAULTS` whose block needs at most ``room`` bytes of shared
        memory (the last one if none does: its launch then says how much it needs)."""
        return (launcher.first_fitting(cls.DEFAULTS, lambda t: cls.bytes(d, dv, *t), room)
                or cls.DEFAULTS[-1])

    @staticmethod
    def bytes(d, dv, w, br):
        """Shared memory a block of tiles (w, br) uses: the dynamic tiles (K_j, V_j,
        Q_i ×2, dO_i ×2, dSᵀ; 16-bit) and the static rows (LSE_i, D_i ×2; float32)."""
        row = up16(d) + up16(dv) + 2 * PAD
        return 2 * (2 * br * row + 16 * w * row + 16 * w * (br + PAD)) + 16 * br


def launch(do, q, k, v, o, lse, dq, dk, dv, *, causal=False, window=(-1, -1), scale=None,
           stream=0, small=False, softcap=0.0, alibi=None, **tile_options):
    """dQ, dK, dV into ``dq``, ``dk``, ``dv`` as :func:`.attention_backward.launch`, for
    float16 or bfloat16 (uint16) storage; 1 <= D, Dv <= 128; a nonzero ``scale`` (a
    masked score is one whose scale·s is −inf).  ``softcap``, ``alibi``: as
    :func:`.attention_backward.launch`.  ``tile_options``: those of :class:`Tiles`."""
    for_dtype(q.dtype)  # TypeError unless float16 or bfloat16 bits
    d, dvh = q.shape[3], v.shape[3]

    def main(delta, dq_acc, scale, left, right):
        tiles = Tiles(d, dvh, small=small, **tile_options)
        vec = all(aligned(x) for x in (q, k, v, do))
        pairs = tuple(launcher.device_limits().cc) >= (9, 0)  # vector atomics: sm_90 on
        bwd, threads = kernel(q.dtype, d, dvh, tiles.warps, tiles.block_q, vec, pairs,
                              *score_mods.flags(softcap, alibi))
        scale = score_mods.runtime(scale, softcap, alibi)
        launcher.launch(bwd, (-(-k.shape[2] // tiles.block_k), k.shape[0] * k.shape[1]), threads,
                        stream, (do, q, k, v, lse, delta, dq_acc, dk, dv, scale, left, right),
                        shared=tiles.shared)

    io.launch(main, do, q, k, v, o, dq, causal=causal, window=window, scale=scale,
              stream=stream, max_head_dim=MAX_HEAD_DIM)
