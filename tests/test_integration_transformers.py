"""numba_softmax.integrations.transformers: a transformers model served by the package.

Everywhere (the CUDA simulator takes CPU float32 tensors): the refusals, each naming what
it refuses; the output's layout and values against PyTorch's SDPA for prefill, decoding,
a chunk over the cache, grouped heads, sliding windows and a static cache's empty slots;
a padded batch refused; a tiny Llama through ``attn_implementation="numba_softmax"``
against ``"sdpa"`` — logits, greedy tokens over its KV cache, every parameter's gradient.
On a GPU the same model at the issue's sizes: float32 and bfloat16, 32 greedy tokens.
Importing the module imports neither torch nor transformers (a subprocess).
"""

import copy
import subprocess
import sys

import numpy as np
import pytest

from _helpers import ROOT, SIMULATOR

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from numba_softmax.integrations import transformers as nst_hf  # noqa: E402

GPU = not SIMULATOR and torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
runs = pytest.mark.skipif(not (GPU or SIMULATOR), reason="needs a GPU or the CUDA simulator")
gpu_only = pytest.mark.skipif(not GPU, reason="GPU only: model sizes")


class Layer(torch.nn.Module):
    """What the attention function reads of a transformers attention module."""

    def __init__(self, sliding_window=None, is_causal=True):
        super().__init__()
        self.sliding_window, self.is_causal = sliding_window, is_causal


def qkv(b, hq, hkv, sq, sk, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, s, d, generator=g).to(DEVICE) for h, s in ((hq, sq), (hkv, sk), (hkv, sk))]


def sdpa(q, k, v, seen):
    """PyTorch's attention over K/V expanded to Q's heads, a boolean (Sq, Sk) pattern."""
    rep = q.shape[1] // k.shape[1]
    o = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=seen)
    return o.transpose(1, 2)


def bottom_right(sq, sk, window=None):
    """Query i sees key j iff j <= i + Sk − Sq (and, with a window W, j > i + Sk − Sq − W)."""
    offset = torch.arange(sk)[None, :] - (torch.arange(sq)[:, None] + sk - sq)
    seen = offset <= 0
    return (seen & (offset > -window) if window else seen).to(DEVICE)


def test_importing_the_module_imports_neither_torch_nor_transformers():
    code = ("import sys, numba_softmax.integrations.transformers as m; "
            "print(sorted({'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("kwargs, match", [
    (dict(softcap=-1.0), "softcap"),
    (dict(dropout=0.1), "dropout"),
    (dict(position_bias=torch.zeros(1)), "position_bias"),
    (dict(sliding_window=0), "sliding_window"),
])
def test_refusals_name_what_they_refuse(kwargs, match):
    q, k, v = (torch.zeros(1, 2, 3, 8, device=DEVICE) for _ in range(3))
    with pytest.raises(ValueError, match=match):
        nst_hf.attention_forward(Layer(), q, k, v, None, **kwargs)


def test_register_checks_its_name():
    with pytest.raises(TypeError, match="name"):
        nst_hf.register(3)
    with pytest.raises(ValueError, match="name"):
        nst_hf.register("sdpa")


@runs
@pytest.mark.parametrize("case", ["prefill", "decode", "chunk", "window", "static-cache"])
def test_matches_sdpa_with_its_layout(case):
    """O (B, Sq, Hq, D), contiguous, equal to SDPA's; the mask transformers passes is the
    one its sdpa_mask builds (None for plain causal attention)."""
    sq, sk, window, mask = {"prefill": (5, 5, None, False), "decode": (1, 7, None, False),
                            "chunk": (3, 7, None, True), "window": (4, 9, 3, True),
                            "static-cache": (1, 8, None, True)}[case]
    q, k, v = qkv(2, 4, 2, sq, sk)
    seen = bottom_right(sq, sk, window)
    used = sk
    if case == "static-cache":  # 5 tokens cached in 8 slots: the last 3 are empty
        used = 5
        seen = torch.zeros(sq, sk, dtype=torch.bool, device=DEVICE)
        seen[:, :used] = bottom_right(sq, used)
    attention_mask = seen.expand(2, 1, sq, sk) if mask else None
    o, weights = nst_hf.attention_forward(Layer(sliding_window=window), q, k, v, attention_mask,
                                          scaling=0.3)
    assert weights is None and o.shape == (2, sq, 4, 8) and o.is_contiguous()
    want = sdpa(q * 0.3 * 8 ** 0.5, k[:, :, :used], v[:, :, :used], seen[:, :used])
    torch.testing.assert_close(o, want, rtol=1e-5, atol=1e-5)


