"""Edges a mutation audit found unguarded: each test here fails on a small change to the
code that the rest of the suite let pass (the change is named in the test's docstring).

* sampling: rows with no softmax (all −inf, a +inf) give token −1 through every plan, in
  top-k and in Gumbel mode; exact ties at the top-p boundary are cut by the exact rule
  (mass ≥ top_p), checked against the exact distribution, not against the NumPy twin
  (which shares :func:`numba_softmax.draws.draw` with the kernels);
* paged tables: a row filled exactly to its last used block, the next entry −1, is
  accepted by the host check and by the device check; the two checks agree with a plain
  Python oracle on random tables (Hypothesis);
* the top-k split merge with more pieces than its merge block has threads: a thread then
  folds several piece states, which only the combiner's rescale gets right.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

import numba_softmax as ns
from numba_softmax import block_tables
from numba_softmax.kernels.decode import table_check as TC
from numba_softmax.kernels.topk import sample as S
from numba_softmax.kernels.topk import topk as K
from numba_softmax.reference import topk as RT
from numba_softmax.topk import sample

from _attention_data import F32, check, fresh, random
from _helpers import SIMULATOR, sized
from test_topk import run as run_topk

# every layout the sampler launches: a warp a row, a block a row, pieces merged by kernel 2
SAMPLE_PLANS = {"warp-rows": K.Plan(True, 64, 4), "block-row": K.Plan(False, 64, 4),
                "split": K.Plan(False, 32, 4, 3)}
MODES = {"top-k": dict(top_k=4, top_p=0.9), "gumbel": dict(top_k=None)}


def draw(x, plan, **kw):
    tokens = cuda.to_device(np.full(x.shape[0], -7, np.int64))  # poisoned
    S.launch(cuda.to_device(x), tokens, plan=plan, **kw)
    return tokens.copy_to_host()


# --- sampling: rows with no softmax ---------------------------------------------------------
def no_softmax_rows(v):
    """Row 0 and 3 ordinary; row 1 all −inf (a fully masked vocabulary); row 2 holds +inf."""
    x = np.random.default_rng(5).standard_normal((4, v)).astype(np.float32)
    x[1] = -np.inf
    x[2, v // 2] = np.inf
    return x


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("plan", SAMPLE_PLANS)
def test_sample_rows_without_softmax_give_minus_one(plan, mode):
    """Mutant: ``not l > 0`` → ``l != l`` in :func:`.kernels.topk.sample.chooser` (an all −inf
    row has ℓ = 0, not NaN: it would draw a token)."""
    x = no_softmax_rows(sized(24, 3000))
    kw = dict(MODES[mode], temperature=0.8, seed=11)
    want = np.array([0, -1, -1, 0])
    for got in (draw(x, SAMPLE_PLANS[plan], **kw), RT.sample(x, **kw)):
        assert (got[[1, 2]] == -1).all(), got
        assert (got[[0, 3]] >= 0).all() and (got[[0, 3]] < x.shape[1]).all(), got
    assert (sample(x, **kw)[[1, 2]] == want[[1, 2]]).all()  # the public function's own plan


# --- sampling: ties at the top-p boundary ---------------------------------------------------
@pytest.mark.parametrize("plan", ["twin", "public"] + list(SAMPLE_PLANS))
def test_top_p_ties_are_cut_at_mass_at_least_p(plan):
    """Four equal logits, top_k 4, top_p 0.5: the nucleus is the smallest prefix of mass ≥
    0.5 — tokens 0 and 1 (ties sorted by index), each with probability 1/2.  Mutant: ``mass
    >= need`` → ``mass > need`` in :func:`numba_softmax.draws.draw` (the prefix grows to 3
    tokens; the twin and the kernels share it, so only the exact distribution catches it)."""
    # seed 3's first four rows draw u = 0.738, 0.365, 0.454, 0.449: both tokens, and one
    # u > 2/3, where a prefix of three would draw token 2
    rows = 64 if plan == "twin" else sized(4, 64)
    x = np.zeros((rows, 4), np.float32)
    kw = dict(top_k=4, top_p=0.5, seed=3)
    p = RT.sample_probabilities(x[0], top_k=4, top_p=0.5)
    np.testing.assert_array_equal(p, [0.5, 0.5, 0, 0])  # the exact distribution, by cumsum
    got = (RT.sample(x, **kw) if plan == "twin" else sample(x, **kw) if plan == "public"
           else draw(x, SAMPLE_PLANS[plan], **kw))
    counts = np.bincount(got, minlength=4)
    assert counts[2:].sum() == 0, counts  # outside the nucleus: probability 0
    # inside: Binomial(rows, 1/2) each (the seed is fixed: the draws are too)
    assert counts[0] > 0 and counts[1] > 0, counts


# --- paged tables: a row full to its last used block ----------------------------------------
FULL = (np.array([[3, 1, -1]], np.int32), np.array([8], np.int32))  # 8 = 2 blocks of 4


def none_found(table):
    b, w = table.shape
    return (b, 0, b * w, 0)


def test_a_table_row_used_to_its_last_block_is_accepted():
    """Positions 0 … 7 use blocks 0 and 1 of the row; entry 2 (−1) is never read.  Mutants:
    ``j * block_size < end`` → ``<=`` in :mod:`.kernels.decode.table_check`'s kernel, and
    ``< np.clip(…)`` → ``<=`` in its host twin
    (:func:`numba_softmax.block_tables.table_findings`): either refuses the row."""
    table, lengths = FULL
    assert block_tables.table_findings(table, lengths, 5, 4) == none_found(table)
    assert TC.findings(cuda.to_device(table), cuda.to_device(lengths), 5, 4) == none_found(table)
    block_tables.tables(table, lengths, 5, 4)
    block_tables.tables(cuda.to_device(table), cuda.to_device(lengths), 5, 4)
    for new in (1, 5):  # one token more: entry 2 is then used (and −1)
        with pytest.raises(ValueError, match=r"block_table\[0, 2\] = -1|needs"):
            block_tables.tables(table, lengths, 5, 4, new_tokens=new)
        with pytest.raises(ValueError, match=r"block_table\[0, 2\] = -1|needs"):
            block_tables.tables(cuda.to_device(table), cuda.to_device(lengths), 5, 4, new_tokens=new)
    # through the public function, host and device tables alike, against the reference
    rng, seed = fresh()
    k_cache, v_cache = (random(rng, (5, 4, 2, 8), F32) for _ in range(2))
    q = random(rng, (1, 4, 1, 8), F32)
    want = ns.reference.paged_attention(q, k_cache, v_cache, table, lengths, return_lse=True)
    for t, n in ((table, lengths), (cuda.to_device(table), cuda.to_device(lengths))):
        o, lse = ns.paged_attention(cuda.to_device(q), cuda.to_device(k_cache),
                                    cuda.to_device(v_cache), t, n, return_lse=True)
        check(o.copy_to_host(), lse.copy_to_host(), *want, F32, f"seed {seed}")


def oracle(table, lengths, num_blocks, block_size, new_tokens):
    """The check's four numbers by a plain loop over the rule of :mod:`.table_check`."""
    n_b, width = table.shape
    bad_b = bad_f = None
    for b in range(n_b):
        end = int(lengths[b]) + new_tokens
        if bad_b is None and (lengths[b] < 0 or end > width * block_size):
            bad_b = b
        for j in range(width):
            used = j * block_size < min(max(end, 0), width * block_size)
            if bad_f is None and used and not 0 <= table[b, j] < num_blocks:
                bad_f = b * width + j
    b = n_b if bad_b is None else bad_b
    f = n_b * width if bad_f is None else bad_f
    return (b, int(lengths[b]) if b < n_b else 0,
            f, int(table.ravel()[f]) if f < n_b * width else 0)


