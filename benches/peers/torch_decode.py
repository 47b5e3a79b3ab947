"""The peer of examples/decode: the same GPT-style decoder in PyTorch, fp32, batch 1, a 16-token
prompt fed token by token and 256 tokens generated (271 steps), run eagerly and as a
`torch.cuda.CUDAGraph` replayed once per step with static input buffers (the usual way).

    python3 benches/peers/torch_decode.py [tiny|small|all] [RUNS]

Prints the same CSV rows as the Rust example (`decode,<config>,torch-<mode>,...`): tokens per
second, host time to issue one token (µs), GPU time per token (µs, CUDA events), kernels per token
(counted with the profiler once) and a checksum of the tokens. The weights differ from the Rust
side's (random either way); the work per token is the same: per layer RMSNorm, fused QKV
projection, rotary embedding, K/V cache append, attention of the new token over the cache, output
projection + residual, RMSNorm, SiLU-gated MLP (fused gate/up) + residual; final norm, LM head,
argmax on the device.
"""

import statistics
import sys
import time

import torch

PROMPT, GENERATE = 16, 256
MAX_T = PROMPT + GENERATE
STEPS = PROMPT + GENERATE - 1
CONFIGS = {
    "tiny": dict(d=512, layers=8, heads=8, mlp=1408, vocab=32000),
    "small": dict(d=2048, layers=16, heads=16, mlp=5632, vocab=32000),
}


class Decoder:
    def __init__(self, d, layers, heads, mlp, vocab):
        dev = torch.device("cuda")
        g = torch.Generator(device=dev).manual_seed(1)
        w = d ** -0.5

        def rand(*shape, scale):
            return (torch.rand(*shape, device=dev, generator=g) * 2 - 1) * scale

        self.d, self.heads, self.hd, self.mlp, self.vocab = d, heads, d // heads, mlp, vocab
        self.layers = [
            dict(
                attn_norm=torch.ones(d, device=dev),
                wqkv=rand(3 * d, d, scale=w),
                wo=rand(d, d, scale=w),
                mlp_norm=torch.ones(d, device=dev),
                w_gate_up=rand(2 * mlp, d, scale=w),
                w_down=rand(d, mlp, scale=mlp ** -0.5),
                k_cache=torch.zeros(MAX_T, heads, self.hd, device=dev),
                v_cache=torch.zeros(MAX_T, heads, self.hd, device=dev),
            )
            for _ in range(layers)
        ]
        self.embedding = rand(vocab, d, scale=1.0)
        self.final_norm = torch.ones(d, device=dev)
        self.lm_head = rand(vocab, d, scale=w)
        half = self.hd // 2
        self.inv_freq = 10000.0 ** (-2.0 * torch.arange(half, device=dev, dtype=torch.float32) / self.hd)
        self.positions = torch.arange(MAX_T, device=dev)
        # Static inputs: the step reads the position and the tokens from device memory.
        # A one-element tensor, never a 0-d one: indexing with a 0-d tensor calls `.item()`,
        # a host sync that a capture refuses.
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.tokens = torch.zeros(MAX_T, dtype=torch.long, device=dev)
        self.prompt_len = torch.tensor(PROMPT, device=dev)

    def reset(self):
        prompt = [(i * 7919 + 13) % self.vocab for i in range(PROMPT)]
        self.tokens.zero_()
        self.tokens[:PROMPT] = torch.tensor(prompt, device=self.tokens.device)
        self.pos.zero_()
        for l in self.layers:
            l["k_cache"].zero_()
            l["v_cache"].zero_()

    @staticmethod
    def rmsnorm(x, w):
        return x * torch.rsqrt(x.pow(2).mean() + 1e-5) * w

    def rope(self, t, cos, sin):
        half = self.hd // 2
        a, b = t[..., :half], t[..., half:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)

    def step(self):
        d, h, hd = self.d, self.heads, self.hd
        x = self.embedding.index_select(0, self.tokens.index_select(0, self.pos)).view(d)
        angle = self.pos.float() * self.inv_freq
        cos, sin = torch.cos(angle), torch.sin(angle)
        mask = self.positions <= self.pos
        for l in self.layers:
            hx = self.rmsnorm(x, l["attn_norm"])
            q, k, v = torch.mv(l["wqkv"], hx).view(3, h, hd)
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            l["k_cache"].index_copy_(0, self.pos, k.unsqueeze(0))
            l["v_cache"].index_copy_(0, self.pos, v.unsqueeze(0))
            scores = torch.einsum("hd,thd->ht", q, l["k_cache"]) * hd ** -0.5
            scores = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            attn = torch.einsum("ht,thd->hd", scores, l["v_cache"]).reshape(d)
            x = x + torch.mv(l["wo"], attn)
            hx = self.rmsnorm(x, l["mlp_norm"])
            gate, up = torch.mv(l["w_gate_up"], hx).split(self.mlp)
            x = x + torch.mv(l["w_down"], torch.nn.functional.silu(gate) * up)
        logits = torch.mv(self.lm_head, self.rmsnorm(x, self.final_norm))
        nxt = torch.argmax(logits).view(1)
        at = self.pos + 1
        # The prompt gives the next token while it lasts; then the argmax does.
        given = self.tokens.index_select(0, at)
        self.tokens.index_copy_(0, at, torch.where(at < self.prompt_len, given, nxt))
        self.pos.add_(1)


def checksum(tokens):
    h = 0xCBF29CE484222325
    for t in tokens:
        h = ((h ^ (t & 0xFFFFFFFF)) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def kernels_per_step(m):
    from torch.profiler import ProfilerActivity, profile

    m.reset()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        m.step()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def run(m, mode, graph):
    m.reset()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = 0.0
    t0 = time.perf_counter()
    start.record()
    for _ in range(STEPS):
        t = time.perf_counter()
        if mode == "eager":
            m.step()
        else:
            graph.replay()
        host += time.perf_counter() - t
    end.record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return m.tokens.tolist(), wall, host, start.elapsed_time(end)


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    names = ["tiny", "small"] if which == "all" else [which]
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}; medians of {runs} runs")
    for name in names:
        m = Decoder(**CONFIGS[name])
        kernels = kernels_per_step(m)
        # Capture one step (after warm-up on a side stream, as PyTorch's docs do it).
        m.reset()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                m.step()
        torch.cuda.current_stream().wait_stream(side)
        m.reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            m.step()
        tokens_by_mode = {}
        for mode in ["eager", "cuda-graph"]:
            run(m, mode, graph)  # warm-up
            results = [run(m, mode, graph) for _ in range(runs)]
            tokens = results[0][0]
            tokens_by_mode[mode] = tokens
            wall = statistics.median(r[1] for r in results)
            host = statistics.median(r[2] for r in results)
            gpu = statistics.median(r[3] for r in results)
            print(
                f"decode,{name},torch-{mode},{STEPS / wall:.1f},{host / STEPS * 1e6:.2f},"
                f"{gpu / STEPS * 1e3:.1f},{kernels},{checksum(tokens):016x}"
            )
        if tokens_by_mode["eager"] != tokens_by_mode["cuda-graph"]:
            print(f"# {name}: torch eager and CUDA-graph tokens differ", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
