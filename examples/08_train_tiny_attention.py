"""08 — training through the package's backward: a tiny attention model, two ways, one loss curve.

The model: tokens → embedding → one causal self-attention layer (H heads) → output
projection → log_softmax over the vocabulary → the negative log-likelihood of the next
token.  Two copies start from the same weights and see the same batches:

    ours    numba_softmax.torch.attention and numba_softmax.torch.log_softmax — custom ops
            whose backward runs this package's kernels (FlashAttention-2 backward from the
            saved LSE; the softmax backward's one-pass row kernel);
    torch   F.scaled_dot_product_attention and F.log_softmax.

Each step runs forward, ``loss.backward()`` and an Adam update on both; the table shows
the two losses side by side and how far apart they are, and at the end the largest
difference between the two models' weights.  In float32 they agree to about 1e-5: the
same mathematics, summed in a different order (and dQ with atomic adds).

    python examples/08_train_tiny_attention.py          # on the GPU (needs PyTorch)
    python examples/08_train_tiny_attention.py --sim    # says it needs a CUDA GPU
"""

import sys

import _common  # first: reads --sim and switches the simulator on before numba loads


def make_model(torch, vocab, embed, heads, attention, log_softmax):
    """The tiny model, as a module whose forward uses the given ops."""
    F = torch.nn.functional

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, embed)
            self.qkv = torch.nn.Linear(embed, 3 * embed)
            self.proj = torch.nn.Linear(embed, vocab)

        def forward(self, tokens, targets):
            b, s = tokens.shape
            x = self.embed(tokens)
            q, k, v = self.qkv(x).view(b, s, 3, heads, -1).permute(2, 0, 3, 1, 4)  # (B, H, S, D)
            o = attention(q, k, v).transpose(1, 2).reshape(b, s, -1)
            logp = log_softmax(self.proj(x + o), -1)  # a residual, then the vocabulary
            return F.nll_loss(logp.reshape(b * s, -1), targets.reshape(-1))

    return Tiny()


def batches(torch, steps, batch, seq, vocab, device):
    """Sequences that count up modulo the vocabulary from a random start (learnable), as
    (tokens, next tokens)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        seqs = (start + torch.arange(seq + 1)) % vocab
        yield seqs[:, :-1].to(device), seqs[:, 1:].to(device)


def main(argv=None):
    def options(parser):
        parser.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
        parser.add_argument("--seq", type=int, default=64, help="sequence length (default 64)")

    args = _common.parse(__doc__, options, argv)
    if args.sim:
        print("This example trains with PyTorch CUDA tensors: it needs a CUDA GPU "
              "(the simulator has no PyTorch interop). Nothing to do with --sim.")
        return 0
    try:
        import torch
    except ImportError:
        print("This example needs PyTorch (with CUDA).")
        return 0
    if not torch.cuda.is_available():
        print("This example needs a CUDA GPU visible to PyTorch.")
        return 0
    import numba_softmax.torch as nst

    F = torch.nn.functional
    vocab, embed, heads, batch = 32, 64, 4, 8
    torch.manual_seed(0)
    ours = make_model(torch, vocab, embed, heads, lambda q, k, v: nst.attention(q, k, v, causal=True),
                      nst.log_softmax).cuda()
    theirs = make_model(torch, vocab, embed, heads,
                        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                        F.log_softmax).cuda()
    theirs.load_state_dict(ours.state_dict())  # the same starting weights
    opts = [torch.optim.Adam(m.parameters(), lr=3e-3) for m in (ours, theirs)]
    print(f"device: {_common.device_name(False)};  vocabulary {vocab}, embedding {embed}, "
          f"{heads} heads, batch {batch} × {args.seq} tokens, float32, causal")

    rows = []
    for step, (tokens, targets) in enumerate(batches(torch, args.steps, batch, args.seq, vocab, "cuda")):
        losses = []
        for model, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            loss = model(tokens, targets)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
            rows.append((step, losses[0], losses[1], abs(losses[0] - losses[1])))
    _common.table("Training loss, numba_softmax.torch ops vs PyTorch's",
                  ["step", "loss (ours)", "loss (torch)", "|difference|"], rows,
                  ["d", ".6f", ".6f", ".1e"])
    drift = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters()))
    worst = max(r[3] for r in rows)
    print(f"\nlargest weight difference after {args.steps} steps: {drift:.1e}")
    print(f"largest loss difference: {worst:.1e} ({'match' if worst < 1e-3 else 'MISMATCH'})")
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
