"""Walk one row: a softmax row folded chunk by chunk through (m, ℓ), and an attention query
row folded tile by tile through (m, ℓ, O) — every state computed by the device kernels.

Used two ways:

* by the docs build: ``docs/textbook/2-online.md`` and ``5-flashattention.md`` hold the
  walks written into their Markdown (``<!-- computed: walk.softmax -->`` …), and
  ``computed.py`` recomputes them — on the build machine's GPU or, without one, on the
  CUDA simulator (``conf.py`` decides) — and fails the build if a number moved;
* as a script on a GPU, to commit that device's walk beside the benchmarks::

      python docs/_ext/walk.py --out docs/benchmarks     # writes walk-<device>.txt

Nothing is typed by hand: the chunk states come from ``kernels.softmax.fold.chunk_states``, the
running states from ``kernels.softmax.fold.fold_tree`` (the compiled combiner), the tile states
from the attention kernel run with one key tile per split; the host only formats them,
and checks that every printed equation holds (the build fails if one does not).
"""

import argparse
import datetime
import math
import os
import re
import sys

import numpy as np

F32 = np.float32
SEED = 0  # the tour's row (numba-softmax tour, part 1)
N, CHUNK = 16, 4
ATT_SEED, ATT_SK, ATT_D, ATT_BC = 7, 37, 4, 8


def _f(v, digits):
    v = float(v)
    if v == -math.inf:
        return "−∞"
    return f"{v:.{digits}f}".replace("-", "−")


def _vec(values, digits=3):
    return "[" + ", ".join(_f(v, digits) for v in values) + "]"


def where():
    """Where the kernels run: the device's name, or the simulator."""
    from numba import cuda

    from numba_softmax.runtime.sim import simulator_enabled

    if simulator_enabled():
        return "the CUDA simulator"
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else name


def _running_states(m_c, l_c):
    """The running state after each chunk, folded on the device: slots 0…C−1 hold the chunk
    states, slots C…2C−1 start as the identity; R_k ← R_k ⊕ R_{k−1} (an exact copy: the
    identity weighs 0), then R_k ← R_k ⊕ c_k, so R_k = R_{k−1} ⊕ c_k as the online pass
    forms it."""
    from numba import cuda

    from numba_softmax.kernels.softmax import fold

    c = m_c.shape[0]
    m = np.concatenate([m_c, np.full(c, -np.inf, F32)])[None, :]
    l = np.concatenate([l_c, np.zeros(c, F32)])[None, :]
    merges = [(c, 0)]
    for k in range(1, c):
        merges += [(c + k, c + k - 1), (c + k, k)]
    m_d, l_d = cuda.to_device(m), cuda.to_device(l)
    fold.fold_tree(m_d, l_d, merges, 2 * c - 1)
    return m_d.copy_to_host()[0, c:], l_d.copy_to_host()[0, c:]


def _close(a, b, rel=2e-6):
    return abs(float(a) - float(b)) <= rel * max(1.0, abs(float(b)))


