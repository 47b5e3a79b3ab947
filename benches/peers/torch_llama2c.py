"""The peer of examples/candle's decode mode: the same llama2.c checkpoint loaded into a PyTorch
model (fp32, batch 1), greedy decoding from BOS, run eagerly, as a `torch.cuda.CUDAGraph` of one
step replayed per token (static KV cache, the token and position in device tensors, attention
masked by position: the usual way), and through `torch.compile(mode="reduce-overhead")` where it
runs.

    python3 benches/peers/torch_llama2c.py CHECKPOINT [--steps N] [--expect TOKENS_FILE]

CHECKPOINT is a llama2.c `.bin` file (`../shared/data/stories260K.bin`, or one the Rust example
writes with `decode --random 15m --save-checkpoint FILE`). TOKENS_FILE holds the Rust side's token
ids, one a line (`decode --save-tokens FILE`); each mode's tokens are compared with it, and where
they first differ the top-two logit gap of PyTorch's eager step there is printed. Prints one
Markdown row per mode: tokens per second, host time per token (µs, the Python calls that issue
the step), GPU time per token (µs, CUDA events) and whether the tokens match.
"""

import argparse
import struct
import sys
import time

import torch


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", data[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    floats = torch.frombuffer(bytearray(data[28:]), dtype=torch.float32)
    hs = dim // heads
    kv = hs * kv_heads
    at = 0

    def take(*shape):
        nonlocal at
        n = 1
        for s in shape:
            n *= s
        t = floats[at : at + n].reshape(shape)
        at += n
        return t

    w = {}
    w["emb"] = take(vocab, dim)
    w["rms_att"] = take(layers, dim)
    w["wq"] = take(layers, dim, dim)
    w["wk"] = take(layers, kv, dim)
    w["wv"] = take(layers, kv, dim)
    w["wo"] = take(layers, dim, dim)
    w["rms_ffn"] = take(layers, dim)
    w["w1"] = take(layers, hidden, dim)
    w["w2"] = take(layers, dim, hidden)
    w["w3"] = take(layers, hidden, dim)
    w["rms_final"] = take(dim)
    w["cos"] = take(seq_len, hs // 2)
    w["sin"] = take(seq_len, hs // 2)
    w["cls"] = w["emb"] if shared else take(vocab, dim)
    if at != floats.numel():
        sys.exit(f"{path}: {floats.numel() - at} floats past the model the header describes")
    cfg = dict(dim=dim, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
               vocab=vocab, seq_len=seq_len, hs=hs, kv=kv)
    return cfg, w


class Model:
    """llama2.c's forward pass (run.c), one token, static caches, device token and position."""

    def __init__(self, cfg, w):
        dev = torch.device("cuda")
        self.c = cfg
        self.w = {k: v.to(dev).contiguous() for k, v in w.items()}
        L, T, kv = cfg["layers"], cfg["seq_len"], cfg["kv"]
        self.k_cache = torch.zeros(L, T, kv, device=dev)
        self.v_cache = torch.zeros(L, T, kv, device=dev)
        self.positions = torch.arange(T, device=dev)
        self.token = torch.ones(1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.history = torch.zeros(T, dtype=torch.long, device=dev)
        self.gap = torch.zeros(T, device=dev)

    def reset(self):
        self.k_cache.zero_()
        self.v_cache.zero_()
        self.token.fill_(1)
        self.pos.zero_()
        self.history.zero_()

    @staticmethod
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def rope(self, x, n, cos, sin):
        hs = self.c["hs"]
        x = x.view(n, hs // 2, 2)
        x0, x1 = x[..., 0], x[..., 1]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), -1).reshape(n * hs)

    def step(self):
        c, w = self.c, self.w
        H, KH, hs, T = c["heads"], c["kv_heads"], c["hs"], c["seq_len"]
        x = w["emb"].index_select(0, self.token)[0]
        cos = w["cos"].index_select(0, self.pos)
        sin = w["sin"].index_select(0, self.pos)
        masked = (self.positions > self.pos).view(1, 1, T)
        for l in range(c["layers"]):
            xb = self.rms(x, w["rms_att"][l])
            q = self.rope(w["wq"][l] @ xb, H, cos, sin)
            k = self.rope(w["wk"][l] @ xb, KH, cos, sin)
            v = w["wv"][l] @ xb
            self.k_cache[l].index_copy_(0, self.pos, k.view(1, -1))
            self.v_cache[l].index_copy_(0, self.pos, v.view(1, -1))
            keys = self.k_cache[l].view(T, KH, hs).transpose(0, 1)  # KH x T x hs
            values = self.v_cache[l].view(T, KH, hs).transpose(0, 1)
            qh = q.view(KH, H // KH, hs)
            scores = (qh @ keys.transpose(1, 2)) / (hs ** 0.5)  # KH x group x T
            scores = scores.masked_fill(masked, float("-inf"))
            att = torch.softmax(scores, -1) @ values  # KH x group x hs
            x = x + w["wo"][l] @ att.reshape(-1)
            xb = self.rms(x, w["rms_ffn"][l])
            x = x + w["w2"][l] @ (torch.nn.functional.silu(w["w1"][l] @ xb) * (w["w3"][l] @ xb))
        logits = w["cls"] @ self.rms(x, w["rms_final"])
        top = torch.topk(logits, 2).values
        nxt = torch.argmax(logits).view(1)
        self.gap.index_copy_(0, self.pos, (top[0] - top[1]).view(1))
        self.history.index_copy_(0, self.pos, nxt)
        self.token.copy_(nxt)
        self.pos.add_(1)


def timed(model, steps, issue):
    model.reset()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = 0.0
    t0 = time.perf_counter()
    start.record()
    for _ in range(steps):
        t = time.perf_counter()
        issue()
        host += time.perf_counter() - t
    end.record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return steps / wall, 1e6 * host / steps, 1e3 * start.elapsed_time(end) / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--expect")
    a = ap.parse_args()
    cfg, w = load(a.checkpoint)
    steps = min(a.steps, cfg["seq_len"])
    expect = None
    if a.expect:
        with open(a.expect) as f:
            expect = [int(line) for line in f if line.strip()][:steps]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; {cfg}; {steps} tokens from BOS")
    model = Model(cfg, w)
    rows = []

    def verdict(name):
        got = model.history[:steps].tolist()
        if expect is None:
            return "not compared"
        for i, (g, e) in enumerate(zip(got, expect)):
            if g != e:
                return f"token {i} is {g}, the Rust side's {e} (top-two gap {model.gap[i].item():.3e})"
        return f"{len(expect)} identical to the Rust side's"

    with torch.inference_mode():
        timed(model, steps, model.step)  # warm-up: kernels, cuBLAS handles
        r = timed(model, steps, model.step)
        rows.append(("torch eager", *r, verdict("eager")))

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model.reset()
                model.step()
        torch.cuda.current_stream().wait_stream(s)
        model.reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model.step()
        r = timed(model, steps, graph.replay)
        rows.append(("torch CUDA graph, static step", *r, verdict("graph")))

        try:
            compiled = torch.compile(model.step, mode="reduce-overhead", fullgraph=False)
            for _ in range(3):
                timed(model, min(steps, 8), compiled)
            r = timed(model, steps, compiled)
            rows.append(("torch.compile reduce-overhead", *r, verdict("compile")))
        except Exception as e:  # the compiler needs a toolchain the machine may lack
            rows.append(("torch.compile reduce-overhead", 0.0, 0.0, 0.0, f"did not run: {type(e).__name__}: {str(e)[:120]}"))

    print("| mode | tok/s | host us/token | GPU us/token | tokens |")
    print("| --- | --- | --- | --- | --- |")
    for name, tps, host, gpu, note in rows:
        print(f"| {name} | {tps:.0f} | {host:.1f} | {gpu:.1f} | {note} |")
    if expect is not None and any("identical" not in row[4] and "did not run" not in row[4] for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
