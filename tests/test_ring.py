"""Ring attention: the schedule (pure), the in-process ring, and the torch.distributed ring.

The schedule is checked against a materialised mask: over all ranks and steps every
(query, key) pair the whole-sequence mask keeps is computed exactly once, and no other;
zigzag shards go back to the sequence they came from; under zigzag every rank does the
same causal work at every step.  The ring's result is compared with the float64
reference on the whole sequence: with float64 arithmetic (every P = 1 … 8), with the
device kernels (the simulator: a few small rings), and through torch.distributed with
``gloo`` in three processes (skipped without torch).
"""

import numpy as np
import pytest

from numba_softmax import reference as R
from numba_softmax import ring

from _helpers import SIMULATOR, sized

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
TOL = {F32: dict(rtol=1e-4, atol=2e-5), F16: dict(rtol=4e-3, atol=2e-3)}  # as test_attention
WORLDS = range(1, 9)


def fresh():
    seed = int(np.random.SeedSequence().entropy % 2**32)
    return np.random.default_rng(seed), seed


def layouts(world, causal, total):
    """The layouts a ring may run: zigzag (causal or not), contiguous with ragged lengths."""
    rng = np.random.default_rng(total * 31 + world)
    cuts = np.sort(rng.integers(0, total + 1, world - 1))
    ragged = np.diff(np.concatenate([[0], cuts, [total]])).tolist()
    return [ring.zigzag(total, world), ring.contiguous(ragged)]


# --- the schedule ---------------------------------------------------------------------------
@pytest.mark.parametrize("world", WORLDS)
def test_every_rank_holds_every_shard_once(world):
    for r in range(world):
        held = [ring.source(r, t, world) for t in range(world)]
        assert held[0] == r and sorted(held) == list(range(world))
        # what rank r holds at step t + 1 is what rank r − 1 held at step t
        assert all(ring.source(r, t + 1, world) == ring.source((r - 1) % world, t, world)
                   for t in range(world - 1))


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("total", [0, 3, 16, 37])
def test_zigzag_split_and_unsplit(world, total):
    layout = ring.zigzag(total, world)
    sizes = ring.chunk_sizes(total, 2 * world)
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == total
    for r in range(world):  # rank r: chunk r, then chunk 2P − 1 − r
        starts = np.cumsum([0] + sizes)
        assert layout.pieces[r] == ((starts[r], starts[r + 1]),
                                    (starts[2 * world - 1 - r], starts[2 * world - r]))
    rows = np.concatenate([layout.rows(r) for r in range(world)])
    assert sorted(rows.tolist()) == list(range(total))  # a permutation of the sequence
    x = np.random.default_rng(total).standard_normal((2, total, 3))
    for lay in layouts(world, True, total):
        shards = [ring.shard(x, lay, r) for r in range(world)]
        for r, s in enumerate(shards):
            np.testing.assert_array_equal(s, x[:, lay.rows(r)])
        np.testing.assert_array_equal(ring.unshard(shards, lay), x)
    for r in range(world):
        np.testing.assert_array_equal(ring.zigzag_shard(x, r, world), x[:, layout.rows(r)])


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("causal", [False, True])
def test_every_pair_computed_exactly_once(world, causal):
    for total in (4 * world, 4 * world + 3):
        for layout in layouts(world, causal, total):
            count = np.zeros((total, total), dtype=int)
            for row in ring.schedule(layout, causal):
                for st in row:
                    qrows, krows, mask = ring.step_pairs(layout, st)
                    # the step's mask is the whole-sequence mask on its rows and columns
                    want = R.visible(total, total, causal)[np.ix_(qrows, krows)]
                    assert np.array_equal(mask, want), (layout, st)
                    np.add.at(count, np.ix_(qrows, krows), mask)
            assert np.array_equal(count, R.visible(total, total, causal).astype(int)), layout


