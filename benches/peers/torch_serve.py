"""The peer of examples/serve: the same decoder shape (d 512, 8 layers, 8 heads, MLP 1408, vocab
32 000, fp32) in PyTorch, served as vLLM serves it: one `torch.cuda.CUDAGraph` per batch bucket
(1, 2, 4, 8, 16, 32, 64), all captured at start-up into one shared memory pool, each step padded
to the smallest bucket that holds the active sequences, static input buffers written before each
replay.

    python3 benches/peers/torch_serve.py [REQUESTS] [SEED]

Prints start-up (capturing every bucket), the graph pool's memory after each bucket, steady-state
tokens per second at each batch size, and the continuous-batching loop's tokens per second on the
same seeded request mix as the Rust example (prompt 4-16 tokens, 8-64 generated, a few arriving
per step). The weights are random (not the Rust side's), so tokens are not compared. The work per
token is the same but for attention: a graph replays static shapes, so each row attends over all
96 cache rows, masked past its position (reading the whole cache of each row, every layer),
where the Rust kernels read rows 0..=position; at large batches this moves more memory than the
weights do. Servers replace this with paged-attention kernels; plain PyTorch has none.
"""

import sys
import time

import torch

D, LAYERS, HEADS, MLP, VOCAB = 512, 8, 8, 1408, 32000
HD = D // HEADS
BUCKETS = [1, 2, 4, 8, 16, 32, 64]
ROWS, SLOTS, MAX_T = 64, 64, 96
ALL_SLOTS = SLOTS + ROWS


def requests(n, seed):
    """The Rust example's generator (a 64-bit LCG), so the request mix is the same."""
    mask = (1 << 64) - 1
    s = (seed * 6364136223846793005 + 1) & mask

    def nxt(m):
        nonlocal s
        s = (s * 6364136223846793005 + 1442695040888963407) & mask
        return (s >> 33) % m

    out, at = [], 0
    for _ in range(n):
        at += nxt(3)
        length = 4 + nxt(13)
        prompt = [nxt(VOCAB) for _ in range(length)]
        out.append(dict(prompt=prompt, generate=8 + nxt(57), arrives=at))
    return out


