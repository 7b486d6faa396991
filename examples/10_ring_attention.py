"""10 — ring attention: one sequence over P GPUs, the K/V shards passed round a ring.

Each of P ranks keeps its shard of the queries and attends it to one K/V shard per step,
sending that shard on to the next rank while the kernel runs; each step's partial
(O, LSE) is folded into the running one with the combiner (``merge_attention``).  With a
causal mask the shards are zigzag chunks (rank r: chunks r and 2P−1−r of 2P), so every
rank does the same work at every step.  ``numba_softmax.ring`` holds the schedule, the
in-process ring and the torch.distributed one.

    torchrun --nproc_per_node=P examples/10_ring_attention.py   # P GPUs, NCCL (any P ≥ 1)
    python examples/10_ring_attention.py --ranks 4              # one GPU, 4 virtual ranks
    python examples/10_ring_attention.py --sim                  # the CUDA simulator, tiny

Under torchrun: the ring's time against one GPU's ``numba_softmax.attention`` on the whole
sequence (scaling efficiency T₁ / (P·T_P)), the exposed communication, memory per GPU,
each rank's FLOPs and step times, and the error on sampled query rows against float64
(flash-attn's rule: at most twice PyTorch's same-precision error + 1e-5).  In one process:
the same ring with P virtual ranks on one device, every step timed, and the P-GPU time
predicted from those steps (the slowest rank of each step, or the transfer of a K/V shard
at ``--link-gbps`` if longer).  NCCL_NVLS_ENABLE=0 is kept (no multicast objects).
"""

import math
import os
import statistics
import sys

import numpy as np

import _common  # first: reads --sim and switches the simulator on before numba loads

from numba_softmax import reference as R
from numba_softmax import ring
from numba_softmax.ring.measure import StepTimer, flash_attn_rule, predict, row_errors, seconds


def options(parser):
    parser.add_argument("--seq", type=int, nargs="+", help="S (default 12 / 4096 16384 32768)")
    parser.add_argument("--heads", type=int, help="heads H, batch 1 (default 1 / 8)")
    parser.add_argument("--dim", type=int, help="head dimension D (default 8 / 128)")
    parser.add_argument("--dtype", nargs="+", help="float32 float16 bfloat16 (default "
                        "float32 / float16)")
    parser.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    parser.add_argument("--ranks", type=int, help="virtual ranks in one process (default 2)")
    parser.add_argument("--repeat", type=int, help="timed samples (default: ~2 s worth, 3…20)")
    parser.add_argument("--check-rows", type=int, default=256, help="query rows checked")
    parser.add_argument("--link-gbps", type=float, default=200.0,
                        help="assumed GPU-to-GPU bandwidth for the one-process prediction")


def configs(args, device, say):
    """(dtype, causal, S) to run; a dtype the kernels refuse here is skipped, said once."""
    for dtype in args.dtype:
        why = supported(dtype, device)
        if why:
            say(f"skipped {dtype}: {why}")
            continue
        for causal in {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]:
            for S in args.seq:
                yield dtype, causal, S


def make(S, heads, dim, dtype, device):
    """q, k, v (1, H, S, D), the same on every rank (seeded by S); torch on ``device``,
    NumPy when ``device`` is None."""
    if device is None:
        rng = np.random.default_rng(S)
        return [rng.standard_normal((1, heads, S, dim)).astype(dtype) for _ in range(3)]
    import torch

    gen = torch.Generator(device).manual_seed(S)
    return [torch.randn(1, heads, S, dim, generator=gen, device=device).to(getattr(torch, dtype))
            for _ in range(3)]


def repeats(args, first):
    """Timed samples: --repeat, or about 2 s worth (3 … 20); one on the simulator."""
    if args.sim:
        return 1
    return args.repeat or min(20, max(3, int(2.0 / max(first, 1e-4))))


def timed(fn, args, cuda):
    """(result of a first, untimed call, median seconds of the timed ones)."""
    out, first = seconds(fn, cuda)
    if args.sim:
        return out, first  # one call on the simulator: more would only cost minutes
    return out, statistics.median([seconds(fn, cuda)[1] for _ in range(repeats(args, first))])


def errors(o_ring, o_one, q, k, v, causal, rows):
    """max |O − O_fp64| on query ``rows`` of the ring, of one device and (torch arrays) of
    PyTorch in the same precision."""
    if isinstance(q, np.ndarray):  # NumPy: the float64 reference on every row
        ref = R.attention(q, k, v, causal=causal)
        return float(np.abs(o_ring - ref).max()), float(np.abs(o_one - ref).max()), None
    import torch

    return tuple(row_errors(q, k, v, torch.as_tensor(rows, device=q.device), (o_ring, o_one),
                            causal=causal, scale=1 / math.sqrt(q.shape[-1])))


