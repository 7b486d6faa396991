"""Pure NumPy references: one function per algorithm in the sources, float64 by default.

They are the oracles of the tests and the twins of the kernels; read a kernel and its
reference side by side.
"""

from .attention import (
    attention,
    attention_varlen,
    flash_attention,
    merge_attention,
    scores,
    split_kv_attention,
    update_out_and_lse,
    visible,
)
from .backward import attention_backward, log_softmax_backward, softmax_backward
from .paged import append_kv, gather_kv, paged_attention
from .softmax import (
    chunk_softmax,
    log_softmax,
    logsumexp,
    merge_chunks,
    merge_chunks_lse,
    naive_softmax,
    online_softmax,
    online_state,
    softmax,
)

__all__ = [
    "naive_softmax",
    "softmax",
    "log_softmax",
    "logsumexp",
    "online_state",
    "online_softmax",
    "chunk_softmax",
    "merge_chunks",
    "merge_chunks_lse",
    "update_out_and_lse",
    "attention",
    "attention_varlen",
    "paged_attention",
    "gather_kv",
    "append_kv",
    "flash_attention",
    "split_kv_attention",
    "merge_attention",
    "visible",
    "scores",
    "softmax_backward",
    "log_softmax_backward",
    "attention_backward",
]
