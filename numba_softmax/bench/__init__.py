"""Benchmark: softmax, attention, decode, backward and top-k against PyTorch, CuPy, Triton.

Run it as ``numba-softmax bench`` or ``python -m numba_softmax.bench`` (``--help``):
``--quick`` (a subset of every section, a few minutes including JIT compilation), ``--only NAME[,NAME]`` (some sections), ``--out DIR``, ``--sim-smoke``
(tiny shapes, every code path, seconds: what the CUDA simulator runs), ``--crossovers``
(the table ``auto`` chooses by, measured and saved for this GPU: :mod:`.crossovers`).

Sections (:data:`cli.SECTIONS`, one module each; a section whose feature is not in this
checkout is skipped with a one-line note):

==================  ===============================================================
bounds              copy and read-only stream bandwidth (always first): the ceilings
softmax             the sweep (:mod:`.softmax`), with the Triton peers (:mod:`.triton_peers`)
attention           forward vs SDPA, same dtype (:mod:`.attention`)
decode              GQA decode vs SDPA dense decode, split-KV and paged (:mod:`.attention`)
backward            softmax / log_softmax backward vs torch (:mod:`.backward`)
attention_backward  vs SDPA backward (:mod:`.backward`)
topk                fused softmax + top-k vs torch.topk(torch.softmax) (:mod:`.topk`)
textbook            each rung of ``numba_softmax/textbook/`` (s1–s5, a1, a2, d1, b1, b2), by its
                    ``launch``, beside the fast kernel of the same algorithm at the same
                    shape: GB/s by both byte models, % copy or TFLOP/s, × textbook
                    (:mod:`.textbook`)
overhead            host time per call against the peers' calls, with its targets (:mod:`.overhead`)
crossovers          only when named (``--crossovers``): ``fused``, ``onchip``, ``cluster``,
                    ``group`` at rows of 16–160 KB; fits and saves ``auto``'s table
                    for this device (:mod:`.crossovers`)
==================  ===============================================================

How it measures (:mod:`.timing`, the one timer — the examples and the tour use it too):
**kernel** rows are CUDA events around each call on one stream, every call queued
behind a sleeping kernel so the host's launch overhead cannot leak into the times;
**call** rows are the host clock around the public call plus a synchronisation.  Warm-up
first (the first call compiles), median of at least 20 repeats, inputs rotated through
enough sets to span three times the L2.  Peers run on the same stream, timed the same way.

Sanity check (:mod:`.results`): a GB/s above 105 % of the copy measured in the same run
(of the read-only stream for read-mostly rows: decode, top-k, attention), or of the DRAM
peak, or a TFLOP/s above the device's dense peak, **stops the program** with a message
— such a figure is a measurement bug and is never printed as a result (exit status 3).

After the tables, ``== targets ==``: each speed target (softmax, backward, decode, top-k) judged on
this run's kernel rows — met, MISSED with the worst row, or not measured (:mod:`.targets`;
why each miss stands: ``docs/targets.md``).

Outputs in ``--out`` (default ``bench-out/``): ``results.txt`` (the tables and targets),
``results.csv`` and the plots ``softmax_gbps.png``, ``attention_tflops.png``,
``decode_gbps.png`` (with matplotlib).

CSV schema
----------
``#`` comment lines first: device, driver, versions, date, copy bandwidth, read
bandwidth, peaks, timing, mode (and the seconds per section).  Then one row per
measurement; empty cells where a column does not apply:

suite        bounds | softmax | attention | decode | backward | topk | textbook |
             overhead | crossovers
impl         method (three_pass, online, …, auto), ``numba_softmax``, ``split-KV``,
             ``paged``, or the peer (torch, torch.sdpa, cupy, triton tutorial, triton
             seed001, torch.backward, torch.topk(softmax)); overhead: the call;
             textbook: ``textbook s3`` (a rung), ``fast online`` (its fast kernel)
level        kernel (CUDA events) | call (host clock + synchronisation)
array        the array kind the call was given: numba | torch | cupy
dtype        float32 | float16 | bfloat16 (crossovers: float64 too)
median_ms    median time of one call, ms (overhead: host time per call)
min_ms       fastest repeat, ms
reps         timed repeats (overhead: loops × calls)
M, N         softmax rows × row length (top-k: B × V)
B, H, Hkv    batch, query heads, key/value heads (GQA; empty = H)
Sq, Sk, D    query rows, keys (decode: context), head dimension
causal       True | False
splits       split-KV ranges;  page: paged-cache block size;  k: top-k
bytes        compulsory bytes: every input read once, every output written once
             (backward: y, dy, dx; decode: the KV cache read; top-k: the logits read)
flops        attention: 4·B·H·Sq·Sk·D, halved causal; backward 2.5× that
gbps         bytes / median time, 10⁹ B/s
pct_copy     gbps as % of the copy bandwidth of this run
bound        copy | read | peak: the ceiling pct_bound divides by
pct_bound    % of that ceiling (read: the read-only stream; peak: dense TFLOP/s)
model_bytes  bytes the method really moves by its own traffic model (softmax:
             three_pass 4 passes of M·N·b, online and split 3, fused and onchip 2;
             textbook: the rung's, as its docstring counts them)
pct_model    model_bytes / time as % of copy: % of the method's own bound
tflops       flops / median time, 10¹² /s
x_torch      the torch peer's time / this row's (same problem, level and dtype; > 1 faster)
base         overhead: the call this row is held to (torch.softmax(x), sdpa(q, q, q), or
             the allocating call for an out= row); textbook: a fast row's rung;
             base_ms: its time
x_base       this row's time / base_ms (textbook's "× textbook" column: base_ms / time)
target       pass | FAIL: the overhead target (≤ 2× base; out=: GB/s within 5 %)
goal         pass | miss: the overhead goal (≤ 1.5× base)
note         auto's choice, "host-bound", fewer repeats, SDPA without GQA …
"""

from .cli import SECTIONS, main, parse_args

__all__ = ["SECTIONS", "main", "parse_args"]