@st.composite
def tables(draw):
    """Tables whose lengths sit on, just before and just after block boundaries (where the
    checks' comparisons are decided), entries past the used blocks −1 or out of the pool."""
    bs = draw(st.integers(1, 5))
    width = draw(st.integers(1, 4))
    rows = draw(st.integers(1, 4))
    num_blocks = draw(st.integers(1, 6))
    new = draw(st.integers(0, 3))
    lengths, table = [], []
    good, bad = st.integers(0, num_blocks - 1), st.sampled_from([-1, -2, num_blocks])
    for _ in range(rows):
        j = draw(st.integers(0, width + 1))  # blocks in use
        lengths.append(j * bs - new + draw(st.sampled_from([-1, 0, 0, 1])))
        # used entries mostly good; the rest anything, mostly −1
        table.append([draw(st.one_of(good, good, good, bad) if c < j else st.one_of(bad, good))
                      for c in range(width)])
    return (np.array(table, np.int32), np.array(lengths, np.int32), num_blocks, bs, new)


@given(tables())
def test_table_checks_agree_with_a_plain_loop(case):
    table, lengths, num_blocks, bs, new = case
    want = oracle(table, lengths, num_blocks, bs, new)
    assert block_tables.table_findings(table, lengths, num_blocks, bs, new) == want, "host"
    got = TC.findings(cuda.to_device(table), cuda.to_device(lengths), num_blocks, bs, new)
    assert got == want, "device"


