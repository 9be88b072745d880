"""The PyTorch peer of `recipes/benchmark.lua --device=cuda --compare=torch`.

usage:
  python3 tools/peers/bench_bert_torch.py --layers L --hidden H --heads A --seq S --batch B
      --steps N [--warmup W] [--vocab V] [--masked P] [--dropout D] [--infer]
      [--device cuda:0] [--precision fp32|tf32|bf16] [--attention sdpa|math] [--threads T]

Times the step recipes/benchmark.lua times, on the same shapes and batch
layout: BertForPreTraining of tools/peers/bert_reference.py (the same
architecture), forward, MLM decoder on the masked positions only (P per
sequence), NSP, backward and a plain SGD update of all parameters (one
multi-tensor _foreach_add_, like bertlua's single update of its flat buffer);
with --infer the encoder forward only, under inference_mode. The last S/8
tokens of every sequence are padding.
Precision as people run it: bf16 = torch.autocast(bfloat16) around the
forward (weights and gradients f32), tf32 = f32 with TF32 matmuls, fp32 =
strict f32. Attention uses F.scaled_dot_product_attention (fused kernels)
unless --attention=math (the reference's explicit softmax).
Prints "torch: X seq/s (Y ms/step, ...)" and the peak memory. Exit 77 when
torch or a CUDA device is missing.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
    import torch.nn.functional as F
    import bert_reference as ref  # noqa: E402  (exits 77 itself without torch/numpy)
except Exception as e:  # noqa: BLE001
    print(f"skipped: torch not importable by {sys.executable}: {e}")
    sys.exit(77)


def main(argv):
    ap = argparse.ArgumentParser()
    for k, v in [("layers", 4), ("hidden", 256), ("heads", 4), ("seq", 128), ("batch", 32), ("steps", 10),
                 ("threads", 4), ("vocab", 30522), ("masked", 20), ("warmup", 2)]:
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--infer", action="store_true")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--attention", default="sdpa", choices=["sdpa", "math"])
    ap.add_argument("--lr", type=float, default=1e-4)
    a = ap.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("skipped: torch sees no CUDA device")
        sys.exit(77)
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    tf32 = a.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    model = ref.BertForPreTraining(ref.bench_config(a))
    if a.attention == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        print(f"note: torch {torch.__version__} has no scaled_dot_product_attention; using --attention=math")
        a.attention = "math"
    if a.attention == "sdpa":
        for layer in model.bert.encoder.layer:
            layer.attention.self.__class__ = ref.SdpaSelfAttention
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    model.to(dev)
    model.train(not a.infer)
    B, S = a.batch, a.seq
    ids, mask, labels, nsp = ref.bench_batch(B, S, a.vocab, a.masked, getattr(a, "lengths", None))
    ids, mask, labels, nsp = ids.to(dev), mask.to(dev), labels.to(dev), nsp.to(dev)
    types = torch.zeros_like(ids)
    sel = (labels.reshape(-1) != -1).nonzero().squeeze(1)   # the masked positions, once
    mlm_labels = labels.reshape(-1)[sel]
    params = [p for p in model.parameters()]
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16")

    def step():
        with amp:
            hs, pooled = model.bert(ids, types, mask)
            if a.infer:
                return
            x = hs[-1].reshape(-1, a.hidden).index_select(0, sel)
            t = model.cls.predictions.transform(x)
            logits = t @ model.bert.embeddings.word_embeddings.weight.t() + model.cls.predictions.bias
            loss = F.cross_entropy(logits.float(), mlm_labels) + \
                F.cross_entropy(model.cls.seq_relationship(pooled).float(), nsp)
        for p in params:
            p.grad = None
        loss.backward()
        with torch.no_grad():
            torch._foreach_add_(params, [p.grad for p in params], alpha=-a.lr)

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    ctx = torch.inference_mode() if a.infer else torch.enable_grad()
    with ctx:
        for _ in range(a.warmup):
            step()
        sync()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        sync()
        dt = time.perf_counter() - t0
    mem = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan")
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"torch: {B * a.steps / dt:.2f} seq/s ({dt / a.steps * 1000:.2f} ms/step, {name}, {a.precision}, "
          f"attention {a.attention}, {'inference' if a.infer else 'training'}; peak memory {mem:.2f} GiB; "
          f"torch {torch.__version__})")


if __name__ == "__main__":
    main(sys.argv[1:])
