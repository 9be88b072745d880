"""PyTorch reference for tests/c/test_ops_torch.c.

usage: /usr/bin/python3 tests/py/ops_reference.py FILE
FILE holds records written by the C test: u32 name length, name (utf-8),
u32 ndim, ndim x i64 shape, f32 data. Names are "<case>.<tensor>"; inputs
and the C op's outputs (forward and backward) of each case. This script
recomputes every output with torch (float64, autograd for the backward)
and compares. Exit 0 when all match, 1 on a mismatch, 77 without torch.
"""
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001
    print(f"skipped: torch/numpy not importable by {sys.executable}: {e}")
    sys.exit(77)

torch.set_num_threads(1)


def load(path):
    recs = {}
    with open(path, "rb") as f:
        data = f.read()
    off = 0
    while off < len(data):
        (n,) = struct.unpack_from("<I", data, off); off += 4
        name = data[off:off + n].decode(); off += n
        (nd,) = struct.unpack_from("<I", data, off); off += 4
        shape = struct.unpack_from("<%dq" % nd, data, off); off += 8 * nd
        cnt = int(np.prod(shape)) if nd else 1
        arr = np.frombuffer(data, dtype="<f4", count=cnt, offset=off).reshape(shape)
        off += 4 * cnt
        recs[name] = torch.tensor(arr.astype(np.float64))
    return recs


R = None
failures = []


def inp(case, name, grad=False):
    t = R[f"{case}.{name}"].clone()
    return t.requires_grad_(grad)


def compare(case, name, ref, rtol=1e-4, atol=2e-5):
    got = R[f"{case}.{name}"]
    ref = ref.detach().reshape(got.shape)
    err = (got - ref).abs()
    bound = atol + rtol * ref.abs()
    ok = bool((err <= bound).all())
    print(f"{'ok  ' if ok else 'FAIL'} {case}.{name}: max abs err {err.max().item():.3g}")
    if not ok:
        failures.append(f"{case}.{name}")


def run_case(case, fn, inputs, outputs, grads):
    """fn(*inputs) -> forward result; dy is case.dy; grads: names of inputs with .grad compared as d<name>."""
    xs = [inp(case, n, n in grads) for n in inputs]
    y = fn(*xs)
    compare(case, outputs, y)
    if grads:
        y.backward(inp(case, "dy"))
        for n, x in zip(inputs, xs):
            if n in grads:
                compare(case, "d" + n, x.grad)


def main(path):
    global R
    R = load(path)
    run_case("linear", lambda x, w, b: F.linear(x, w, b), ["x", "w", "b"], "y", {"x", "w", "b"})
    run_case("layernorm", lambda x, g, b: F.layer_norm(x, (x.shape[-1],), g, b, 1e-12),
             ["x", "g", "b"], "y", {"x", "g", "b"})
    run_case("residual_layernorm", lambda x, r, g, b: F.layer_norm(x + r, (x.shape[-1],), g, b, 1e-12),
             ["x", "r", "g", "b"], "y", {"x", "r", "g", "b"})
    run_case("gelu", lambda x: F.gelu(x), ["x"], "y", {"x"})
    run_case("bias_gelu", lambda x, b: F.gelu(x + b), ["x", "b"], "y", {"x", "b"})
    run_case("tanh", lambda x: torch.tanh(x), ["x"], "y", {"x"})
    run_case("softmax", lambda x, m: torch.softmax(x + m, dim=-1), ["x", "m"], "y", {"x"})

    # Attention as Hugging Face BertSelfAttention computes it (eval mode):
    # [B,S,H] -> [B,heads,S,d]; scores/sqrt(d) + (1-mask)*-10000; softmax; @V.
    heads = int(R["attention.heads"].item())

    def attention(q, k, v, mask):
        B, S, H = q.shape
        d = H // heads
        split = lambda t: t.view(B, S, heads, d).permute(0, 2, 1, 3)
        scores = split(q) @ split(k).transpose(-1, -2) / d ** 0.5
        scores = scores + ((1.0 - mask) * -10000.0)[:, None, None, :]
        probs = torch.softmax(scores, dim=-1)
        ctx = probs @ split(v)
        return ctx.permute(0, 2, 1, 3).reshape(B, S, H)
    run_case("attention", attention, ["q", "k", "v", "mask"], "ctx", {"q", "k", "v"})

    logits = inp("ce", "logits", True)
    tgt = R["ce.targets"].long()
    loss = F.cross_entropy(logits, tgt, ignore_index=-100)
    compare("ce", "loss", loss)
    loss.backward()
    compare("ce", "dlogits", logits.grad)

    pred = inp("mse", "pred", True)
    loss = F.mse_loss(pred.view(-1), inp("mse", "target"))
    compare("mse", "loss", loss)
    loss.backward()
    compare("mse", "dpred", pred.grad)

    table = inp("embedding", "table", True)
    ids = R["embedding.ids"].long()
    out = F.embedding(ids, table)
    compare("embedding", "y", out)
    out.backward(inp("embedding", "dy"))
    compare("embedding", "dtable", table.grad)

    if failures:
        print("mismatches:", ", ".join(failures))
        return 1
    print(f"all outputs match torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
