"""PyTorch side of the per-op CPU benchmark (recipes/benchmark_ops.lua).

usage: /usr/bin/python3 tools/peers/bench_ops_torch.py --threads=2 --size=base [--reps=7]

Times, in float32 on the CPU with --threads intra-op threads, the PyTorch
equivalents of the bertlua ops one BERT training step is made of, on the
same shapes as recipes/benchmark_ops.lua, written the way Hugging Face's
BertModel computes them (the reference users compare against):
  linear            F.linear, backward by autograd (dx, dW, db)
  attention         view/transpose into heads, Q K^T / sqrt(d) + extended
                    mask, softmax, dropout, P V, back to [B, S, H]
  bias_gelu         F.gelu(x + b) (exact erf)
  residual_ln       F.layer_norm(F.dropout(x) + residual)
  dropout           F.dropout
  cross_entropy     F.cross_entropy on the MLM logits (forward + dlogits)
  add / mul / scale tensor arithmetic on [B, S, H]
Prints one line per op, "torch <op> <median ms> <min ms>", the median over
--reps timed repetitions after one untimed warm-up. "fwdbwd" rows time the
forward and the backward together.
"""
import argparse
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001
    print(f"skipped: torch not importable by {sys.executable}: {e}")
    sys.exit(77)

SIZES = {
    # batch, seq, hidden, intermediate, heads, vocab, masked positions per sequence
    "base": dict(B=8, S=128, H=768, I=3072, NH=12, V=30528, M=20),
    "mini": dict(B=32, S=128, H=256, I=1024, NH=4, V=30528, M=20),
}


def timeit(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), min(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", default="base", choices=sorted(SIZES))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", default="", help="comma-separated op names (default all)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    z = SIZES[a.size]
    B, S, H, I, NH, V, M = z["B"], z["S"], z["H"], z["I"], z["NH"], z["V"], z["M"]
    d, p = H // NH, 0.1
    only = set(filter(None, a.only.split(",")))
    print(f"torch {torch.__version__} threads {torch.get_num_threads()} size {a.size} "
          f"B={B} S={S} H={H} I={I} heads={NH}", flush=True)

    def report(name, fn):
        if only and name not in only:
            return
        med, mn = timeit(fn, a.reps)
        print(f"torch {name} {med:.3f} {mn:.3f}", flush=True)

    def rn(*shape, grad=False):
        return torch.randn(*shape, dtype=torch.float32).requires_grad_(grad)

    # ---- linear H -> I and I -> H
    for name, fin, fout in (("linear_h_i", H, I), ("linear_i_h", I, H)):
        x, w, b = rn(B * S, fin, grad=True), rn(fout, fin, grad=True), rn(fout, grad=True)
        dy = rn(B * S, fout)
        with torch.no_grad():
            report(name + "_fwd", lambda: F.linear(x, w, b))

        def lin_fb(x=x, w=w, b=b, dy=dy):
            y = F.linear(x, w, b)
            torch.autograd.grad(y, (x, w, b), dy)
        report(name + "_fwdbwd", lin_fb)

    # ---- attention (Hugging Face BertSelfAttention after the Q/K/V linears)
    q, k, v = rn(B, S, H, grad=True), rn(B, S, H, grad=True), rn(B, S, H, grad=True)
    keym = torch.ones(B, S)
    keym[:, S - S // 8:] = 0  # last S/8 tokens padded, as in recipes/benchmark.lua
    ext = ((1.0 - keym) * -10000.0)[:, None, None, :]
    dctx = rn(B, S, H)

    def heads(t):
        return t.view(B, S, NH, d).transpose(1, 2)

    def attn():
        sc = torch.matmul(heads(q), heads(k).transpose(-1, -2)) / (d ** 0.5) + ext
        pr = F.dropout(torch.softmax(sc, dim=-1), p, True)
        return torch.matmul(pr, heads(v)).transpose(1, 2).reshape(B, S, H)
    with torch.no_grad():
        report("attention_fwd", attn)
    report("attention_fwdbwd", lambda: torch.autograd.grad(attn(), (q, k, v), dctx))

    # ---- bias + GELU on the intermediate activations
    x, b, dy = rn(B, S, I, grad=True), rn(I, grad=True), rn(B, S, I)
    with torch.no_grad():
        report("bias_gelu_fwd", lambda: F.gelu(x + b))
    report("bias_gelu_fwdbwd", lambda: torch.autograd.grad(F.gelu(x + b), (x, b), dy))

    # ---- dropout + residual + LayerNorm (BertSelfOutput / BertOutput tail)
    x, r, g, be, dy = rn(B, S, H, grad=True), rn(B, S, H, grad=True), rn(H, grad=True), rn(H, grad=True), rn(B, S, H)

    def rln():
        return F.layer_norm(F.dropout(x, p, True) + r, (H,), g, be, 1e-12)
    with torch.no_grad():
        report("residual_ln_fwd", rln)
    report("residual_ln_fwdbwd", lambda: torch.autograd.grad(rln(), (x, r, g, be), dy))

    # ---- plain LayerNorm (embeddings) and dropout
    report("layernorm_fwdbwd", lambda: torch.autograd.grad(F.layer_norm(x, (H,), g, be, 1e-12), (x, g, be), dy))
    report("dropout_fwdbwd", lambda: torch.autograd.grad(F.dropout(x, p, True), (x,), dy))

    # ---- MLM cross-entropy over the vocabulary on the masked positions
    logits = rn(B * M, V, grad=True)
    tgt = torch.randint(0, V, (B * M,))
    report("cross_entropy", lambda: torch.autograd.grad(F.cross_entropy(logits, tgt), (logits,)))

    # ---- tensor arithmetic on activations
    xa, xb = rn(B, S, H), rn(B, S, H)
    report("add", lambda: xa + xb)
    report("mul", lambda: xa * xb)
    report("scale", lambda: xa * 0.5)


if __name__ == "__main__":
    main()