def check_rows(S, n):
    return np.unique(np.linspace(0, S - 1, min(n, S)).astype(np.int64))


def stamped(run, timer, P, cuda):
    """``run(timer)``; on a GPU queued behind a sleeping kernel, so that the device never
    waits for Python between two stamps (each step is a few Python calls)."""
    if cuda:
        _common.hold(300 * P * P)
    return run(timer)


def compute_for(device):
    """One step's arithmetic for arrays on ``device`` (None: NumPy; "cpu": torch CPU
    tensors, seen as NumPy; else torch CUDA tensors, kernels on the torch stream)."""
    if device is None:
        return ring.DeviceCompute()
    if device == "cpu":
        return ring.HostCompute()
    import torch

    return ring.DeviceCompute(stream=torch.cuda.current_stream())


def supported(dtype, device):
    """None if ``numba_softmax.attention`` takes this dtype here, else why not (bfloat16
    arrives with the array layer; NumPy has none)."""
    if dtype == "bfloat16" and device is None:
        return "NumPy has no bfloat16"
    try:
        compute_for(device).attention(*make(2, 1, 8, dtype, device), False, 1.0)
        return None
    except TypeError as e:
        return str(e)


def one_process(args):
    """P virtual ranks on one device (torch CUDA tensors; NumPy on the simulator)."""
    P, device = args.ranks, None if args.sim else "cuda"
    compute, cuda = compute_for(device), device is not None
    print(f"device: {_common.device_name(args.sim)};  a ring of {P} virtual ranks in one "
          f"process;  B = 1, H = {args.heads}, D = {args.dim}")
    rows, last = [], None
    for dtype, causal, S in configs(args, device, print):
        q, k, v = make(S, args.heads, args.dim, dtype, device)
        scale = 1 / math.sqrt(args.dim)
        (o_one, _), t_one = timed(lambda: compute.attention(q, k, v, causal, scale), args, cuda)

        def run(hook=None):
            return ring.virtual_ring_attention(q, k, v, P, causal=causal, compute=compute,
                                               hook=hook)

        if cuda:  # compiled and timed first, then once more with every step stamped
            t_ring = timed(run, args, cuda)[1]
        timer = StepTimer(cuda)
        (o, _, layout), t_stamped = seconds(lambda: stamped(run, timer, P, cuda), cuda)
        t_ring = t_ring if cuda else t_stamped
        steps = timer.steps()
        itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
        shard_kv = 2 * max(layout.lengths()) * args.heads * args.dim * itemsize
        t_pred = predict(steps, P, shard_kv / (args.link_gbps * 1e9))
        errs = errors(o, o_one, q, k, v, causal, check_rows(S, args.check_rows))
        base = errs[2] if errs[2] is not None else errs[1]
        rows.append((S, dtype, "yes" if causal else "no", errs[0], errs[1], errs[2],
                     "yes" if flash_attn_rule(errs[0], base) else "NO", t_one * 1e3,
                     t_ring * 1e3, t_pred * 1e3, t_one / (P * t_pred)))
        last = (layout, causal, steps)
    _common.table(f"Ring of {P} virtual ranks vs one device on the whole sequence",
                  ["S", "dtype", "causal", "err ring", "err one device", "err torch same prec.",
                   "rule", "one device ms", "ring, all ranks ms", f"predicted {P} GPUs ms",
                   "predicted efficiency"],
                  rows, ["d", "", "", ".1e", ".1e", ".1e", "", ".3f", ".3f", ".3f", ".2f"])
    if last:
        print_steps(*last, args)
    print("\nerr: max |O − O_fp64| over the checked rows; rule: err ring <= 2 × the "
          "same-precision error (torch's on a GPU, one device's on the simulator) + 1e-5.")
    if args.sim:
        print("On the simulator the times measure Python threads, not a GPU.")
    return 0 if all(r[6] == "yes" for r in rows) else 1


def print_steps(layout, causal, steps, args):
    """Each (step, rank) of the last configuration, and each rank's FLOPs and time."""
    flops = ring.rank_flops(layout, causal, args.dim, heads=args.heads)
    table = []
    for t, row in enumerate(ring.schedule(layout, causal)):
        for st in row:
            a, m, c = steps[(t, st.rank)]
            nq, nk = st.q.stop - st.q.start, st.k.stop - st.k.start
            table.append((t, st.rank, st.source, st.kind, f"{nq}×{nk}", flops[t][st.rank],
                          a * 1e3, m * 1e3, c * 1e3))
    _common.table(f"Steps of the last configuration ({'causal, zigzag' if causal else 'no mask'},"
                  f" S = {layout.total})",
                  ["step", "rank", "holds K/V of", "computes", "Q×K rows", "FLOPs",
                   "attention ms", "merge ms", "waited for K/V ms"],
                  table, ["d", "d", "d", "", "", "d", ".3f", ".3f", ".3f"])
    per_rank = [(r, sum(f[r] for f in flops),
                 sum(a + m for (t, rr), (a, m, _) in steps.items() if rr == r) * 1e3)
                for r in range(layout.world)]
    _common.table("Work per rank", ["rank", "FLOPs", "attention + merge ms"], per_rank,
                  ["d", "d", ".3f"])