class Model:
    def __init__(self):
        dev = torch.device("cuda")
        g = torch.Generator(device=dev).manual_seed(1)
        w = D ** -0.5

        def rand(*shape, scale):
            return (torch.rand(*shape, device=dev, generator=g) * 2 - 1) * scale

        self.emb = rand(VOCAB, D, scale=1.0)
        self.layers = [
            dict(
                wqkv=rand(3 * D, D, scale=w),
                wo=rand(D, D, scale=w),
                wgu=rand(2 * MLP, D, scale=w),
                wd=rand(D, MLP, scale=MLP ** -0.5),
                k=torch.zeros(ALL_SLOTS, MAX_T, HEADS, HD, device=dev),
                v=torch.zeros(ALL_SLOTS, MAX_T, HEADS, HD, device=dev),
            )
            for _ in range(LAYERS)
        ]
        self.lm = rand(VOCAB, D, scale=w)
        self.tokens = torch.zeros(ALL_SLOTS, MAX_T, dtype=torch.long, device=dev)
        self.pos = torch.zeros(ALL_SLOTS, dtype=torch.long, device=dev)
        self.prompt_len = torch.ones(ALL_SLOTS, dtype=torch.long, device=dev)
        self.rows_slot = torch.arange(SLOTS, SLOTS + ROWS, device=dev)
        self.t = torch.arange(MAX_T, device=dev)
        inv = 10000.0 ** (-torch.arange(0, HD, 2, device=dev, dtype=torch.float32) / HD)
        self.inv_freq = inv

    @staticmethod
    def rms(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)

    def rope(self, x, p):  # x: B x H x HD, p: B
        f = p[:, None].float() * self.inv_freq[None, :]  # B x HD/2
        c, s = torch.cos(f)[:, None, :], torch.sin(f)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), -1).flatten(-2)

    def step(self, b):
        slots = self.rows_slot[:b]
        p = self.pos[slots]
        x = self.emb[self.tokens[slots, p]]
        for l in self.layers:
            qkv = self.rms(x) @ l["wqkv"].T
            q, k, v = qkv.view(b, 3, HEADS, HD).unbind(1)
            q, k = self.rope(q, p), self.rope(k, p)
            l["k"][slots, p] = k
            l["v"][slots, p] = v
            keys, vals = l["k"][slots], l["v"][slots]  # B x T x H x HD
            scores = torch.einsum("bhd,bthd->bht", q, keys) * HD ** -0.5
            scores = scores.masked_fill(self.t[None, None, :] > p[:, None, None], float("-inf"))
            att = torch.einsum("bht,bthd->bhd", torch.softmax(scores, -1), vals)
            x = x + att.reshape(b, D) @ l["wo"].T
            gu = self.rms(x) @ l["wgu"].T
            x = x + (torch.nn.functional.silu(gu[:, :MLP]) * gu[:, MLP:]) @ l["wd"].T
        nxt = torch.argmax(self.rms(x) @ self.lm.T, -1)
        plen = self.prompt_len[slots]
        after_prompt = (p + 1) >= plen
        # A padding row's slot (prompt length 0) stays at position 0, as on the Rust side.
        room = ((p + 1) < MAX_T) & (plen > 0)
        q = torch.clamp(p + 1, max=MAX_T - 1)
        self.tokens[slots, q] = torch.where(after_prompt & room, nxt, self.tokens[slots, q])
        self.pos[slots] = torch.where(room, p + 1, p)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; buckets {BUCKETS}")
    with torch.inference_mode():
        m = Model()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for b in BUCKETS:
                m.step(b)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        graphs = {}
        t0 = time.perf_counter()
        lines = []
        for b in reversed(BUCKETS):  # largest first, as vLLM does, so smaller ones reuse memory
            tb = time.perf_counter()
            before = torch.cuda.memory_reserved()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                m.step(b)
            torch.cuda.synchronize()
            graphs[b] = g
            lines.append(f"{b}: {1e3 * (time.perf_counter() - tb):.1f} ms, +{(torch.cuda.memory_reserved() - before) / 2**20:.1f} MiB")
        startup = time.perf_counter() - t0
        print(f"start-up: {len(BUCKETS)} buckets captured in {startup * 1e3:.1f} ms ({'; '.join(lines)})")

        print("| batch | tok/s | us per step |")
        print("| --- | --- | --- |")
        for b in BUCKETS:
            m.rows_slot.copy_(torch.arange(ROWS, device="cuda"))
            m.pos.zero_()
            m.prompt_len.fill_(1)
            graphs[b].replay()
            torch.cuda.synchronize()
            m.pos.zero_()
            t = time.perf_counter()
            for _ in range(64):
                graphs[b].replay()
            torch.cuda.synchronize()
            secs = time.perf_counter() - t
            print(f"| {b} | {b * 64 / secs:.0f} | {secs * 1e6 / 64:.1f} |")

        reqs = requests(n, seed)
        generated = sum(r["generate"] for r in reqs)
        m.pos.zero_()
        m.prompt_len.fill_(0)
        slots = [None] * SLOTS
        nxt_req, done, step, ran = 0, 0, 0, 0
        t = time.perf_counter()
        while done < len(reqs):
            for i in range(SLOTS):
                if nxt_req == len(reqs) or reqs[nxt_req]["arrives"] > step:
                    break
                if slots[i] is None:
                    r = reqs[nxt_req]
                    row = torch.zeros(MAX_T, dtype=torch.long)
                    row[: len(r["prompt"])] = torch.tensor(r["prompt"])
                    m.tokens[i].copy_(row)
                    m.pos[i] = 0
                    m.prompt_len[i] = len(r["prompt"])
                    slots[i] = [nxt_req, len(r["prompt"]) + r["generate"] - 1]
                    nxt_req += 1
            live = [i for i in range(SLOTS) if slots[i] is not None]
            if not live:
                step += 1
                continue
            ran += 1
            b = next(x for x in BUCKETS if x >= len(live))
            mapping = live + list(range(SLOTS + len(live), SLOTS + ROWS))
            m.rows_slot.copy_(torch.tensor(mapping))
            graphs[b].replay()
            step += 1
            for i in live:
                slots[i][1] -= 1
                if slots[i][1] == 0:
                    torch.cuda.synchronize()
                    _ = m.tokens[i].tolist()
                    slots[i] = None
                    done += 1
        torch.cuda.synchronize()
        secs = time.perf_counter() - t
        print(f"torch graphs, continuous batching: {n} requests, {ran} steps, {generated / secs:.0f} tok/s, {secs * 1e6 / ran:.1f} us per step")


if __name__ == "__main__":
    main()
