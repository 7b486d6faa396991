"""Launching split-KV decoding: which kernel, how many row chunks and splits, one launch.

Two kernels share one argument list and one grid — block x = (row chunk, split z, K/V
head, batch), the chunks of one head adjacent:

* :mod:`.decode_tc` (tensor cores) for float16 / bfloat16 with D and Dv multiples of 8
  (≤ 128), K and V rows 16-byte aligned, a finite nonzero scale: up to 16 packed query
  rows per block, the warps splitting the keys;
* :mod:`.decode` (CUDA cores) for everything else: float32 / float64, odd head sizes,
  unaligned strides; up to 4 packed rows per block.

The number of splits Z (:func:`choose_splits`) fills about one wave of the blocks the
device holds at once; with Z > 1 the blocks write float32 partials and the last block of
each row chunk merges them, inside the same launch.
"""

import math

import numpy as np

from ...runtime import counters, launcher
from . import decode, decode_tc, decode_tc_tiles
from ..attention import score_mods, tileio
from ..attention import visible as vis
from .decode_merge import MAX_SPLITS
from ..hw.jit import BFLOAT16, storage
from ..attention.merge import partials, split_forward
from ..attention.staging import aligned

TC_MAX_HEAD_DIM = 128  # beyond it O and Q no longer fit the tensor-core kernel's registers


