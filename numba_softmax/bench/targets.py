"""The speed targets, judged from one run's rows and printed after its tables.

Each target is a rule over the kernel rows of one section: which rows it holds, the
figure it reads from each, and the least (or most) that figure may be.  Its name says
what it measures: the operation and problems, the figure, the bar.  A target is
*met* when every row it holds passes, *MISSED* when one does not (the line names the
worst row, and how many of its rows passed), and *not measured* when the run has no row
for it (``--quick`` or ``--only``).  Figures come from :func:`.results.derive`: % of
this run's copy bandwidth, × torch (its time over ours), µs.  Why each miss stands —
the measurement that explains it — is written in ``docs/targets.md``.
"""

import dataclasses
import math

from .context import ITEMSIZE
from .results import SAME_SIZE_COPY as COPY

MB = 2**20
PEERS = ("torch", "cupy", "triton tutorial", "triton seed001", COPY)  # softmax rows not ours
BEST_F32 = "softmax float32, 32 MB … 128 × 1M: fastest method ≥ 90 % of copy bandwidth"
GEOMEAN = "softmax, geometric mean over the problems: fastest method ≥ 1.5× torch's speed"


@dataclasses.dataclass
class Verdict:
    section: str  # the bench section whose rows it reads (softmax, backward, decode, topk)
    target: str  # what it measures, in words: the operation and problems, the figure, the bar
    status: str  # met | MISSED | not measured
    worst: str = ""  # the worst row: its problem and figure
    passed: str = ""  # "n/m rows"


def _label(r):
    if r.B is not None and r.suite != "topk":
        what = f"B{r.B} Sk{r.Sk}" if r.suite == "decode" else f"D{r.D} S{r.Sq}"
        extra = (" causal" if r.causal else "") + (f" page {r.page}" if r.page else "")
        return f"{r.dtype} {what}{extra}"
    return f"{r.dtype} {r.M}x{r.N}" + (f" k{r.k}" if r.k else "")


def judge(section, target, rows, figure, least=None, most=None, unit="", label=_label,
          extra=lambda r: ""):
    """The verdict on ``rows`` for ``figure(row)`` ≥ ``least`` (or ≤ ``most``); the worst
    row named by ``label``, with ``extra`` after its figure."""
    rows = [r for r in rows if figure(r) is not None]
    if not rows:
        return Verdict(section, target, "not measured")
    ok = [(figure(r) >= least) if least is not None else (figure(r) <= most) for r in rows]
    worst = min(rows, key=figure) if least is not None else max(rows, key=figure)
    return Verdict(section, target, "met" if all(ok) else "MISSED",
                   f"{label(worst)}: {figure(worst):.3g}{unit}{extra(worst)}", f"{sum(ok)}/{len(ok)}")


def _kernel(results, suite):
    return [r for r in results if r.suite == suite and r.level == "kernel"]


def _best(rows):
    """Per (dtype, M, N): the fastest of our rows (methods and auto), and the peers' rows."""
    best, peers = {}, {}
    for r in rows:
        key = (r.dtype, r.M, r.N)
        if r.impl in PEERS:
            peers.setdefault(key, []).append(r)
        elif key not in best or r.median_ms < best[key].median_ms:
            best[key] = r
    return best, peers