def test_table_checks_agree_on_every_boundary():
    """The boundary cases of the property above, all of them, every run: widths 1 … 3,
    block sizes 1 … 4, each length from −1 to past the row, the entry after the last used
    one −1 (host and device in one device call per block size: the rows side by side)."""
    for bs in range(1, 5):
        for width in range(1, 4):
            lengths = np.arange(-1, width * bs + 2, dtype=np.int32)
            table = np.full((lengths.size, width), -1, np.int32)
            for b, n in enumerate(lengths):
                table[b, : -(-max(int(n), 0) // bs)] = 0
            for new in (0, 1):
                for rows in (slice(0, None), slice(1, -1)):  # with and without bad lengths
                    t, n = np.ascontiguousarray(table[rows]), np.ascontiguousarray(lengths[rows])
                    want = oracle(t, n, 1, bs, new)
                    assert block_tables.table_findings(t, n, 1, bs, new) == want, (bs, width, new, "host")
                    got = TC.findings(cuda.to_device(t), cuda.to_device(n), 1, bs, new)
                    assert got == want, (bs, width, new, "device")


# --- the top-k split merge: more pieces than merge threads ----------------------------------
@pytest.mark.parametrize("plan", [
    K.Plan(False, 32, 4, 40, radix=True, fused=True),  # topk_merge in the last piece's block
    K.Plan(False, 32, 4, 40, radix=True),              # topk_merge in kernel 2
    K.Plan(False, 32, 4, 40),                          # topk_state in kernel 2
    pytest.param(K.Plan(False, 32, 4, 40, fused=True), marks=pytest.mark.skipif(
        SIMULATOR, reason="the simulator aliases the piece's and the merge's shared lists "
                          "(one allocation per source line): more than 32/k pieces overflow")),
], ids=["radix-fused", "radix-kernel-2", "lists-kernel-2", "lists-fused"])
def test_topk_merge_folds_more_pieces_than_threads(plan, monkeypatch):
    """A row in 40 pieces, merged by a block of 32 threads (kernel 2's block narrowed to 32
    here; 512 on a GPU): each thread folds two pieces' (m, ℓ).  Mutant: ``combine_device``
    → ``max(m, m'), ℓ + ℓ'`` (no rescale) in the fold loops of
    :mod:`.kernels.topk.topk_merge` and :mod:`.kernels.topk.topk_state`."""
    monkeypatch.setattr(K, "merge_threads", lambda radix=False: 32)
    rng = np.random.default_rng(17)
    x = rng.standard_normal((1, 40 * 8)) * 2
    x[:, ::37] += 4  # a few large values in some pieces: the pieces' maxima differ widely
    run_topk(x, 5, plan=plan, log=plan.radix)
