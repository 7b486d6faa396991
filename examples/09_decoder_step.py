"""09 — one decoder step: the k most probable next tokens, then one token drawn per sequence.

A language model's last layer gives, for each of B sequences, V logits (one per token of
the vocabulary).  Picking the next token takes three steps that this package fuses into
one read of the logits (Milakov & Gimelshein's softmax + top-k):

    softmax_topk(logits, k, temperature=T)   the k largest of softmax(logits / T) and
                                             their token ids — what a beam search or a
                                             "top-5 candidates" display needs
    sample(logits, top_k=k, top_p=p, ...)    one token per sequence from the top-k set,
                                             renormalised, cut to its smallest prefix of
                                             mass ≥ p; reproducible from ``seed``
    sample(logits, top_k=None)               from the whole vocabulary, in one pass
                                             (the Gumbel-max trick)

The first table shows the top-k of a few sequences against the float64 NumPy reference;
the second checks that the drawn tokens are those the NumPy twin draws from the same seed,
and that their frequencies over many identical sequences fit the exact distribution.
On a GPU a third table times the step against ``torch.topk(torch.softmax(x / T), k)``.

    python examples/09_decoder_step.py          # on the GPU
    python examples/09_decoder_step.py --sim    # on the CUDA simulator
"""

import sys

import numpy as np

import _common  # first: reads --sim and switches the simulator on before numba loads

from numba_softmax.reference import topk as RT
from numba_softmax.topk import sample, softmax_topk

SHOWN = 2  # sequences printed in the first table


def main(argv=None):
    def options(parser):
        parser.add_argument("--batch", type=int, default=None, help="sequences (default 2 / 64)")
        parser.add_argument("--vocab", type=int, default=None, help="V (default 50 / 128256)")
        parser.add_argument("--k", type=int, default=None, help="top-k (default 4 / 50)")
        parser.add_argument("--top-p", type=float, default=0.9, help="nucleus mass (default 0.9)")
        parser.add_argument("--temperature", type=float, default=0.8)
        parser.add_argument("--seed", type=int, default=0)

    args = _common.parse(__doc__, options, argv)
    B = args.batch or _common.pick(args, 2, 64)
    V = args.vocab or _common.pick(args, 50, 128256)
    k = args.k or _common.pick(args, 4, 50)
    T, p, seed = args.temperature, args.top_p, args.seed
    print(f"device: {_common.device_name(args.sim)};  {B} sequences, V = {V}, k = {k}, "
          f"T = {T}, top-p = {p}, seed = {seed}, float32 logits")

    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((B, V)) * 2).astype(np.float32)

    # 1. the k most probable tokens of each sequence
    values, tokens = softmax_topk(logits, k, temperature=T)
    ref_values, ref_tokens = RT.softmax_topk(logits.astype(np.float64), k, temperature=T)
    rows = [(b, r, int(tokens[b, r]), float(values[b, r]), abs(float(values[b, r] - ref_values[b, r])))
            for b in range(min(B, SHOWN)) for r in range(min(k, 5))]
    _common.table("Top-k of softmax(logits / T): the most probable next tokens",
                  ["sequence", "rank", "token", "probability", "|p − p_fp64|"], rows,
                  ["d", "d", "d", ".4f", ".1e"])
    same_ids = bool((tokens == ref_tokens).all())

    # 2. one token per sequence, and the frequencies of many identical draws
    draws = []
    for name, top_k, top_p in (("top-k, top-p", k, p), ("whole vocabulary", None, 1.0)):
        got = sample(logits, top_k=top_k, top_p=top_p, temperature=T, seed=seed)
        twin = RT.sample(logits, top_k, top_p, T, seed)
        n = _common.pick(args, 8, 100_000)
        many = np.tile(logits[0, :8], (n, 1))  # 8 tokens, n identical sequences
        counts = np.bincount(sample(many, top_k=top_k and min(top_k, 8), top_p=top_p,
                                    temperature=T, seed=seed + 1), minlength=8)
        exact = RT.sample_probabilities(many[0], top_k and min(top_k, 8), top_p, T)
        tv = 0.5 * float(np.abs(counts / n - exact).sum())
        draws.append((name, " ".join(map(str, got[:4])), f"{int((got == twin).sum())}/{B}", n, tv,
                      float(np.sqrt(len(exact) / n))))
    _common.table("sample(): one token per sequence, reproducible from the seed",
                  ["set", "first tokens", "= NumPy twin", "draws of 8 tokens", "TV distance",
                   "≈ noise"], draws, ["", "", "", "d", ".3f", ".3f"])

    if not args.sim:
        timing(logits, k, T)
    print()
    print("Token ids of the top-k equal the float64 reference:", "yes" if same_ids else "no")
    if args.sim:
        print("On the simulator the draws are few (a warp per sequence, in Python threads).")
    ok = same_ids and all(d[2] == f"{B}/{B}" for d in draws)
    return 0 if ok else 1


def timing(logits, k, T):
    """Kernel time of softmax_topk and sample against torch (when installed)."""
    try:
        import torch
    except ImportError:
        return
    from numba import cuda

    from numba_softmax.kernels.topk import sample as S
    from numba_softmax.kernels.topk import topk as K

    x = cuda.to_device(logits)
    values = cuda.device_array((logits.shape[0], k), np.float32)
    ids = cuda.device_array((logits.shape[0], k), np.int64)
    tokens = cuda.device_array(logits.shape[0], np.int64)
    xt = torch.from_numpy(logits).cuda()
    rows = []
    for name, fn in (("softmax_topk (fused)", lambda: K.launch(x, k, values, ids, temperature=T)),
                     ("sample top-k/top-p", lambda: S.launch(x, tokens, top_k=k, top_p=0.9,
                                                              temperature=T)),
                     ("sample whole vocabulary", lambda: S.launch(x, tokens, top_k=None,
                                                                   temperature=T)),
                     ("torch topk(softmax(x / T))", lambda: torch.topk(torch.softmax(xt / T, -1), k))):
        t = _common.seconds(fn, False, warmup=3, repeat=20, inner=10)
        rows.append((name, t * 1e6, logits.nbytes / t / 1e9))
    _common.table("Kernel time of one decoder step", ["step", "time µs", "GB/s (one read)"], rows,
                  ["", ".1f", ".0f"])


if __name__ == "__main__":
    sys.exit(main())
