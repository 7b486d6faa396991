#!/usr/bin/env python
"""A Llama model's prefill and training step with SDPA's attention and with numba_softmax's.

    python scripts/experiments/model_speed.py [--layers 8] [--seq 4096] [--batch 2]
        [--train-batch 1] [--hopper auto] [--skip NAME] [--profile 12] [--out FILE]

Needs a CUDA GPU, PyTorch, transformers and numba-cuda.  One model, seeded random weights
(``torch.manual_seed(0)``, nothing downloaded): transformers' ``LlamaConfig`` with hidden
2048, 16 query / 4 key-value heads (D 128), ``--layers`` layers (8), MLP 5632, vocabulary
32000, bfloat16 weights, attention dropout 0.  Each configuration runs in its own
subprocess, since ``numba_softmax.attention`` reads ``NUMBA_SOFTMAX_HOPPER`` at import:

    sdpa            attn_implementation="sdpa" (the backend torch picks: flash, cuDNN, ...)
    off             "numba_softmax", NUMBA_SOFTMAX_HOPPER=off: the mma.sync kernels (before)
    auto            "numba_softmax", NUMBA_SOFTMAX_HOPPER=auto: the wgmma forward and
                    backward (hb2) where they apply — for arrays a tensor map describes,
                    a model's transposed views among them (loaded as they lie);
                    ``--hopper h5`` (or any configuration) runs that forward instead

Prefill: ``model(ids, use_cache=False)`` under ``torch.no_grad()``, ``--batch`` × ``--seq``
random tokens (all positions' logits, as the model computes by default; ``--last-logits``
passes ``logits_to_keep=1``, as a server would).  Training step: ``model(ids,
labels=ids).loss.backward()``, then ``torch.optim.SGD(lr=1e-4).step()`` and
``zero_grad(set_to_none=True)`` (``--optim none``: forward and backward only), on
``--train-batch`` × ``--seq`` tokens.  Each is timed with CUDA events around whole calls
(host time included, as a model sees it): ``--warmup`` (3) calls, then the median of
``--iters`` (10).  × SDPA is SDPA's time over the configuration's: the issue's target is
≥ 0.8 for both the prefill and the training step.  max |Δ logits| compares the last
position's logits (float32) of the first timed prefill with SDPA's: same weights, same
tokens.  wgmma: of the forward calls that could go to the Hopper kernel, those that did —
counted on the ordinary path only: a repeat of a call replays its launch plan, so each
distinct call (layout, options) counts once.  FLOPs at the defaults: the linear layers
2·N ≈ 0.85 GFLOP a token, causal attention 2·S·D·Hq·layers ≈ 0.13 GFLOP a token (S 4096):
~14 % of the FLOPs of a prefill (~15 % of a training step's), a larger share of its time.

``--profile N``: after the timing, one more training step of each configuration under
``torch.profiler``; the table is followed by each configuration's N costliest GPU kernels
(their total time in that step, and how many launches), and its GPU-busy and wall time —
where a configuration's step time goes that SDPA's does not.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _timing, imported where it is used


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--batch", type=int, default=2, help="prefill batch (2)")
    p.add_argument("--train-batch", type=int, default=1, help="training step batch (1)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--optim", choices=("sgd", "none"), default="sgd")
    p.add_argument("--last-logits", action="store_true", help="prefill with logits_to_keep=1")
    p.add_argument("--hopper", action="append", help="NUMBA_SOFTMAX_HOPPER of the 'after' run "
                   "(repeatable; default auto)")
    p.add_argument("--skip", action="append", default=[], help="a configuration not to run: "
                   "sdpa, off or a --hopper value (repeatable)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also list each configuration's N costliest GPU kernels in a step")
    p.add_argument("--out", help="also write the table here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--logits", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def timed(fn, warmup, iters):
    """Median ms of ``iters`` calls of ``fn`` after ``warmup``, and the first timed result."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times, first = [], None
    for i in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        first = result if i == 0 else first
    return statistics.median(times), first