@runs
def test_a_padded_batch_is_refused():
    q, k, v = qkv(2, 4, 2, 4, 4)
    mask = bottom_right(4, 4).expand(2, 1, 4, 4).clone()
    mask[1, :, :, :2] = False  # the second sequence: two tokens of left padding
    with pytest.raises(ValueError, match="padded batch"):
        nst_hf.attention_forward(Layer(), q, k, v, mask)


def tiny_llama(dtype=torch.float32, hidden=None, layers=2, heads=4, kv_heads=2):
    """A seeded Llama with grouped-query heads: ours (numba_softmax) and a twin on sdpa."""
    nst_hf.register()
    hidden = hidden or (32 if SIMULATOR else 128)
    cfg = LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, max_position_embeddings=256)
    torch.manual_seed(0)
    ref = LlamaForCausalLM(copy.deepcopy(cfg)).to(DEVICE, dtype).eval()
    ours = LlamaForCausalLM(copy.deepcopy(cfg)).to(DEVICE, dtype).eval()  # own configs
    ours.load_state_dict(ref.state_dict())
    ref.set_attn_implementation("sdpa")
    ours.set_attn_implementation("numba_softmax")
    return ours, ref


def greedy(model, ids, n):
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                          do_sample=False, pad_token_id=0)


def gradients(model, ids):
    model.zero_grad()
    model.train()
    model(ids, labels=ids).loss.backward()
    model.eval()
    return {n: p.grad.float() for n, p in model.named_parameters()}


@runs
def test_a_model_takes_it_prefill_decoding_and_gradients():
    ours, ref = tiny_llama()
    n_prompt, n_new = (5, 3) if SIMULATOR else (24, 32)
    ids = torch.randint(1, 128, (1, n_prompt), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(greedy(ours, ids, n_new), greedy(ref, ids, n_new))
    mine, theirs = gradients(ours, ids), gradients(ref, ids)
    for name, g in theirs.items():
        err = (mine[name] - g).abs().max() / g.abs().max().clamp_min(1e-12)
        assert err < 1e-3, (name, err.item())


@gpu_only
def test_bfloat16_within_twice_sdpas_error():
    """Logits and gradients in bf16: ours no further from the fp32 reference than twice
    SDPA's own bf16 error; every gradient within 1e-2 of SDPA's, relative to its size."""
    ref32, _ = tiny_llama(torch.float32)
    ours, ref = tiny_llama(torch.bfloat16)
    ids = torch.randint(1, 128, (2, 64), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with torch.no_grad():
        want = ref32(ids).logits
        err_ours = (ours(ids).logits.float() - want).abs().max()
        err_sdpa = (ref(ids).logits.float() - want).abs().max()
    assert err_ours <= 2 * err_sdpa + 1e-3, (err_ours.item(), err_sdpa.item())
    mine, theirs = gradients(ours, ids), gradients(ref, ids)
    for name, g in theirs.items():
        err = (mine[name] - g).abs().max() / g.abs().max().clamp_min(1e-12)
        assert err < 1e-2, (name, err.item())


@gpu_only
def test_a_batch_of_equal_lengths_decodes_as_sdpa_does():
    ours, ref = tiny_llama()
    ids = torch.randint(1, 128, (4, 16), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    assert torch.equal(greedy(ours, ids, 32), greedy(ref, ids, 32))


@runs
def test_softcap_goes_through():
    """Gemma 2's logit soft-capping: the adapter hands ``softcap`` to the package's op;
    O equals the float64 reference with the same capping."""
    from numba_softmax import reference as R

    q, k, v = qkv(1, 2, 1, 5, 5)  # a prefill: with no mask, Sq < Sk reads as a static cache
    o, _ = nst_hf.attention_forward(Layer(), q, k, v, None, softcap=2.0)
    want = R.attention(*(t.detach().cpu().double().numpy() for t in (q, k, v)), causal=True,
                       softcap=2.0)
    np.testing.assert_allclose(o.transpose(1, 2).detach().cpu().double().numpy(), want,
                               rtol=1e-4, atol=1e-5)
