"""Two Triton softmax kernels the benchmark runs beside ours (imported only if Triton is).

* :func:`tutorial` — Triton's "fused softmax" tutorial kernel (``02-fused-softmax.py``,
  the classic form: one program per row, the whole row in one block of
  ``next_power_of_2(N)`` values, ``num_warps`` 4/8/16 by block size).  Moves 2·M·N·b
  (read once, write once); rows longer than :data:`TUTORIAL_MAX_N` do not fit and are
  not run (the tutorial's own limit: the row must fit in registers / SRAM).
* :func:`seed001` — the two-pass online-softmax kernel of seed 001
  (``../shared/sources/001_*``): one program per row, ``BLOCK_SIZE`` 1024, pass 1 folds
  (m, d) over the row's chunks, pass 2 re-reads the row and writes exp(x − m)/d.
  Moves 3·M·N·b (read twice, write once).

Both are the sources' code with one change: values are converted to float32 after
loading (``tl.exp`` takes float32), so float16 / bfloat16 inputs run too — accumulated
in float32 like ours; ``tl.store`` converts back to the output's dtype.  Both take a
preallocated output (the benchmark times kernels, not allocation); ``y`` may be None.
"""

import triton
import triton.language as tl

# (torch is imported by the host functions: the kernels themselves compile without it,
# as ``scripts/sass_path.py`` compiles the tutorial's for its instruction count)

TUTORIAL_MAX_N = 32768
SEED001_BLOCK = 1024
TRAFFIC = {"triton tutorial": 2, "triton seed001": 3}  # passes over M·N·b, as results.TRAFFIC


@triton.jit
def _tutorial_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_cols,
                     BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0)
    row_start_ptr = input_ptr + row_idx * input_row_stride
    col_offsets = tl.arange(0, BLOCK_SIZE)
    input_ptrs = row_start_ptr + col_offsets
    # the row into SRAM (masked: BLOCK_SIZE may exceed n_cols)
    row = tl.load(input_ptrs, mask=col_offsets < n_cols, other=-float("inf")).to(tl.float32)
    row_minus_max = row - tl.max(row, axis=0)  # subtract the max for stability
    numerator = tl.exp(row_minus_max)
    denominator = tl.sum(numerator, axis=0)
    softmax_output = numerator / denominator
    output_ptrs = output_ptr + row_idx * output_row_stride + col_offsets
    tl.store(output_ptrs, softmax_output, mask=col_offsets < n_cols)


def tutorial(x, y=None):
    """The tutorial's host function: y = softmax(x) over rows of a 2-D CUDA tensor."""
    n_rows, n_cols = x.shape
    if n_cols > TUTORIAL_MAX_N:
        raise ValueError(f"the Triton tutorial kernel holds a whole row on chip; "
                         f"{n_cols} values do not fit (at most {TUTORIAL_MAX_N} here)")
    import torch

    block_size = triton.next_power_of_2(n_cols)
    y = torch.empty_like(x) if y is None else y
    _tutorial_kernel[(n_rows,)](y, x, x.stride(0), y.stride(0), n_cols,
                                num_warps=tutorial_warps(block_size), BLOCK_SIZE=block_size)
    return y


def tutorial_warps(block_size):
    """The tutorial's warps a program for a row padded to ``block_size`` values."""
    return 16 if block_size >= 4096 else 8 if block_size >= 2048 else 4


@triton.jit
def _seed001_kernel(output_ptr, input_ptr, input_row_stride, output_row_stride, n_rows, n_cols,
                    BLOCK_SIZE: tl.constexpr):
    row_idx = tl.program_id(0)
    row_in = input_ptr + row_idx * input_row_stride
    row_out = output_ptr + row_idx * output_row_stride

    # pass 1: accumulate (m, d) over chunks
    m = float("-inf")
    d = 0.0
    for block_start in range(0, n_cols, BLOCK_SIZE):
        cols = block_start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(row_in + cols, mask=mask, other=float("-inf")).to(tl.float32)
        block_m = tl.max(x, axis=0)
        m_new = tl.maximum(m, block_m)
        # rescale the running denominator, add this block's contribution
        d = d * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new

    # pass 2: normalise
    for block_start in range(0, n_cols, BLOCK_SIZE):
        cols = block_start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        x = tl.load(row_in + cols, mask=mask, other=0.0).to(tl.float32)
        y = tl.exp(x - m) / d
        tl.store(row_out + cols, y, mask=mask)


def seed001(x, y=None):
    """Seed 001's ``online_softmax``: one program per row, BLOCK_SIZE 1024."""
    import torch

    n_rows, n_cols = x.shape
    y = torch.empty_like(x) if y is None else y
    _seed001_kernel[(n_rows,)](y, x, x.stride(0), y.stride(0), n_rows, n_cols,
                               BLOCK_SIZE=SEED001_BLOCK)
    return y


PEERS = {"triton tutorial": tutorial, "triton seed001": seed001}