def worker(args):
    """One configuration: build, time prefill then a training step; one JSON line out."""
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT))
    hopper, seen = None, None
    if args.worker != "sdpa":
        from numba_softmax.integrations import transformers as nst_hf

        nst_hf.register()  # before set_attn_implementation: transformers checks the name
        mod = sys.modules["numba_softmax.attention"]
        hopper, route, seen = mod.HOPPER, mod.hopper_config, []
        # count the calls sent to the wgmma kernel (a call plan skips this)
        mod.hopper_config = lambda *a: seen.append(route(*a)) or seen[-1]
    cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=args.layers,
                      num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                      max_position_embeddings=max(8192, args.seq), attention_dropout=0.0)
    torch.manual_seed(0)  # built on the CPU in float32: the same weights in every subprocess
    model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)
    model.set_attn_implementation("sdpa" if args.worker == "sdpa" else "numba_softmax")
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, cfg.vocab_size, (max(args.batch, args.train_batch), args.seq),
                        generator=gen).cuda()
    out = {"config": args.worker, "hopper": hopper, "device": torch.cuda.get_device_name(),
           "versions": f"torch {torch.__version__}, CUDA {torch.version.cuda}"}

    model.eval()
    keep = {"logits_to_keep": 1} if args.last_logits else {}
    with torch.no_grad():
        def prefill():
            return model(ids[:args.batch], use_cache=False, **keep).logits[:, -1].float()
        out["prefill_ms"], logits = timed(prefill, args.warmup, args.iters)
    np.save(args.logits, logits.cpu().numpy())
    del logits
    torch.cuda.empty_cache()

    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4) if args.optim == "sgd" else None
    train_ids = ids[:args.train_batch]

    def step():
        loss = model(train_ids, labels=train_ids).loss
        loss.backward()
        if opt is not None:
            opt.step()
        model.zero_grad(set_to_none=True)
        return loss.detach()
    out["train_ms"], loss = timed(step, args.warmup, args.iters)
    out["loss"] = loss.item()
    if args.profile:
        from _timing import profiled  # (imports torch: the workers only)

        out["profile"] = profiled(step, args.profile)
    out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    out["wgmma"] = (f"{sum(c is not None for c in seen)}/{len(seen)}" if seen is not None
                    else "—")
    print(json.dumps(out), flush=True)


def run_config(name, logits_path):
    """Run one configuration's subprocess; its JSON line, or {"error": ...}."""
    env = dict(os.environ, NUMBA_SOFTMAX_HOPPER="off" if name == "sdpa" else name)
    cmd = [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:],  # the sizes
           "--worker", name, "--logits", logits_path]
    print(f"running {name} ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}, no output"])[-1]
    print(proc.stderr[-4000:], file=sys.stderr)
    return {"config": name, "error": tail[:120]}


def shell(cmd):
    try:
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=20)
        first = out.stdout.strip().split("\n")[0]
        return first if out.returncode == 0 and first else None
    except (OSError, subprocess.SubprocessError):
        return None


def main():
    args = parse()
    if args.worker:
        return worker(args)
    try:
        import numpy as np
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"model_speed.py needs torch, transformers and numba-cuda: {e}")
    if not torch.cuda.is_available():
        sys.exit("model_speed.py needs a CUDA GPU: torch.cuda.is_available() is False")
    names = [n for n in ["sdpa", "off"] + (args.hopper or ["auto"]) if n not in args.skip]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in dict.fromkeys(names):
            path = os.path.join(tmp, f"{name}.npy")
            results[name] = run_config(name, path)
            if "error" not in results[name]:
                results[name]["logits"] = np.load(path)
    ok = [r for r in results.values() if "error" not in r]
    gpu = ok[0]["device"] if ok else torch.cuda.get_device_name()
    driver = shell(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    tree = shell(["git", "describe", "--always", "--dirty"]) or "unknown"
    versions = ok[0]["versions"] if ok else f"torch {torch.__version__}"
    lines = [f"# scripts/experiments/model_speed.py {' '.join(sys.argv[1:])} on {gpu}, driver "
             f"{driver or 'unknown'}, tree {tree} "
             f"({versions}, transformers {transformers.__version__})",
             f"# Llama {args.layers} layers, hidden 2048, 16/4 heads, D 128, bf16; prefill "
             f"{args.batch}×{args.seq}, training step {args.train_batch}×{args.seq} "
             f"({'SGD' if args.optim == 'sgd' else 'no optimizer'}); median of {args.iters} ms",
             f"{'configuration':<26} {'prefill ms':>10} {'tokens/s':>9} {'× SDPA':>7} "
             f"{'train ms':>9} {'× SDPA':>7} {'max |Δ logits|':>14} {'loss':>8} {'peak GiB':>8} "
             f"{'wgmma':>7}"]
    base = results.get("sdpa", {})
    for name, r in results.items():
        label = "sdpa" if name == "sdpa" else f"numba_softmax, HOPPER={r.get('hopper') or name}"
        if "error" in r:
            lines.append(f"{label:<26} error: {r['error']}")
            continue
        ratio = {k: f"{base[k] / r[k]:.2f}" if k in base else "—"
                 for k in ("prefill_ms", "train_ms")}
        delta = (f"{np.abs(r['logits'] - base['logits']).max():.3g}" if "logits" in base and
                 name != "sdpa" else "—")
        tokens = args.batch * args.seq / r["prefill_ms"] * 1e3
        lines.append(f"{label:<26} {r['prefill_ms']:>10.2f} {tokens:>9.0f} "
                     f"{ratio['prefill_ms']:>7} {r['train_ms']:>9.2f} {ratio['train_ms']:>7} "
                     f"{delta:>14} {r['loss']:>8.4f} {r['peak_gib']:>8.1f} {r['wgmma']:>7}")
    for name, r in results.items():
        if "profile" in r:
            from _timing import profile_lines

            lines += profile_lines(f"{name}, one training step", r["profile"])
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