def choose_splits(units, keys, resident_blocks, keys_per_step):
    """Z for ``units`` = B·Hkv·(row chunks) blocks: about one full wave of the blocks the
    device holds at once, at most one split per step of keys, at most MAX_SPLITS."""
    z = max(1, round(resident_blocks / max(units, 1)))
    return max(1, min(z, MAX_SPLITS, -(-keys // keys_per_step)))


def tensor_cores(q, k, v, scale):
    """The tensor-core kernel takes this problem (see the module docstring)."""
    d, dv = q.shape[3], v.shape[3]
    return (q.dtype == k.dtype == v.dtype and storage(q.dtype) in ("float16", BFLOAT16)
            and d % 8 == 0 and dv % 8 == 0 and max(d, dv) <= TC_MAX_HEAD_DIM
            and math.isfinite(scale) and scale != 0.0 and aligned(k) and aligned(v))


_RESIDENT = {}


def _resident(dec, args, threads, shared):
    """How many blocks of ``dec`` the device holds at once (asked once per variant)."""
    key = (dec, launcher.device_limits().name, threads, shared)
    if key not in _RESIDENT:
        _RESIDENT[key] = launcher.max_cooperative_blocks(dec, args, threads, shared)
    return _RESIDENT[key]


def _cuda_cores(q, d, dv, packed, paged, width, small, args, mods):
    """(kernel, warps, rows per block, shared bytes, keys per step) of :mod:`.decode`
    (``mods``: its (softcap_on, alibi_on))."""
    rows = min(packed, decode.MAX_ROWS)
    lpk, kpw, unroll = decode.lanes(q.dtype, d, dv)
    warps = 2 if small else decode.WARPS
    dec = decode.kernel(q.dtype, d, dv, rows, warps, paged, width, *mods)
    while 32 * warps > launcher.max_threads(dec, args(rows)):  # its registers allow fewer
        warps //= 2
        dec = decode.kernel(q.dtype, d, dv, rows, warps, paged, width, *mods)
    shared = warps * rows * lpk * decode.VALUES_PER_LANE * 4
    return dec, warps, rows, shared, warps * kpw * unroll


def tiles_for(units, sms, room=None, d=128, dv=128):
    """The tensor-core kernel's tiles (:class:`~.decode_tc_tiles.Tiles` options) for ``units``
    blocks before any split: 8 warps × 16 keys, tiles of 16 sitting inside every page of
    16 or more (one table read a tile); 3 stages where B·Hkv alone fills the device, 2
    where few blocks are split many ways (B 1).  ``room``: the shared memory a block may
    have (bytes; None: no limit) — where those tiles need more (3 stages at D 128 take
    204 KB, 2 stages 136 KB: more than sm_80's 163 KB or sm_86/sm_89's 99 KB), 2 stages,
    then fewer warps.  With the device filled, 8 × 16 × 3 (one block a multiprocessor)
    beats 4 × 16 × 3 (two) at every size timed, dense and paged; with B 1 the third stage
    gains nothing, so few blocks keep two (docs/algorithms/decode.md, "Tiles")."""
    choices = [dict(warps=w, block_k=16, stages=st) for w, st in
               ((8, 3 if 2 * units >= sms else 2), (8, 2), (4, 2), (2, 2), (1, 2))]
    return launcher.first_fitting(
        choices, lambda t: decode_tc_tiles.Tiles(d, dv, **t).shared + decode_tc_tiles.STATIC_SHARED,
        room) or choices[-1]


def layout(paged, block_size, block_k, left, kv_chunk):
    """The tensor-core kernel's :data:`~.decode_tc.LAYOUTS` entry: "pages" where every tile
    of ``block_k`` keys lies inside one block of the pool — blocks of 2^s ≥ block_k
    positions, and tiles that start on multiples of block_k: no left window bound (it
    moves the first key) and splits of a multiple of block_k keys; else "rows"."""
    if not paged:
        return "dense"
    pow2 = block_size & (block_size - 1) == 0
    aligned = left == vis.UNBOUNDED and int(kv_chunk or 0) % block_k == 0
    return "pages" if pow2 and block_size >= block_k and aligned else "rows"


def _tensor_core(q, d, dv, packed, units, small, options, layout_of, mods):
    """The same for :mod:`.decode_tc` (``options``: its :class:`~.decode_tc_tiles.Tiles`, by
    default :func:`tiles_for` the grid's ``units`` = B·Hkv blocks of each row chunk;
    ``layout_of(block_k)``: the kernel's layout)."""
    rows = min(packed, decode_tc.ROWS)
    if not options and not small:
        limits = launcher.device_limits()
        options = tiles_for(units * -(-packed // rows), limits.sms, limits.shared_optin, d, dv)
    tiles = decode_tc_tiles.Tiles(d, dv, small=small, **options)
    dec = decode_tc.kernel(q.dtype, d, dv, rows, tiles.warps, tiles.block_k, tiles.stages,
                           layout_of(tiles.block_k), *mods)
    return dec, tiles.warps, rows, tiles.shared, tiles.warps * tiles.block_k


def run(q, k, v, o, lse, *, paged, table=None, seqlens=None, max_seqlen_k=None,
        num_splits=None, kv_chunk=None, causal=False, window=(-1, -1), scale=None, stream=0,
        small=False, tiles=None, softcap=0.0, alibi=None):
    """Launch a decode kernel: dense k, v (B, Hkv, Sk, ·) or, with ``paged``, caches
    (blocks, block_size, Hkv, ·) with ``table`` (B, max_blocks) and ``seqlens`` (B,), int32.
    ``kv_chunk``: splits of exactly that many positions (at most MAX_SPLITS of them);
    ``num_splits``: at most that many even splits; neither: :func:`choose_splits`, from
    the number of keys (``max_seqlen_k``; paged, by default, the table's capacity).
    ``tiles``: None (the kernel :func:`tensor_cores` picks), False (CUDA cores), or a
    dict of :class:`.decode_tc_tiles.Tiles` options (tensor cores, where it can run).
    ``softcap``, ``alibi`` (a float32 (1 or B, Hq) device array of slopes): the score
    modifications of :mod:`..attention.score_mods`, in either kernel."""
    n_b, n_h, sq, d = q.shape
    n_kv = k.shape[2] if paged else k.shape[1]
    sk = k.shape[1] * table.shape[1] if paged else k.shape[2]
    sk = sk if max_seqlen_k is None else int(max_seqlen_k)
    dv = v.shape[3]
    if n_b * n_h * sq == 0:
        return
    packed = n_h // n_kv * sq  # query rows per K/V head
    dummy = counters.placeholder
    table = dummy(2, np.int32) if table is None else table
    seqlens = dummy(1, np.int32) if seqlens is None else seqlens
    o_ws, lse_ws, tickets = dummy(2, np.float32), dummy(1, np.float32), dummy(1, np.int32)
    bs = k.shape[1]
    page_shift = bs.bit_length() - 1 if paged and bs & (bs - 1) == 0 else -1
    left, right = vis.bounds(causal, window)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    mods, on_tc = score_mods.flags(softcap, alibi), tensor_cores(q, k, v, scale)
    scale_arg = score_mods.runtime(scale, softcap, alibi)

    def args(rows, kv_chunk=0, splits=1):
        return (q, k, v, o, lse, o_ws, lse_ws, tickets, table, seqlens, scale_arg, left, right,
                kv_chunk, splits, -(-packed // rows), page_shift)

    if tiles is not False and on_tc:
        dec, warps, rows, shared, step = _tensor_core(
            q, d, dv, packed, n_b * n_kv, small, tiles or {},
            lambda block_k: layout(paged, bs, block_k, left, kv_chunk), mods)
    else:
        width = tileio.global_width([q, k, v], (decode.VALUES_PER_LANE, d, dv))
        dec, warps, rows, shared, step = _cuda_cores(q, d, dv, packed, bool(paged), width,
                                                     small, args, mods)
    units = n_b * n_kv * -(-packed // rows)
    if kv_chunk is not None:
        kv_chunk = int(kv_chunk)
        splits = max(1, -(-sk // kv_chunk))
    elif num_splits is not None:
        splits, kv_chunk = max(1, min(int(num_splits), MAX_SPLITS)), 0
    else:
        kv_chunk = 0
        resident = 8 if small else _resident(dec, args(rows), 32 * warps, shared)
        splits = choose_splits(units, sk, resident, step)
    if splits > MAX_SPLITS:
        raise ValueError(f"{splits} splits; at most {MAX_SPLITS}")
    if splits > 1:
        # a row's Z partials adjacent: row ((b·Hq + h)·Sq + i)·Z + z (decode_merge)
        o_ws, lse_ws = partials((n_b * n_h * sq * splits,), -(-dv // 4) * 4, stream)
        tickets = counters.tickets(units, stream)
    launcher.launch(dec, (units * splits,), 32 * warps, stream, args(rows, kv_chunk, splits),
                    shared=shared)


def few_rows(q, k):
    """Few query rows per K/V head — (Hq/Hkv)·Sq ≤ 32: decoding, speculative decoding —
    the problems the decode kernels take (more rows: the forward kernel on key ranges)."""
    return q.shape[1] // k.shape[1] * q.shape[2] <= 8 * decode.MAX_ROWS


def launch(q, k, v, o, lse, *, num_splits=None, causal=False, window=(-1, -1), scale=None,
           kv_chunk=None, stream=0, small=False, tiles=None, softcap=0.0, alibi=None,
           **tile_options):
    """Split-KV attention on 4-D device arrays q (B, Hq, Sq, D), k (B, Hkv, Sk, D),
    v (B, Hkv, Sk, Dv); ``o`` (B, Hq, Sq, Dv) and ``lse`` (B, Hq, Sq, float32) receive the
    merged result.  ``num_splits``: at most that many key ranges (default: chosen from
    B·Hkv and the device); ``kv_chunk``: ranges of exactly that many keys.  ``tiles``:
    as :func:`run`.

    Few query rows per K/V head (≤ 32: decoding, speculative decoding) run a decode
    kernel; more, or tile options, run the forward kernel on key ranges and then the
    merge kernel (:func:`.merge.split_forward`).  ``softcap``, ``alibi``: the score
    modifications (:mod:`..attention.score_mods`), taken by every path."""
    n_b, n_h, sq, d = q.shape
    n_kv, sk, dv = k.shape[1], k.shape[2], v.shape[3]
    if n_kv < 1 or n_h % n_kv or v.shape[1] != n_kv:
        raise ValueError(f"q has {n_h} heads, k {n_kv} and v {v.shape[1]}: k and v need one "
                         f"number of heads that divides q's")
    if not 1 <= min(d, dv) <= max(d, dv) <= decode.MAX_HEAD_DIM:
        raise ValueError(f"head dimensions must be between 1 and {decode.MAX_HEAD_DIM}, "
                         f"got D={d}, Dv={dv}")
    chunks = 0 if kv_chunk is None else -(-sk // max(int(kv_chunk), 1))
    mods = dict(softcap=softcap, alibi=alibi) if softcap or alibi is not None else {}
    if not tile_options and few_rows(q, k) and chunks <= MAX_SPLITS:
        return run(q, k, v, o, lse, paged=False, num_splits=num_splits, kv_chunk=kv_chunk,
                   causal=causal, window=window, scale=scale, stream=stream, small=small,
                   tiles=tiles, **mods)
    split_forward(q, k, v, o, lse, num_splits=num_splits, kv_chunk=kv_chunk, causal=causal,
                  window=window, scale=scale, stream=stream, small=small, **mods, **tile_options)