def softmax(results):
    """Softmax: the fastest of our methods against the copy and the peers; each method
    against its own traffic bound."""
    best, peers = _best(_kernel(results, "softmax"))
    copied = {key: r.pct_copy for key, rs in peers.items() for r in rs if r.impl == COPY}
    peers = {key: [r for r in rs if r.impl != COPY] for key, rs in peers.items()}

    def sized(r):  # what a copy of the row's own bytes reached in this run
        size = copied.get((r.dtype, r.M, r.N))
        return f" (a copy of its bytes: {size:.3g} %)" if size else ""

    f32 = [r for k, r in best.items() if k[0] == "float32"]
    big = [r for r in f32 if r.M * r.N * 4 >= 32 * MB and r.N <= 2**20]
    half = [r for k, r in best.items() if k[0] in ("float16", "bfloat16") and r.M * r.N * 2 >= 32 * MB]
    ratio = {}  # per problem, against its fastest peer: the peer's time over our best
    for key, mine in best.items():
        for p in peers.get(key, ()):
            r = dataclasses.replace(mine, x_torch=p.median_ms / mine.median_ms, note=p.impl)
            if key not in ratio or r.x_torch < ratio[key].x_torch:
                ratio[key] = r
    torch = [r for r in best.values() if r.x_torch]
    geo = (math.exp(sum(math.log(r.x_torch) for r in torch) / len(torch))) if torch else None
    out = [
        judge("softmax", BEST_F32, big, lambda r: r.pct_copy, least=90, unit=" %", extra=sized),
        judge("softmax", "softmax float32 1 × 16M: fastest method ≥ 75 % of copy bandwidth",
              [r for r in f32 if r.M == 1 and r.N == 2**24], lambda r: r.pct_copy, least=75,
              unit=" %", extra=sized),
        judge("softmax", "softmax, every shape: fastest method ≥ every peer's speed "
              "(torch, triton tutorial, triton seed001)",
              list(ratio.values()), lambda r: r.x_torch, least=1.0, unit="×",
              label=lambda r: f"{_label(r)} against {r.note}"),
        Verdict("softmax", GEOMEAN, "not measured") if geo is None else
        Verdict("softmax", GEOMEAN, "met" if geo >= 1.5 else "MISSED",
                f"{geo:.3g}× over {len(torch)} problems", ""),
        judge("softmax", "softmax fp16/bf16, ≥ 32 MB: fastest method ≥ 85 % of copy bandwidth",
              half, lambda r: r.pct_copy, least=85, unit=" %", extra=sized),
    ]
    rows = _kernel(results, "softmax")
    out.append(judge("softmax", "softmax float32 16384 × 1024: online ≥ 2400 GB/s",
                     [r for r in rows if r.impl == "online" and r.dtype == "float32"
                      and (r.M, r.N) == (16384, 1024)], lambda r: r.gbps, least=2400, unit=" GB/s"))
    for method in ("three_pass", "online", "fused", "split"):
        out.append(judge("softmax", f"softmax {method}, every shape: ≥ 85 % of its own "
                         "traffic bound",
                         [r for r in rows if r.impl == method], lambda r: r.pct_model,
                         least=85, unit=" %"))
    return out


def attention(results):
    """The fp16/bf16 forward at S 4096 and 16384 (``ns.attention``: on sm_90 the wgmma
    kernels): against SDPA, and against the Triton peer timed beside it."""
    rows = [r for r in _kernel(results, "attention") if r.dtype != "float32"
            and r.Sq in (4096, 16384)]
    mine = [r for r in rows if r.impl == "numba_softmax"]
    peer = {(r.dtype, r.B, r.H, r.Sq, r.D, r.causal): r for r in rows if r.impl == "triton"}
    vs_triton = [dataclasses.replace(r, x_torch=p.median_ms / r.median_ms) for r in mine
                 if (p := peer.get((r.dtype, r.B, r.H, r.Sq, r.D, r.causal))) is not None]
    sdpa = [r for r in mine if r.x_torch]
    return [
        judge("attention", "attention forward fp16/bf16, S 4096 and 16384: ≥ 0.6× SDPA's speed "
              "(first bar)", sdpa, lambda r: r.x_torch, least=0.6, unit="× SDPA"),
        judge("attention", "attention forward fp16/bf16, S 4096 and 16384: ≥ 0.8× SDPA's speed",
              sdpa, lambda r: r.x_torch, least=0.8, unit="× SDPA"),
        judge("attention", "attention forward fp16/bf16, S 4096 and 16384: ≥ the Triton peer's "
              "speed", vs_triton, lambda r: r.x_torch, least=1.0, unit="× triton"),
    ]