def distributed(args):
    """One rank of a torchrun job: NCCL on GPUs (gloo on CPUs, e.g. with --sim)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast objects
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available() and not args.sim
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        from numba import cuda as numba_cuda

        torch.cuda.set_device(local)
        numba_cuda.select_device(local)  # Numba's kernels on the device of torch's tensors
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, P = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{local}" if cuda else "cpu"
    if rank == 0:
        what = f"torch {torch.__version__}"
        if cuda:
            what += (f", NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
                     f"{torch.cuda.get_device_name(local)}")
        print(f"{P} ranks ({'NCCL' if cuda else 'gloo'}); {what}; B = 1, H = {args.heads}, "
              f"D = {args.dim}")
    rows, last = [], None
    for dtype, causal, S in configs(args, device, print if rank == 0 else lambda _: None):
        q, k, v = make(S, args.heads, args.dim, dtype, device)
        layout = ring.layout_for(S, P, causal)
        mine = [ring.shard(x, layout, rank).contiguous() for x in (q, k, v)]
        if rank:
            q = k = v = None  # only rank 0 checks against the whole sequence

        def run(hook=None):
            return ring.ring_attention(*mine, causal=causal, hook=hook)

        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if cuda else 0
        (o, _), first = seconds(run, cuda)  # also compiles
        held = sum(x.numel() * x.element_size() for x in mine)
        held += torch.cuda.max_memory_allocated() - base if cuda else 0
        reps = torch.tensor([repeats(args, first)], device=device)
        dist.all_reduce(reps, op=dist.ReduceOp.MAX)  # every rank the same number of rings
        samples = []
        for _ in range(int(reps)):
            dist.barrier()
            samples.append(seconds(run, cuda)[1])
        samples = torch.tensor(samples, device=device)
        dist.all_reduce(samples, op=dist.ReduceOp.MAX)  # a ring lasts as long as its slowest rank
        t_ring = float(samples.median())
        timer = StepTimer(cuda)
        stamped(run, timer, P, cuda)
        if cuda:
            torch.cuda.synchronize()
        every = [None] * P
        dist.all_gather_object(every, (timer.steps(), held))
        o_all = ring.gather_sequence(o, layout)
        if rank == 0:
            steps = {key: val for st, _ in every for key, val in st.items()}
            one = compute_for(device)
            (o_one, _), t_one = timed(lambda: one.attention(q, k, v, causal,
                                                            1 / math.sqrt(args.dim)), args, cuda)
            errs = errors(o_all, o_one, q, k, v, causal, check_rows(S, args.check_rows))
            exposed = max(sum(c for (t, r), (_, _, c) in steps.items() if r == rr)
                          for rr in range(P))
            rows.append((S, dtype, "yes" if causal else "no", t_ring * 1e3, t_one * 1e3,
                         t_one / (P * t_ring), 100 * exposed / t_ring,
                         _common.nbytes(max(h for _, h in every)), *errs,
                         "yes" if flash_attn_rule(errs[0], errs[2]) else "NO"))
            last = (layout, causal, steps)
        dist.barrier()
    dist.destroy_process_group()
    if rank:
        return 0
    _common.table(f"Ring attention on {P} {'GPUs' if cuda else 'processes'} vs one device",
                  ["S", "dtype", "causal", f"ring ({P}) ms", "one device ms", "efficiency",
                   "exposed comm %", "memory per rank", "err ring", "err one device",
                   "err torch same prec.", "rule"],
                  rows, ["d", "", "", ".3f", ".3f", ".2f", ".1f", "", ".1e", ".1e", ".1e", ""])
    if last:
        print_steps(*last, args)
    print("\nefficiency = T(one device) / (P · T(ring)); exposed comm: the longest any rank's "
          "stream waited for K/V, summed over steps; memory: shards + the ring's peak "
          "allocation; err: max |O − O_fp64| on sampled rows.")
    return 0 if all(r[-1] == "yes" for r in rows) else 1


def main(argv=None):
    args = _common.parse(__doc__, options, argv)
    args.seq = args.seq or _common.pick(args, [12], [4096, 16384, 32768])
    args.heads = args.heads or _common.pick(args, 1, 8)
    args.dim = args.dim or _common.pick(args, 8, 128)
    args.dtype = args.dtype or _common.pick(args, ["float32"], ["float16"])
    args.ranks = args.ranks or 2
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun (any P ≥ 1)
        return distributed(args)
    return one_process(args)


if __name__ == "__main__":
    sys.exit(main())