@pytest.mark.parametrize("world", WORLDS)
def test_zigzag_steps(world):
    layout = ring.zigzag(8 * world, world)
    for t, row in enumerate(ring.schedule(layout, True)):
        for st in row:
            if t == 0:
                assert st.kind == "diagonal" and st.causal and st.q == slice(0, 8) == st.k
            elif st.source < st.rank:  # all local queries, the first half of the keys
                assert (st.kind, st.q, st.k, st.causal) == ("first keys", slice(0, 8),
                                                            slice(0, 4), False)
            else:  # the second half of the local queries, all the keys
                assert (st.kind, st.q, st.k, st.causal) == ("last queries", slice(4, 8),
                                                            slice(0, 8), False)
    assert all(st.kind == "full" for row in ring.schedule(layout, False) for st in row)


@pytest.mark.parametrize("world", WORLDS)
def test_zigzag_balances_causal_work(world):
    d, chunk = 4, 6
    total = 2 * world * chunk
    flops = np.array(ring.rank_flops(ring.zigzag(total, world), True, d))
    assert flops.sum() == total * (total + 1) // 2 * 4 * d  # every visible pair, 2·(D + Dv)
    assert (flops == flops[:, :1]).all()  # every step: the same work on every rank
    ragged = np.array(ring.rank_flops(ring.zigzag(total + world, world), True, d)).sum(0)
    assert ragged.max() / ragged.min() < 1.2  # chunks one row apart: nearly balanced
    if world > 1:  # contiguous shards: rank P−1 works 2P−1 times as much as rank 0
        contiguous = np.array(ring.rank_flops(ring.contiguous([2 * chunk] * world), True, d))
        per_rank = contiguous.sum(0)
        assert per_rank[-1] / per_rank[0] == pytest.approx(2 * world - 1, rel=0.1)
        assert (contiguous == 0).any()  # steps where a rank waits with nothing to do


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="lengths"):
        ring.contiguous([3, -1])
    with pytest.raises(ValueError, match="rows"):
        ring.shard(np.zeros((5, 2)), ring.zigzag(6, 2), 0)
    with pytest.raises(ValueError, match="zigzag chunks"):
        ring.shard_layout([5, 4, 3], causal=True)
    with pytest.raises(ValueError, match="need 2 shards"):
        ring.virtual_ring([np.zeros((1, 2))], [np.zeros((1, 2))], [np.zeros((1, 2))],
                          ring.contiguous([1, 0]))


# --- the merge ------------------------------------------------------------------------------
def test_merge_forms_agree_and_the_combiner_keeps_empty_rows():
    """ring-flash-attention's form, out −= σ(lse_b − lse)(out − out_b),
    lse −= log σ(lse − lse_b), is the combiner's on finite LSEs; on two empty sides
    (LSE = −inf) it forms −inf − (−inf) = NaN where the combiner gives O = 0 and
    LSE = −inf."""
    rng, seed = fresh()
    o, ob = rng.standard_normal((2, 5, 3))
    lse, lse_b = rng.standard_normal((2, 5)) * 4
    lse[0] = lse_b[0] = -np.inf
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    with np.errstate(invalid="ignore"):
        o_sig = o - sig(lse_b - lse)[:, None] * (o - ob)
        lse_sig = lse - np.log(sig(lse - lse_b))
    o_c, lse_c = R.update_out_and_lse(o, lse, ob, lse_b)
    np.testing.assert_allclose(o_sig[1:], o_c[1:], rtol=1e-12, err_msg=f"seed {seed}")
    np.testing.assert_allclose(lse_sig[1:], lse_c[1:], rtol=1e-12, err_msg=f"seed {seed}")
    assert np.isnan(o_sig[0]).all() and np.isnan(lse_sig[0])
    assert (o_c[0] == 0).all() and lse_c[0] == -np.inf


