"""13 — a serving loop in one file: a Llama model's attention over a paged KV cache.

A Llama-architecture model (transformers' ``LlamaConfig``, seeded random weights: nothing
is downloaded) serves a queue of prompts of unequal lengths with continuous batching.
Its attention is one function registered with transformers' ``AttentionInterface``;
the model is called with ``use_cache=False`` and explicit ``position_ids``, and each
layer's keys and values live in the package's paged cache instead:

    admit    a new sequence takes blocks from the pool and a row of the block table
    prefill  its whole prompt in one call: each layer appends the prompt's k/v
             (``ns.append_kv``) and attends over them (``ns.paged_attention``, causal)
    decode   every active sequence advances one token a step, together: each layer
             appends one k/v per sequence and attends over that sequence's cache
    sample   ``ns.sample`` draws the next tokens from the last logits (top_k=1: greedy)
    retire   a sequence that has its tokens gives its blocks back; the next one enters

The greedy tokens are checked against ``model.generate(do_sample=False)`` of the same
model on ``attn_implementation="sdpa"``, and on a GPU both are timed (tokens/s).  With no
GPU it runs a toy size on the CPU (the simulator takes NumPy arrays: tensors are converted
where they meet the package) and prints no times.

    python examples/13_serve.py          # on the GPU
    python examples/13_serve.py --sim    # on the CUDA simulator, toy size
"""

import copy
import sys
import time

import numpy as np

import _common  # first: reads --sim and switches the simulator on before numba loads

import numba_softmax as ns

ATTN = "numba_softmax_paged"


