"""An independent BERT in plain PyTorch (no transformers), for whole-model
parity tests and speed comparisons of bertlua.

usage:
  /usr/bin/python3 tools/peers/bert_reference.py parity DIR
      DIR holds config.json, model.safetensors (HF names), batch.safetensors
      (input_ids, token_type_ids, attention_mask, masked_lm_labels [B,S] with
      -1 = not masked, next_sentence_labels, start_positions, end_positions,
      labels, num_labels...) and head.txt ("pretraining", "qa",
      "classification"). Runs forward + backward in float64 with dropout off
      and writes DIR/ref.safetensors: hidden.K (K = 0 embeddings .. L),
      the logits and losses of the head, and grad.<param name> for every
      parameter (gradient of the head's loss).
  /usr/bin/python3 tools/peers/bert_reference.py bench --layers L --hidden H --heads A
      --seq S --batch B --steps N --threads T [--vocab V] [--infer] [--masked P] [--rounds R]
      [--precision fp32|bf16] [--compile]
      Times the same training step as recipes/benchmark.lua (forward, backward,
      SGD update) in float32 (bf16: under torch.autocast) and prints "torch: X seq/s";
      --compile runs the encoder through torch.compile ("torch-compile: X seq/s"), the
      first call's compile time printed apart and not in the rate.
  /usr/bin/python3 tools/peers/bert_reference.py hf_save DIR     (needs transformers)
  /usr/bin/python3 tools/peers/bert_reference.py hf_check DIR    (needs transformers)

The model follows the original BERT / transformers BertForPreTraining exactly:
post-LayerNorm, erf GELU, additive mask (1 - m) * -10000, MLM decoder tied to
the word embeddings with its own bias, NSP on the tanh-pooled [CLS].
Exit code 77 (skip) when torch/numpy are missing.
"""
import json
import math
import os
import struct
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001
    print(f"skipped: torch/numpy not importable by {sys.executable}: {e}")
    sys.exit(77)

# ---------------------------------------------------------------- minimal safetensors
NP = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "U8": "u1", "BOOL": "u1"}


def st_load(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, en = e["data_offsets"]
        raw = data[base + b: base + en]
        if e["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=NP[e["dtype"]])
        out[name] = torch.from_numpy(arr.copy().reshape(e["shape"]))
    return out


def st_save(path, tensors):
    header, chunks, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype in (torch.float64, torch.float16):
            t = t.float()
        a = t.numpy()
        dt = {np.dtype("float32"): "F32", np.dtype("int64"): "I64", np.dtype("int32"): "I32"}[a.dtype]
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


# ---------------------------------------------------------------- the model
def act_fn(name):
    if name == "gelu":
        return lambda x: F.gelu(x)
    if name == "relu":
        return F.relu
    if name == "tanh":
        return torch.tanh
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    raise ValueError(name)


class Embeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], c["hidden_size"])
        self.token_type_embeddings = nn.Embedding(c["type_vocab_size"], c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.dropout = nn.Dropout(c["hidden_dropout_prob"])

    def forward(self, ids, types):
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand_as(ids)
        x = self.word_embeddings(ids) + self.position_embeddings(pos) + self.token_type_embeddings(types)
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h = c["hidden_size"]
        self.heads = c["num_attention_heads"]
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.dropout = nn.Dropout(c["attention_probs_dropout_prob"])

    def forward(self, x, ext_mask):
        B, S, H = x.shape
        d = H // self.heads

        def split(t):
            return t.view(B, S, self.heads, d).permute(0, 2, 1, 3)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d) + ext_mask
        p = self.dropout(torch.softmax(scores, dim=-1))
        return (p @ v).permute(0, 2, 1, 3).reshape(B, S, H)


class DenseLN(nn.Module):
    def __init__(self, c, n_in):
        super().__init__()
        self.dense = nn.Linear(n_in, c["hidden_size"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])
        self.dropout = nn.Dropout(c["hidden_dropout_prob"])

    def forward(self, h, res):
        return self.LayerNorm(self.dropout(self.dense(h)) + res)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = SelfAttention(c)
        self.output = DenseLN(c, c["hidden_size"])

    def forward(self, x, m):
        return self.output(self.self(x, m), x)


class Intermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["intermediate_size"])
        self.act = act_fn(c["hidden_act"])

    def forward(self, x):
        return self.act(self.dense(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = DenseLN(c, c["intermediate_size"])

    def forward(self, x, m):
        a = self.attention(x, m)
        return self.output(self.intermediate(a), a)


class Encoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])


class Pooler(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["hidden_size"])

    def forward(self, seq):
        return torch.tanh(self.dense(seq[:, 0]))


class Bert(nn.Module):
    def __init__(self, c, pooler=True):
        super().__init__()
        self.embeddings = Embeddings(c)
        self.encoder = Encoder(c)
        self.pooler = Pooler(c) if pooler else None

    def forward(self, ids, types, mask):
        ext = (1.0 - mask[:, None, None, :].to(self.embeddings.word_embeddings.weight.dtype)) * -10000.0
        hs = [self.embeddings(ids, types)]
        for layer in self.encoder.layer:
            hs.append(layer(hs[-1], ext))
        pooled = self.pooler(hs[-1]) if self.pooler is not None else None
        return hs, pooled


class Transform(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["hidden_size"])
        self.act = act_fn(c["hidden_act"])
        self.LayerNorm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"])

    def forward(self, x):
        return self.LayerNorm(self.act(self.dense(x)))


class Predictions(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transform = Transform(c)
        self.bias = nn.Parameter(torch.zeros(c["vocab_size"]))


class Heads(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.predictions = Predictions(c)
        self.seq_relationship = nn.Linear(c["hidden_size"], 2)


class BertForPreTraining(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = Bert(c)
        self.cls = Heads(c)

    def forward(self, b):
        hs, pooled = self.bert(b["input_ids"], b["token_type_ids"], b["attention_mask"])
        t = self.cls.predictions.transform(hs[-1])
        # the decoder over EVERY position (the Lua side gathers the masked ones first)
        logits = t @ self.bert.embeddings.word_embeddings.weight.t() + self.cls.predictions.bias
        labels = b["masked_lm_labels"]
        mlm = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-1)
        nsp_logits = self.cls.seq_relationship(pooled)
        nsp = F.cross_entropy(nsp_logits, b["next_sentence_labels"].reshape(-1))
        return hs, {"mlm_loss": mlm, "nsp_loss": nsp, "loss": mlm + nsp, "nsp_logits": nsp_logits}


class BertForQuestionAnswering(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = Bert(c, pooler=False)
        self.qa_outputs = nn.Linear(c["hidden_size"], 2)

    def forward(self, b):
        hs, _ = self.bert(b["input_ids"], b["token_type_ids"], b["attention_mask"])
        logits = self.qa_outputs(hs[-1])
        st, en = logits[..., 0], logits[..., 1]
        S = st.shape[1]
        sp = b["start_positions"].reshape(-1).clamp(0, S)
        ep = b["end_positions"].reshape(-1).clamp(0, S)
        ls = F.cross_entropy(st, sp, ignore_index=S)
        le = F.cross_entropy(en, ep, ignore_index=S)
        return hs, {"start_logits": st, "end_logits": en, "loss": (ls + le) / 2}


class BertForSequenceClassification(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = Bert(c)
        self.num_labels = c.get("num_labels", 2)
        self.dropout = nn.Dropout(c["hidden_dropout_prob"])
        self.classifier = nn.Linear(c["hidden_size"], self.num_labels)

    def forward(self, b):
        hs, pooled = self.bert(b["input_ids"], b["token_type_ids"], b["attention_mask"])
        logits = self.classifier(self.dropout(pooled))
        if self.num_labels == 1:
            loss = F.mse_loss(logits.reshape(-1), b["labels"].reshape(-1).to(logits.dtype))
        else:
            loss = F.cross_entropy(logits, b["labels"].reshape(-1))
        return hs, {"logits": logits, "loss": loss}


HEADS = {"pretraining": BertForPreTraining, "qa": BertForQuestionAnswering,
         "classification": BertForSequenceClassification}


def parity(d):
    torch.set_num_threads(1)
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    with open(os.path.join(d, "head.txt")) as f:
        head = f.read().strip()
    model = HEADS[head](c).double()
    w = st_load(os.path.join(d, "model.safetensors"))
    sd = model.state_dict()
    missing = [k for k in sd if k not in w]
    extra = [k for k in w if k not in sd]
    if missing or extra:
        print(f"FAIL: names differ: missing {missing}, unexpected {extra}")
        sys.exit(1)
    model.load_state_dict({k: v.double() for k, v in w.items()})
    model.eval()  # dropout off
    b = {k: (v.long() if v.dtype in (torch.int32, torch.int64) else v.double())
         for k, v in st_load(os.path.join(d, "batch.safetensors")).items()}
    hs, out = model(b)
    out["loss"].backward()
    res = {f"hidden.{i}": h for i, h in enumerate(hs)}
    for k, v in out.items():
        res[k] = v.reshape(-1) if v.dim() == 0 else v
    for name, p in model.named_parameters():
        res["grad." + name] = p.grad
    st_save(os.path.join(d, "ref.safetensors"), res)
    print(f"reference: {head} loss {out['loss'].item():.9g}")


# ---------------------------------------------------------------- benchmark
class SdpaSelfAttention(SelfAttention):
    """Same parameters as SelfAttention; torch 2's fused attention (scaled_dot_product_attention)."""

    def forward(self, x, ext_mask):
        B, S, H = x.shape
        d = H // self.heads

        def split(t):
            return t.view(B, S, self.heads, d).transpose(1, 2)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=ext_mask.to(q.dtype),
                                             dropout_p=self.dropout.p if self.training else 0.0)
        return ctx.transpose(1, 2).reshape(B, S, H)


def bench_config(a):
    """The model config of the torch benchmarks (here and tools/peers/bench_bert_torch.py) from their arguments."""
    return dict(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                intermediate_size=4 * a.hidden, max_position_embeddings=max(512, a.seq), type_vocab_size=2,
                hidden_dropout_prob=a.dropout, attention_probs_dropout_prob=a.dropout, layer_norm_eps=1e-12,
                hidden_act="gelu")


def bench_batch(B, S, vocab, masked, lengths=None):
    """The benchmark batch (as recipes/benchmark.lua lays it out): random ids, the last S/8 tokens of every
    sequence padding (or each row's real tokens first: lengths, a list of B), `masked` MLM labels per sequence
    (-1 elsewhere) and NSP labels, from a fixed seed. Returns ids, mask, labels, nsp on the CPU."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (B, S), generator=g)
    mask = torch.ones(B, S)
    if lengths is None:
        mask[:, S - S // 8:] = 0
    else:
        if len(lengths) != B or not all(0 < n <= S for n in lengths):
            raise SystemExit(f"bench: --lengths needs {B} lengths in 1..{S}, got {lengths}")
        for b, n in enumerate(lengths):
            mask[b, n:] = 0
    labels = torch.full((B, S), -1, dtype=torch.long)
    pos = torch.randint(1, S - S // 8, (B, masked), generator=g)
    labels.scatter_(1, pos, torch.randint(0, vocab, (B, masked), generator=g))
    nsp = torch.randint(0, 2, (B,), generator=g)
    return ids, mask, labels, nsp


def bench_args(argv):
    """The options recipes/benchmark.lua passes to its CPU peers (here and bench_bert_onnxruntime.py)."""
    import argparse
    ap = argparse.ArgumentParser()
    for k, v in [("layers", 4), ("hidden", 256), ("heads", 4), ("seq", 128), ("batch", 32), ("steps", 10),
                 ("threads", 1), ("vocab", 30522), ("masked", 20), ("warmup", 2)]:
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--infer", action="store_true")
    ap.add_argument("--lengths", type=lambda v: [int(x) for x in v.split(",")], default=None,
                    help="real tokens of each row (comma-separated; default: the last S/8 padded)")
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=1,
                    help="timed blocks, each after a line 'go' on stdin when > 1 (recipes/benchmark.lua --rounds)")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16", "int8"],
                    help="recipes/benchmark.lua's; each peer says what it runs for it")
    ap.add_argument("--compile", action="store_true", help="torch: the encoder through torch.compile")
    return ap.parse_args(argv)


def infer_peer(argv, peer, make):
    """main() of an inference-only peer of the ONNX encoder: argv parsed, the encoder exported (bench_encoder_onnx),
    make(raw, d, inputs, a) -> (step, line) builds the runtime (d: a scratch directory); the line printed, --warmup
    calls of step, then time_rounds. Returns the exit code."""
    import tempfile
    a = bench_args(argv)
    if not a.infer:
        print(f"{peer} peer: inference only (pass --infer)")
        return 2
    with tempfile.TemporaryDirectory() as d:
        raw = os.path.join(d, "bert.onnx")
        step, line = make(raw, d, bench_encoder_onnx(a, raw), a)
    print(line)
    for _ in range(a.warmup):
        step()
    time_rounds(a, peer, step)
    return 0


def skip_not_importable(what, e):
    """The peer's skip (exit 77) when its runtime is missing, with how to get today's peers."""
    print(f"skipped: {what} not importable by {sys.executable}: {e} (today's peers: bash scripts/peers.sh, "
          "then --python=.venv-peers/bin/python or nothing: recipes/benchmark.lua finds it)")
    return 77


class ByName(nn.Module):
    """model(input_ids, attention_mask, token_type_ids) -> its outputs as a tuple, the inputs passed by name:
    transformers 5's forward cannot be traced with positional ones."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).to_tuple()


def export_onnx(model, feed, path, outputs):
    """A transformers BERT (eval mode) exported to ONNX at path for the torch int64 inputs feed (input_ids,
    attention_mask, token_type_ids), batch and sequence axes dynamic, its outputs named `outputs`."""
    import inspect
    import warnings
    names = ["input_ids", "attention_mask", "token_type_ids"]
    # torch 2's default exporter (dynamo) needs onnxscript; the TorchScript one is the one torch 1.13 has
    kw = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on transformers' Python-side shape logic
        torch.onnx.export(ByName(model), tuple(feed[n] for n in names), path, input_names=names, output_names=outputs,
                          dynamic_axes={n: {0: "batch", 1: "seq"} for n in names}, opset_version=14, **kw)


def bench_encoder_onnx(a, path):
    """transformers' BertModel (with its pooler) at the benchmark's config, N(0, 0.02) weights from a fixed seed and
    eager attention (the pattern onnxruntime's BERT optimizer fuses), exported to ONNX at path for the batch of
    bench_batch. Returns the feed (input name -> int64 numpy array)."""
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(**bench_config(a))
    cfg._attn_implementation = "eager"
    model = BertModel(cfg).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    ids, mask, _, _ = bench_batch(a.batch, a.seq, a.vocab, a.masked, a.lengths)
    feed = {"input_ids": ids, "attention_mask": mask.long(), "token_type_ids": torch.zeros_like(ids)}
    export_onnx(model, feed, path, ["last_hidden_state", "pooler_output"])
    return {n: v.numpy().astype(np.int64) for n, v in feed.items()}


def time_rounds(a, label, step):
    """Times --steps calls of step() and prints '<label>: N seq/s (... p50 ...)'. With --rounds R > 1
    (recipes/benchmark.lua alternating its own blocks with ours) it prints 'ready' first, then times R such blocks,
    each when a line 'go' arrives on stdin, and stops early at end of input."""
    if a.rounds > 1:
        print("ready", flush=True)
    for _ in range(max(1, a.rounds)):
        if a.rounds > 1 and sys.stdin.readline().strip() != "go":
            return
        times = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        dt = sum(times)
        p50 = sorted(times)[len(times) // 2] * 1000
        print(f"{label}: {a.batch * a.steps / dt:.2f} seq/s ({dt / a.steps * 1000:.1f} ms/step, p50 {p50:.1f} ms, "
              f"{a.threads} threads)", flush=True)


def bench(argv):
    a = bench_args(argv)
    label = "torch-compile" if a.compile else "torch"
    if a.compile and not hasattr(torch, "compile"):
        return skip_not_importable(f"torch.compile (torch {torch.__version__})", "torch 2 needed")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = BertForPreTraining(bench_config(a))
    model.train(not a.infer)
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    B, S = a.batch, a.seq
    ids, mask, labels, nsp = bench_batch(B, S, a.vocab, a.masked, a.lengths)
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask,
             "masked_lm_labels": labels, "next_sentence_labels": nsp}

    # the MLM decoder only at the masked positions, like bertlua (and NVIDIA's BERT)
    def step():
        hs, pooled = model.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        if a.infer:
            return
        sel = labels.reshape(-1) != -1
        x = hs[-1].reshape(-1, a.hidden)[sel]
        t = model.cls.predictions.transform(x)
        logits = t @ model.bert.embeddings.word_embeddings.weight.t() + model.cls.predictions.bias
        loss = F.cross_entropy(logits, labels.reshape(-1)[sel]) + \
            F.cross_entropy(model.cls.seq_relationship(pooled), batch["next_sentence_labels"])
        model.zero_grad(set_to_none=False)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-1e-4)

    # torch 2: the fused attention a user of transformers gets (sdpa); torch 1.13 has none
    sdpa = hasattr(F, "scaled_dot_product_attention")
    if sdpa:
        for layer in model.bert.encoder.layer:
            layer.attention.self.__class__ = SdpaSelfAttention
    bf16 = a.precision == "bf16"
    other = "" if a.precision in ("fp32", "bf16") else f" (--precision {a.precision} has no counterpart here)"
    print(f"{label} peer: torch {torch.__version__}, {'torch.compile of the encoder' if a.compile else 'eager'}, "
          f"{'bf16 autocast' if bf16 else 'fp32'}{other}, attention {'sdpa' if sdpa else 'math'}")
    if a.compile:
        model.bert = torch.compile(model.bert)
    ctx = torch.no_grad() if a.infer else torch.enable_grad()
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
    with ctx, amp:
        t0 = time.perf_counter()
        step()  # torch.compile compiles here (forward and, training, backward)
        if a.compile:
            print(f"torch-compile peer: compile (first call) {time.perf_counter() - t0:.1f} s, not in the rate")
        for _ in range(a.warmup - 1):
            step()
        time_rounds(a, label, step)


# ---------------------------------------------------------------- transformers interop
def hf_save(d):
    try:
        from transformers import BertConfig, BertForPreTraining as HFBert
    except Exception as e:  # noqa: BLE001
        print(f"skipped: transformers not importable: {e}")
        sys.exit(77)
    torch.manual_seed(3)
    cfg = BertConfig(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=80, max_position_embeddings=32)
    m = HFBert(cfg)
    m.save_pretrained(d, safe_serialization=True)
    m.eval()
    b = {k: v.long() for k, v in st_load(os.path.join(d, "..", "batch.safetensors")).items()}
    with torch.no_grad():
        out = m(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"], attention_mask=b["attention_mask"],
                output_hidden_states=True)
    st_save(os.path.join(d, "..", "hf_out.safetensors"),
            {"last_hidden": out.hidden_states[-1], "prediction_logits": out.prediction_logits,
             "seq_relationship_logits": out.seq_relationship_logits})
    print("saved by transformers")


def hf_check(d):
    try:
        from transformers import BertForPreTraining as HFBert, BertForQuestionAnswering as HFQA
    except Exception as e:  # noqa: BLE001
        print(f"skipped: transformers not importable: {e}")
        sys.exit(77)
    m = HFBert.from_pretrained(d)
    m.eval()
    b = {k: v.long() for k, v in st_load(os.path.join(d, "..", "batch.safetensors")).items()}
    with torch.no_grad():
        out = m(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"], attention_mask=b["attention_mask"],
                output_hidden_states=True)
    # the tied decoder must really be the word embeddings after loading
    tied = m.cls.predictions.decoder.weight.data_ptr() == m.bert.embeddings.word_embeddings.weight.data_ptr()
    qa = HFQA.from_pretrained(d)  # a head transformers must initialise itself
    st_save(os.path.join(d, "..", "hf_out.safetensors"),
            {"last_hidden": out.hidden_states[-1], "prediction_logits": out.prediction_logits,
             "seq_relationship_logits": out.seq_relationship_logits,
             "tied": torch.tensor([1 if tied else 0], dtype=torch.int32),
             "qa_word_embeddings": qa.bert.embeddings.word_embeddings.weight})
    print("loaded by transformers")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    cmd = sys.argv[1]
    if cmd == "parity":
        parity(sys.argv[2])
    elif cmd == "bench":
        sys.exit(bench(sys.argv[2:]))
    elif cmd == "hf_save":
        hf_save(sys.argv[2])
    elif cmd == "hf_check":
        hf_check(sys.argv[2])
    else:
        print(__doc__)
        sys.exit(2)