# --- the in-process ring --------------------------------------------------------------------
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("causal", [False, True])
def test_virtual_ring_float64(world, causal):
    rng, seed = fresh()
    total = int(rng.integers(1, 6 * world))
    q, k, v = rng.standard_normal((3, 2, total, 5))
    ref_o, ref_lse = R.attention(q, k, v, causal=causal, return_lse=True)
    for lengths in (None, layouts(world, causal, total)[1].lengths()):
        o, lse, _ = ring.virtual_ring_attention(q, k, v, world, causal=causal, lengths=lengths,
                                                compute=ring.ReferenceCompute())
        np.testing.assert_allclose(o, ref_o, rtol=1e-12, atol=1e-13, err_msg=f"seed {seed}")
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, err_msg=f"seed {seed}")


@pytest.mark.parametrize("world, causal, total, lengths, dtype", [
    (3, True, sized(13, 200), None, F16),       # zigzag chunks 3, 2, 2, 2, 2, 2
    (2, False, sized(7, 301), sized([5, 2], [201, 100]), F32),  # odd, unequal shards
    *([] if SIMULATOR else [(4, True, 259, None, F32), (8, False, 301, [37] * 7 + [42], F16)]),
])
def test_virtual_ring_device(world, causal, total, lengths, dtype):
    """The device kernels (numba_softmax.attention / merge_attention) in every step."""
    rng, seed = fresh()
    q, k, v = (rng.standard_normal((sized(1, 3), total, 8)).astype(dtype) for _ in range(3))
    steps = []
    o, lse, layout = ring.virtual_ring_attention(
        q, k, v, world, causal=causal, lengths=lengths,
        hook=lambda phase, st, arrays: steps.append((phase, st.kind)))
    ref_o, ref_lse = R.attention(q, k, v, causal=causal, return_lse=True)
    assert o.dtype == dtype and lse.dtype == F32
    np.testing.assert_allclose(o.astype(np.float64), ref_o, err_msg=f"seed {seed}", **TOL[dtype])
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-4, err_msg=f"seed {seed}")
    phases = [phase for phase, _ in steps]
    assert [phases.count(p) for p in ("begin", "computed", "merged")] == [world * world] * 3


# --- torch.distributed with gloo, three processes on the CPU --------------------------------
def _gloo_worker(rank, world, store, results):
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        out = {}
        # zigzag shards of 5, 4 and 4 rows: every step receives a shard of another length
        for name, causal, total, dtype, lengths in (("zigzag", True, 13, torch.float16, None),):
            gen = torch.Generator().manual_seed(total)
            q, k, v = (torch.randn(1, total, 8, generator=gen).to(dtype) for _ in range(3))
            layout = ring.layout_for(total, world, causal, lengths)
            mine = [ring.shard(x, layout, rank) for x in (q, k, v)]
            o, lse = ring.ring_attention(*mine, causal=causal)
            out[name] = [ring.gather_sequence(x, layout, axis=a).float().numpy()
                         for x, a in ((o, -2), (lse, -1))] + [x.float().numpy() for x in (q, k, v)]
        try:  # shards that are not zigzag chunks: refused on every rank alike
            ring.ring_attention(*(torch.zeros(1, rank + 2, 8),) * 3, causal=True)
            out["refused"] = False
        except ValueError:
            out["refused"] = True
        if rank == 0:
            np.save(results, out, allow_pickle=True)
    finally:
        dist.destroy_process_group()


def test_torch_distributed_gloo(tmp_path):
    pytest.importorskip("torch")
    import torch.multiprocessing as mp

    results = tmp_path / "results.npy"
    # fork: the children start with numba and torch already imported (seconds each); a
    # process that holds a CUDA context cannot fork usable children, so spawn on a GPU
    mp.start_processes(_gloo_worker, args=(3, str(tmp_path / "store"), str(results)),
                       nprocs=3, start_method="fork" if SIMULATOR else "spawn")
    out = np.load(results, allow_pickle=True).item()
    assert out["refused"]
    for name, causal, dtype in (("zigzag", True, F16),):
        o, lse, q, k, v = out[name]
        ref_o, ref_lse = R.attention(q, k, v, causal=causal, return_lse=True)
        np.testing.assert_allclose(o, ref_o, err_msg=name, **TOL[dtype])
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-4, err_msg=name)