def backward(results):
    """Softmax and attention backward: against the copy and against torch / SDPA."""
    rows = _kernel(results, "backward")
    mine = [r for r in rows if r.impl in ("softmax_backward", "log_softmax_backward")]
    attn = [r for r in rows if r.impl == "attention_backward"]
    return [
        judge("backward", "softmax / log_softmax backward, ≥ 32 MB: ≥ 85 % of copy bandwidth",
              [r for r in mine if r.M * r.N * ITEMSIZE[r.dtype] >= 32 * MB], lambda r: r.pct_copy,
              least=85, unit=" %"),
        judge("backward", "softmax / log_softmax backward, every shape: ≥ torch's speed", mine,
              lambda r: r.x_torch, least=1.0, unit="× torch"),
        judge("backward", "attention backward float32: ≥ 0.5× SDPA backward's speed",
              [r for r in attn if r.dtype == "float32"], lambda r: r.x_torch, least=0.5,
              unit="× SDPA"),
        judge("backward", "attention backward fp16/bf16: ≥ 0.25× SDPA backward's speed "
              "(first bar)",
              [r for r in attn if r.dtype != "float32"], lambda r: r.x_torch, least=0.25,
              unit="× SDPA"),
        judge("backward", "attention backward fp16/bf16: ≥ 0.5× SDPA backward's speed (goal)",
              [r for r in attn if r.dtype != "float32"], lambda r: r.x_torch, least=0.5,
              unit="× SDPA"),
        judge("backward", "attention backward fp16/bf16, S 4096 and 16384: ≥ 0.6× SDPA "
              "backward's speed", [r for r in attn if r.dtype != "float32"
                                   and r.Sq in (4096, 16384)], lambda r: r.x_torch, least=0.6,
              unit="× SDPA"),
    ]


def decode(results):
    """Paged GQA decode: against SDPA's dense decode, and its read rate."""
    paged = [r for r in _kernel(results, "decode") if r.impl == "paged"]
    return [
        judge("decode", "paged GQA decode, every (B, context): ≥ 0.9× SDPA dense decode's "
              "speed", paged,
              lambda r: r.x_torch, least=0.9, unit="× SDPA"),
        judge("decode", "paged GQA decode B 1, context 4K: ≥ 2000 GB/s",
              [r for r in paged if r.B == 1 and r.Sk == 4096], lambda r: r.gbps, least=2000,
              unit=" GB/s"),
    ]


def topk(results):
    """Fused softmax + top-k: against torch, against one read of the logits, one row's
    latency."""
    rows = [r for r in _kernel(results, "topk") if r.impl == "softmax_topk"]
    return [
        judge("topk", "softmax + top-k B ≥ 64, V ≥ 32000: ≥ 3× torch.topk(torch.softmax)'s "
              "speed",
              [r for r in rows if r.M >= 64 and r.N >= 32000], lambda r: r.x_torch, least=3.0,
              unit="× torch"),
        judge("topk", "softmax + top-k B 1024: ≥ 70 % of copy bandwidth, one read of the logits",
              [r for r in rows if r.M == 1024], lambda r: r.pct_copy, least=70, unit=" %"),
        judge("topk", "softmax + top-k B 1, V 128256: ≤ 20 µs",
              [r for r in rows if (r.M, r.N) == (1, 128256)],
              lambda r: r.median_ms * 1e3, most=20, unit=" µs"),
    ]


def evaluate(results):
    """Every target of the sections this run measured."""
    suites = {r.suite for r in results}
    out = []
    for suite, rule in (("softmax", softmax), ("attention", attention), ("backward", backward),
                        ("decode", decode), ("topk", topk)):
        if suite in suites:
            out += rule(results)
    return out


def format_targets(verdicts, sim=False):
    """The verdicts as a table ('' when there are none)."""
    if not verdicts:
        return ""
    w = max(len(v.target) for v in verdicts)
    why = ("the simulator's times mean nothing: shown only to run this code" if sim else
           "misses: docs/targets.md")
    lines = [f"== targets ==  (the speed targets on this run's kernel rows; {why})",
             f"{'target':<{w + 2}}{'status':<14}{'rows met':<10}worst row"]
    lines.append("-" * len(lines[-1]))
    for v in verdicts:
        lines.append(f"{v.target:<{w + 2}}{v.status:<14}{v.passed:<10}{v.worst}")
    return "\n".join(lines)