class PagedKV:
    """One pool of blocks per layer, (num_blocks, block_size, Hkv, D), and the tables of
    the sequences a call serves (set by the loop before each model call)."""

    def __init__(self, cfg, blocks, block_size, device, sim):
        import torch

        self.sim, self.block_size = sim, block_size
        hkv, d = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
        shape = (blocks, block_size, hkv, d)
        if sim:  # simulator device arrays: append_kv writes them in place
            from numba import cuda

            self.k = [cuda.to_device(np.zeros(shape, np.float32)) for _ in range(cfg.num_hidden_layers)]
            self.v = [cuda.to_device(np.zeros(shape, np.float32)) for _ in range(cfg.num_hidden_layers)]
        else:
            self.k = [torch.zeros(shape, device=device) for _ in range(cfg.num_hidden_layers)]
            self.v = [torch.zeros(shape, device=device) for _ in range(cfg.num_hidden_layers)]
        self.free = list(range(blocks))[::-1]
        self.table = self.before = self.after = None

    def take(self, n_tokens):
        n = -(-n_tokens // self.block_size)
        if n > len(self.free):
            raise RuntimeError("the pool has too few free blocks")
        return [self.free.pop() for _ in range(n)]

    def give(self, blocks):
        self.free.extend(blocks)

    def serve(self, seqs, new):
        """The block table and lengths (before and after ``new`` tokens) of ``seqs`` for the
        next call.  They name only blocks this loop took, so the calls skip their check
        (``check=False``: no wait on the device), and on a GPU they are copied to the
        device once for all the layers to read."""
        width = max(len(s["blocks"]) for s in seqs)
        table = np.zeros((len(seqs), width), np.int32)  # entries past a sequence's blocks: unread
        for i, s in enumerate(seqs):
            table[i, :len(s["blocks"])] = s["blocks"]
        lengths = np.array([s["cached"] for s in seqs], np.int32)
        tables = (table, lengths, lengths + np.int32(new))
        if not self.sim:
            import torch

            tables = [torch.from_numpy(t).to(self.k[0].device, non_blocking=True) for t in tables]
        self.table, self.before, self.after = tables

    @staticmethod
    def array(x):
        """A NumPy array as a simulator device array (append_kv writes device caches only)."""
        from numba import cuda

        return cuda.to_device(np.ascontiguousarray(x))

    def attention(self, module, q, k, v, attention_mask, scaling=None, **kwargs):
        """transformers' attention contract: append this layer's new k/v, attend, (O, None)."""
        import torch

        layer = module.layer_idx
        k_new, v_new = (t.transpose(1, 2).contiguous() for t in (k, v))  # (B, Snew, Hkv, D)
        q = q.contiguous()
        if self.sim:
            k_new, v_new, q = (self.array(t.detach().numpy()) for t in (k_new, v_new, q))
        ns.append_kv(k_new, v_new, self.k[layer], self.v[layer], self.table, self.before,
                     check=False)
        o = ns.paged_attention(q, self.k[layer], self.v[layer], self.table, self.after,
                               causal=True, scale=scaling, check=False)
        o = torch.from_numpy(o.copy_to_host()) if self.sim else o
        return o.transpose(1, 2).contiguous(), None


def serve(model, cache, requests, max_active, sim):
    """Continuous batching over ``requests`` [(prompt ids, tokens wanted)]: the tokens of
    each, in order, and the number of decode steps taken."""
    import torch

    device = next(model.parameters()).device
    queue = [dict(id=i, prompt=p, want=n, out=[]) for i, (p, n) in enumerate(requests)]
    active, done, steps = [], {}, 0

    def run(seqs, ids, positions):
        cache.serve(seqs, ids.shape[1])
        with torch.no_grad():
            logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[:, -1]
        tokens = ns.sample(logits.float().contiguous().numpy() if sim else logits.float().contiguous(), top_k=1)
        for s, t in zip(seqs, np.asarray(tokens.cpu() if not sim else tokens).tolist()):
            s["cached"] += ids.shape[1]
            s["out"].append(int(t))

    while queue or active:
        while queue and len(active) < max_active:  # admit and prefill, one sequence at a time
            s = queue.pop(0)
            s["blocks"], s["cached"] = cache.take(len(s["prompt"]) + s["want"]), 0
            n = len(s["prompt"])
            run([s], torch.tensor([s["prompt"]], device=device), torch.arange(n, device=device)[None])
            active.append(s)
        for s in [s for s in active if len(s["out"]) >= s["want"]]:  # retire
            active.remove(s)
            cache.give(s["blocks"])
            done[s["id"]] = s["out"]
        if not active:
            continue
        last = torch.tensor([[s["out"][-1]] for s in active], device=device)
        positions = torch.tensor([[s["cached"]] for s in active], device=device)
        run(active, last, positions)  # decode: every active sequence, one token
        steps += 1
    return [done[i] for i in range(len(requests))], steps


def main(argv=None):
    args = _common.parse(__doc__, None, argv)
    try:
        import torch
        from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"This example needs torch and transformers: {e}")
        return 0
    sim = args.sim or not torch.cuda.is_available()
    device = "cpu" if sim else "cuda"
    size = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=64) if sim else \
        dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, vocab_size=32000)
    cfg = LlamaConfig(max_position_embeddings=1024, **size)
    lengths = [5, 3, 7] if sim else [37, 120, 64, 200, 9, 90, 150, 30]
    wants = [3, 2, 4] if sim else [48, 32, 64, 40, 56, 32, 64, 48]
    max_active = 2 if sim else 4
    rng = np.random.default_rng(0)
    requests = [(rng.integers(1, cfg.vocab_size, n).tolist(), w) for n, w in zip(lengths, wants)]
    print(f"device: {_common.device_name(sim)}" + ("; toy size on the CPU" if sim else ""))
    print(f"Llama: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_attention_heads} query / {cfg.num_key_value_heads} key-value heads; "
          f"{len(requests)} prompts of {lengths} tokens, at most {max_active} active")

    torch.manual_seed(0)
    ref = LlamaForCausalLM(copy.deepcopy(cfg)).to(device).eval()
    ours = LlamaForCausalLM(copy.deepcopy(cfg)).to(device).eval()  # own config: own attention
    ours.load_state_dict(ref.state_dict())
    block = 4 if sim else 16
    cache = PagedKV(cfg, sum(-(-(n + w) // block) for n, w in zip(lengths, wants)), block, device, sim)
    AttentionInterface.register(ATTN, cache.attention)
    ref.set_attn_implementation("sdpa")
    ours.set_attn_implementation(ATTN)

    def generate():
        outs = []
        for prompt, want in requests:
            ids = torch.tensor([prompt], device=device)
            out = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=want,
                               min_new_tokens=want, do_sample=False, pad_token_id=0)
            outs.append(out[0, len(prompt):].tolist())
        return outs

    def timed(fn):
        if sim:
            return fn(), None
        fn()  # warm-up: compilation, allocations, launch plans
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        return result, time.perf_counter() - start

    (tokens, steps), ours_s = timed(lambda: serve(ours, cache, requests, max_active, sim))
    want, ref_s = timed(generate)
    total = sum(wants)
    rows = [(i, lengths[i], " ".join(map(str, tokens[i][:6])), "yes" if tokens[i] == want[i] else "NO")
            for i in range(len(requests))]
    _common.table("Served sequences (greedy tokens, first 6)", ["seq", "prompt", "tokens", "= generate"],
                  rows, ["d", "d", "", ""])
    _common.table(f"Throughput: {total} tokens, {steps} decode steps",
                  ["loop", "seconds", "tokens/s"],
                  [("paged serving loop (numba_softmax)", ours_s, total / ours_s if ours_s else None),
                   ("model.generate, sdpa, one prompt at a time", ref_s,
                    total / ref_s if ref_s else None)], ["", ".3f", ".1f"])
    match = tokens == want
    print(f"\nGreedy tokens match model.generate (sdpa): {'yes' if match else 'NO'}")
    return 0 if match else 1


if __name__ == "__main__":
    sys.exit(main())
