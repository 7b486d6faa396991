"""Attention for Hugging Face transformers models, served by the package's kernels.

transformers calls one function per attention layer, ``fn(module, q, k, v, mask, **kw)``,
with q (B, Hq, Sq, D) and k, v (B, Hkv, Sk, D) taken after the cache update, and wants
``(O, weights)`` back with O laid out (B, Sq, Hq, D).  What a decoder asks of it maps onto
:func:`numba_softmax.torch.attention` (a differentiable custom op): causal attention aligned
bottom-right (prefill, and decoding over the cache: Sq = 1 or a chunk, Sq < Sk), grouped
query heads read in place (Hkv divides Hq, K and V never expanded), the module's
``scaling``, sliding windows and logit soft-capping (Gemma 2's ``softcap``).  What does
not map is refused by name: dropout, a position bias, and masks beyond causal + window —
a padded batch among them.

    from numba_softmax.integrations import transformers as nst_hf
    nst_hf.register()                                   # once; imports transformers
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="numba_softmax")

:func:`register` names both the attention function and a mask function (transformers'
own ``sdpa_mask``): the mask then is None wherever plain causal attention is meant, and a
boolean mask otherwise, which :func:`attention_forward` reads to find the keys the whole
batch sees.  Importing this module imports neither torch nor transformers.
"""

__all__ = ["register", "attention_forward"]


def register(name="numba_softmax"):
    """Make ``name`` an attention implementation of transformers (``attn_implementation=
    name`` or ``model.set_attn_implementation(name)``); returns ``name``."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    if not name or name in ("eager", "sdpa") or name.startswith(("flash_", "flex_", "paged")):
        raise ValueError(f"name must be new to transformers, got {name!r}")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    # sdpa's masks: None for plain causal attention, so that padding can be told apart
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, sliding_window=None, softcap=None, **kwargs):
    """transformers' attention-function contract, on :func:`numba_softmax.torch.attention`.

    Returns ``(O, None)``: O (B, Sq, Hq, Dv), contiguous, as ``sdpa_attention_forward``."""
    from .. import torch as nst

    if dropout:
        raise ValueError(f"dropout={dropout}: numba_softmax's attention has no dropout; set the "
                         f"model's attention_dropout to 0 to train with it")
    if kwargs.get("position_bias") is not None:
        raise ValueError("position_bias: numba_softmax's attention adds no bias to the scores")
    if query.device.type != "cuda" and not _simulating():
        raise ValueError(f"query: numba_softmax serves CUDA tensors, got {query.device.type} "
                         f"(CPU tensors only on the CUDA simulator)")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    window = _window(getattr(module, "sliding_window", None) if sliding_window is None
                     else sliding_window, causal)
    first, end = _keys_seen(attention_mask, query.shape[2], key.shape[2], causal, window)
    if (first, end) != (0, key.shape[2]):  # keys no query sees: a static cache's empty slots
        key, value = key[:, :, first:end], value[:, :, first:end]
    o = nst.attention(query, key, value, causal=causal, scale=scaling, window=window,
                      softcap=softcap)
    return o.transpose(1, 2).contiguous(), None


def _simulating():
    from ..runtime.sim import simulator_enabled

    return simulator_enabled()


def _window(size, causal):
    """transformers' ``sliding_window`` W as the package's (left, right): causally a query
    sees itself and the W − 1 keys before it; bidirectionally keys within distance W."""
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"sliding_window must be None or an integer >= 1, got {size!r}")
    return (size - 1, 0) if causal else (size, size)


def _pattern(sq, sk, causal, window, device):
    """The (Sq, Sk) boolean pattern the kernel applies: bottom-right causal and window."""
    import torch

    offset = torch.arange(sk, device=device)[None, :] - (torch.arange(sq, device=device)[:, None]
                                                         + sk - sq)
    seen = torch.ones(sq, sk, dtype=torch.bool, device=device)
    left, right = window if window is not None else (-1, -1)
    if causal or right >= 0:
        seen &= offset <= (0 if causal else right)
    if left >= 0:
        seen &= offset >= -left
    return seen


def _keys_seen(mask, sq, sk, causal, window):
    """The keys [first, end) to attend to, found from transformers' mask: all of them for
    no mask (or, for a causal prefill longer than the queries, the first Sq: an empty
    static cache, as sdpa reads it); for a boolean (B, H, Sq, Sk) mask, one contiguous range
    every row of the batch sees, inside which the mask must be the kernel's own pattern.
    Anything else — a padded batch, a custom pattern — is a ``ValueError``."""
    import torch

    if mask is None:
        return (0, sq) if causal and 1 < sq < sk else (0, sk)
    keep = mask if mask.dtype == torch.bool else mask == 0  # an additive mask: 0 where kept
    if keep.dim() != 4 or keep.shape[-2:] != (sq, sk):
        raise ValueError(f"attention_mask: expected a (batch, heads, {sq}, {sk}) mask, got "
                         f"shape {tuple(keep.shape)}")
    seen = keep.any(dim=-2).flatten(0, 1)  # (B·H, Sk): the keys some query of a row sees
    index = torch.nonzero(seen[0]).flatten()
    first, end = (int(index[0]), int(index[-1]) + 1) if index.numel() else (0, 0)
    if end > first and torch.equal(seen, seen[:1].expand_as(seen)) and \
            torch.equal(keep[..., first:end],
                        _pattern(sq, end - first, causal, window, keep.device).expand(
                            keep.shape[:2] + (sq, end - first))):
        return first, end
    raise ValueError("attention_mask: the rows of this batch see different keys (a padded "
                     "batch) or a pattern other than causal + sliding window; numba_softmax's "
                     "transformers adapter serves batches whose sequences have one length — "
                     "run padded sequences one by one, or with attn_implementation='sdpa'")