def softmax_walk():
    """The softmax walk as Markdown (and the numbers, for the tests)."""
    from numba import cuda

    import numba_softmax as ns
    from numba_softmax import reference as R
    from numba_softmax.combine import weight
    from numba_softmax.kernels.softmax import fold

    x = (np.random.default_rng(SEED).standard_normal(N) * 3).astype(F32)
    cuts = list(range(CHUNK, N, CHUNK))
    m_c, l_c = fold.chunk_states(cuda.to_device(x[None, :]), cuts)  # every chunk's (m̃, ℓ̃)
    m_c, l_c = m_c.copy_to_host()[0], l_c.copy_to_host()[0]
    run_m, run_l = _running_states(m_c, l_c)
    # inside chunk 1, value by value: row k keeps the first k+1 values, the rest −inf
    inside = np.full((CHUNK, CHUNK), -np.inf, F32)
    for k in range(CHUNK):
        inside[k, : k + 1] = x[CHUNK : CHUNK + k + 1]
    pm, pl = fold.chunk_states(cuda.to_device(inside), [])
    pm, pl = pm.copy_to_host()[:, 0], pl.copy_to_host()[:, 0]

    lines = ["```text"]
    m_old, l_old = -math.inf, 0.0
    for c in range(len(m_c)):
        vals = x[c * CHUNK : (c + 1) * CHUNK]
        lines.append(f"chunk {c}  x = {_vec(vals)}")
        lines.append(f"         chunk state (m̃, ℓ̃) = ({_f(m_c[c], 3)}, {_f(l_c[c], 4)})")
        m, l = run_m[c], run_l[c]
        if c == 0:
            lines.append(f"         running = (−∞, 0) ⊕ (m̃, ℓ̃) = ({_f(m, 3)}, {_f(l, 4)})"
                         "      the identity weighs exactly 0")
        else:
            a, b = weight(float(m_old), float(m)), weight(float(m_c[c]), float(m))
            assert _close(l_old * a + l_c[c] * b, l), (c, l_old, a, l_c[c], b, l)
            lines.append(f"         m = max({_f(m_old, 3)}, {_f(m_c[c], 3)}) = {_f(m, 3)}")
            lines.append(f"         ℓ = {_f(l_old, 4)}·e^({_f(m_old, 3)} − {_f(m, 3)}) + "
                         f"{_f(l_c[c], 4)}·e^({_f(m_c[c], 3)} − {_f(m, 3)})")
            lines.append(f"           = {_f(l_old, 4)}·{_f(a, 4)} + {_f(l_c[c], 4)}·{_f(b, 4)}"
                         f" = {_f(l, 4)}")
        m_old, l_old = m, l
    lines.append("```")
    walk = "\n".join(lines)

    steps = ["```text"]
    for k in range(CHUNK):
        xv = x[CHUNK + k]
        if k == 0:
            steps.append(f"x = {_f(xv, 3):>6}   (m, ℓ) = (−∞, 0) ⊕ (x, 1) = ({_f(pm[0], 3)}, "
                         f"{_f(pl[0], 4)})")
            continue
        a = weight(float(pm[k - 1]), float(pm[k]))
        b = weight(float(xv), float(pm[k]))
        assert _close(pl[k - 1] * a + b, pl[k])
        steps.append(f"x = {_f(xv, 3):>6}   m = {_f(pm[k], 3)},  ℓ = {_f(pl[k - 1], 4)}·"
                     f"e^({_f(pm[k - 1], 3)} − {_f(pm[k], 3)}) + e^({_f(xv, 3)} − {_f(pm[k], 3)})"
                     f" = {_f(pl[k], 4)}")
    steps.append("```")
    assert pm[-1] == m_c[1] and pl[-1] == l_c[1]  # the same kernel, the same chunk

    m, l = run_m[-1], run_l[-1]
    x64 = x.astype(np.float64)
    ref_p, ref_lse = R.softmax(x64), float(R.logsumexp(x64))
    assert m == x.max()  # the max is exact, whatever the order
    p = np.exp(x64 - float(m)) / float(l)
    kernel_p = ns.softmax(cuda.to_device(x[None, :]), method="online").copy_to_host()[0]
    kernel_lse = float(ns.logsumexp(cuda.to_device(x[None, :])).copy_to_host()[0])
    lse = float(m) + math.log(float(l))
    err_p, err_k = float(np.abs(p - ref_p).max()), float(np.abs(kernel_p - ref_p).max())
    assert err_p < 1e-6 and err_k < 1e-6 and abs(lse - ref_lse) < 1e-5
    result = [
        "| | the walk (device states) | float64, the whole row at once |",
        "|---|---|---|",
        f"| $m$ | {_f(m, 6)} | max = {_f(x64.max(), 6)} |",
        f"| $\\ell$ | {_f(l, 6)} | Σ exp(x − max) = {_f(np.exp(x64 - x64.max()).sum(), 6)} |",
        f"| LSE $= m + \\log \\ell$ | {_f(lse, 6)} (kernel `logsumexp`: {_f(kernel_lse, 6)}) "
        f"| {_f(ref_lse, 6)} |",
        f"| max $\\lvert p - p_{{64}}\\rvert$ | {err_p:.1e} (kernel `online`: {err_k:.1e}) | 0 |",
    ]
    return {
        "x": x, "chunk_m": m_c, "chunk_l": l_c, "run_m": run_m, "run_l": run_l,
        "table": "\n".join([
            f"The row ({N} float32 values, chunks of {CHUNK}) and each chunk folded into the "
            "running state:", "", walk, "",
            "Inside one chunk the device streams value by value, "
            "$(m, \\ell) \\leftarrow (m, \\ell) \\oplus (x, 1)$ — here chunk 1:", "",
            "\n".join(steps), "",
            "The result: $p_i = e^{x_i - m}/\\ell$ =", "", "```text", _vec(p[: N // 2], 4),
            _vec(p[N // 2 :], 4), "```", "",
            "\n".join(result)]),
    }


def attention_walk():
    """The attention walk (one query row over the key tiles) as Markdown, and its numbers."""
    from numba import cuda

    from numba_softmax import reference as R
    from numba_softmax.runtime.sim import simulator_enabled
    from numba_softmax.combine import combine_output_np, weight
    from numba_softmax.kernels.attention import attention

    rng = np.random.default_rng(ATT_SEED)
    q = (2 * rng.standard_normal((1, 1, 1, ATT_D))).astype(F32)
    k = rng.standard_normal((1, 1, ATT_SK, ATT_D)).astype(F32)
    v = rng.standard_normal((1, 1, ATT_SK, ATT_D)).astype(F32)
    scale = 1.0 / math.sqrt(ATT_D)
    tiles = -(-ATT_SK // ATT_BC)
    small = simulator_enabled()
    qd, kd, vd = (cuda.to_device(a) for a in (q, k, v))
    # one key tile per split: the kernel writes each tile's own normalised (O_z, LSE_z)
    o_ws = cuda.device_array((tiles, 1, 1, ATT_D), F32)
    lse_ws = cuda.device_array((tiles, 1, 1), F32)
    attention.launch(qd, kd, vd, o_ws, lse_ws, block_q=4, block_k=ATT_BC, kv_chunk=ATT_BC,
                     small=small)
    o_z, lse_z = o_ws.copy_to_host()[:, 0, 0], lse_ws.copy_to_host()[:, 0, 0]
    # and the whole row in one launch: the kernel's own loop over the tiles
    o_d = cuda.device_array((1, 1, 1, ATT_D), F32)
    lse_d = cuda.device_array((1, 1, 1), F32)
    attention.launch(qd, kd, vd, o_d, lse_d, block_q=4, block_k=ATT_BC, small=small)
    o_full, lse_full = o_d.copy_to_host()[0, 0, 0], float(lse_d.copy_to_host()[0, 0, 0])

    s = scale * (k[0, 0].astype(np.float64) @ q[0, 0, 0].astype(np.float64))
    rows = ["| keys | $\\tilde m$ | $\\tilde\\ell$ | $\\alpha = e^{m - m'}$ | "
            "$\\beta = e^{\\tilde m - m'}$ | $m'$ | $\\ell' = \\alpha\\ell + \\beta\\tilde\\ell$ | "
            "$O' = \\alpha O + \\beta \\tilde O$ |", "|---|---|---|---|---|---|---|---|"]
    m, l, o = -math.inf, 0.0, np.zeros(ATT_D)
    for z in range(tiles):
        lo, hi = z * ATT_BC, min(ATT_SK, (z + 1) * ATT_BC)
        mt = float(s[lo:hi].max())  # the tile's max score
        lt = math.exp(float(lse_z[z]) - mt)  # its ℓ̃ = Σ e^(s − m̃), from the device's LSE_z
        ot = lt * o_z[z].astype(np.float64)  # its Õ = Σ e^(s − m̃)·v, from the device's O_z
        m_new = max(m, mt)
        a, b = weight(m, m_new), weight(mt, m_new)
        m2, l2, o2 = combine_output_np(m, l, o, mt, lt, ot)
        assert m2 == m_new and _close(a * l + b * lt, l2, 1e-12)
        rows.append(f"| {lo}–{hi - 1} | {_f(mt, 3)} | {_f(lt, 4)} | {_f(a, 4)} | {_f(b, 4)} | "
                    f"{_f(m_new, 3)} | {_f(l2, 4)} | {_vec(o2, 3)} |")
        m, l, o = float(m2), float(l2), o2
    out, lse = o / l, m + math.log(l)
    ref, ref_lse = R.attention(q[0, 0].astype(np.float64), k[0, 0].astype(np.float64),
                               v[0, 0].astype(np.float64), return_lse=True)
    ref, ref_lse = ref[0], float(ref_lse[0])
    assert np.abs(out - ref).max() < 1e-5 and np.abs(o_full - ref).max() < 1e-5
    assert abs(lse - ref_lse) < 1e-5 and abs(lse_full - ref_lse) < 1e-5
    result = [
        "| | $O/\\ell$ | LSE $= m + \\log\\ell$ |", "|---|---|---|",
        f"| the walk (device tile states, folded above) | {_vec(out, 4)} | {_f(lse, 5)} |",
        f"| the kernel over all {ATT_SK} keys in one launch | {_vec(o_full, 4)} | "
        f"{_f(lse_full, 5)} |",
        f"| float64, materialised | {_vec(ref, 4)} | {_f(ref_lse, 5)} |",
    ]
    return {
        "o": out, "lse": lse, "o_full": o_full,
        "table": "\n".join([
            f"One query row $q$ (D = {ATT_D}), {ATT_SK} keys in tiles of $B_c$ = {ATT_BC} "
            f"(the last one ragged), scale $1/\\sqrt{{D}}$; $q$ = {_vec(q[0, 0, 0], 3)}.", "",
            "\n".join(rows), "", "\n".join(result)]),
    }


def header():
    return f"This build ran them on **{where()}**."


def markdown():
    """Both walks, as one Markdown document (what the script writes)."""
    import numba
    import numba_softmax

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    return "\n\n".join([
        f"Computed on **{where()}** with `python docs/_ext/walk.py` ({stamp}; numba "
        f"{numba.__version__}, numba_softmax {numba_softmax.__version__}).",
        "**Softmax row.**", softmax_walk()["table"],
        "**Attention query row.**", attention_walk()["table"]]) + "\n"


def slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write walk-<device>.txt into this directory")
    args = parser.parse_args(argv)
    text = markdown()
    print(text)
    if args.out:
        path = os.path.join(args.out, f"walk-{slug(where())}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    main()
