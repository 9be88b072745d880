"""Hugging Face transformers + torch.optim.AdamW fine-tuning of a real BERT
for SQuAD on features and a batch order that bertlua wrote, for step-by-step
comparison with bertlua's trainer (tests/lua/test_finetune_accuracy.lua).

usage: /usr/bin/python3 tests/py/qa_finetune_reference.py train|finetune DIR MODEL_DIR [options]
  DIR holds features.safetensors (input_ids, token_type_ids, attention_mask
  [N,L] i32, start_positions, end_positions [N]), order.json (one list of
  0-based feature indices per optimizer step) and head.safetensors (the
  initial qa_outputs.weight/bias). Writes DIR/ref_log.json ({loss, lr,
  grad_norm} per step), DIR/ref_grads.safetensors (gradients of the loss of
  features 0..batch-1 before any step: grad.<name>) and
  DIR/ref_params.safetensors (parameters after the last step), and when
  DIR/eval_features.safetensors exists, its logits as finetune writes them.
  finetune: the same model trained as transformers users do (its own
  shuffled order from --seed, the last partial batch kept, --epochs), then
  start/end logits of DIR/eval_features.safetensors written to
  DIR/ref_logits.safetensors (start_logits, end_logits [N,L]) and the
  per-step log to DIR/ref_log.json.
  Options: --lr, --warmup (proportion), --weight-decay, --eps, --clip (0 =
  off), --batch, --micro-batch (gradient accumulation), --dropout (default 0), --threads, --seed, --no-state (train:
  skip ref_grads and ref_params).
Exit code 77 (skip) when torch or transformers is missing.
"""
import argparse
import json
import math
import os
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file
    from transformers import BertForQuestionAnswering, get_linear_schedule_with_warmup
except Exception as e:  # noqa: BLE001
    print(f"skipped: torch/transformers/safetensors not importable by {sys.executable}: {e}")
    sys.exit(77)


def no_decay(name):
    return "bias" in name or "LayerNorm" in name


def load_model(model_dir, dropout, head):
    m = BertForQuestionAnswering.from_pretrained(
        model_dir, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    with torch.no_grad():
        m.qa_outputs.weight.copy_(head["qa_outputs.weight"])
        m.qa_outputs.bias.copy_(head["qa_outputs.bias"])
    return m


def batch_of(feats, idx, keys=("input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions")):
    """The rows idx, cut after the longest real sequence (padding is masked: only speed changes)."""
    idx = torch.tensor(idx, dtype=torch.long)
    b = {k: feats[k][idx].long() for k in keys}
    S = int(b["attention_mask"].sum(1).max())
    for k in ("input_ids", "token_type_ids", "attention_mask"):
        b[k] = b[k][:, :S]
    return b


def train(a):
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    feats = load_file(os.path.join(a.dir, "features.safetensors"))
    head = load_file(os.path.join(a.dir, "head.safetensors"))
    with open(os.path.join(a.dir, "order.json")) as f:
        order = json.load(f)
    model = load_model(a.model_dir, a.dropout, head)
    model.train()
    if not a.no_state:
        # gradients of one batch, before any update
        out = model(**batch_of(feats, list(range(a.batch))))
        out.loss.backward()
        save_file({"grad." + n: p.grad.detach().clone() for n, p in model.named_parameters()},
                  os.path.join(a.dir, "ref_grads.safetensors"))
        model.zero_grad(set_to_none=True)
    fit(model, a, order, lambda idx: batch_of(feats, idx))
    if not a.no_state:
        save_file({n: p.detach().contiguous() for n, p in model.named_parameters()},
                  os.path.join(a.dir, "ref_params.safetensors"))
    if os.path.exists(os.path.join(a.dir, "eval_features.safetensors")):
        write_eval_logits(model, a.dir)


def finetune(a):
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    feats = load_file(os.path.join(a.dir, "features.safetensors"))
    head = load_file(os.path.join(a.dir, "head.safetensors"))
    model = load_model(a.model_dir, a.dropout, head)
    order = shuffled_order(feats["input_ids"].shape[0], a)
    fit(model, a, order, lambda idx: batch_of(feats, idx))
    write_eval_logits(model, a.dir)


def shuffled_order(n, a):
    """A transformers user's batches: a fresh permutation from the seed each epoch, last partial batch kept."""
    g = torch.Generator().manual_seed(a.seed)
    order = []
    for _ in range(a.epochs):
        perm = torch.randperm(n, generator=g).tolist()
        order += [perm[i:i + a.batch] for i in range(0, n, a.batch)]
    return order


def optimizer(model, a, total):
    """torch AdamW (no decay on biases and LayerNorm) with transformers' linear warmup/decay over total steps."""
    groups = [
        {"params": [p for n, p in model.named_parameters() if not no_decay(n)], "weight_decay": a.weight_decay},
        {"params": [p for n, p in model.named_parameters() if no_decay(n)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=a.lr, eps=a.eps)
    return opt, get_linear_schedule_with_warmup(opt, math.ceil(a.warmup * total), total)


def fit(model, a, order, make_batch):
    """The training loop as transformers users write it (clip_grad_norm_ when --clip > 0); log to DIR/ref_log.json.

    --micro-batch M > 0 accumulates each batch's gradient over chunks of M sequences (as gradient_accumulation_steps
    does): the same step up to rounding, with a quarter of the activations at M = batch / 4. At batch 32, length
    192 the whole-batch activations of MiniLM-L6 alone are ~3 GB, enough to be OOM-killed on a shared machine."""
    opt, sched = optimizer(model, a, len(order))
    model.train()
    log = []
    micro = getattr(a, "micro_batch", 0) or 1 << 30
    every = getattr(a, "checkpoint_every", 0)
    done = resume(model, opt, sched, log, a.dir) if every else 0
    t0, seen = time.time(), 0
    for step, idx in enumerate(order, 1):
        if step <= done:
            continue
        b, loss = make_batch(idx), 0.0  # one padded length for the whole batch: pad logits are in the softmax
        for i in range(0, len(idx), micro):
            out = model(**{k: v[i:i + micro] for k, v in b.items()})
            share = min(micro, len(idx) - i) / len(idx)
            (out.loss * share).backward()
            loss += out.loss.item() * share
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip if a.clip > 0 else float("inf")).item()
        log.append({"loss": loss, "lr": sched.get_last_lr()[0], "grad_norm": norm})
        opt.step()
        sched.step()
        model.zero_grad(set_to_none=True)
        seen += len(idx)
        if step % 10 == 0 or step == len(order):  # progress, as bertlua's trainer prints it
            print(f"step {step}/{len(order)}  loss {loss:.4f}  seq_per_s {seen / (time.time() - t0):.2f}", flush=True)
        if every and step % every == 0 and step < len(order):
            save_resume(model, opt, sched, log, step, a.dir)
    with open(os.path.join(a.dir, "ref_log.json"), "w") as f:
        json.dump(log, f)


RESUME = "resume.pt"


def save_resume(model, opt, sched, log, step, dir_):
    """Everything the loop needs to go on exactly (weights, AdamW moments, schedule, the log, the dropout RNG),
    written whole or not at all: a run killed at any point resumes from its last checkpoint."""
    path = os.path.join(dir_, RESUME)
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                "log": log, "rng": torch.get_rng_state()}, path + ".tmp")
    os.replace(path + ".tmp", path)


def resume(model, opt, sched, log, dir_):
    """The steps already done by an earlier run into dir_ (0 without a checkpoint); its state is loaded."""
    path = os.path.join(dir_, RESUME)
    if not os.path.exists(path):
        return 0
    c = torch.load(path, weights_only=False)
    model.load_state_dict(c["model"])
    opt.load_state_dict(c["opt"])
    sched.load_state_dict(c["sched"])
    log.extend(c["log"])
    torch.set_rng_state(c["rng"])
    print(f"resumed from {path} after step {c['step']}", flush=True)
    return c["step"]


def write_eval_logits(model, dir_):
    """Start/end logits of DIR/eval_features.safetensors, padded back to its length, to DIR/ref_logits."""
    keys = ("input_ids", "token_type_ids", "attention_mask")
    ev = load_file(os.path.join(dir_, "eval_features.safetensors"))
    model.eval()
    starts, ends = [], []
    with torch.no_grad():
        for i in range(0, ev["input_ids"].shape[0], 64):
            b = batch_of(ev, list(range(i, min(i + 64, ev["input_ids"].shape[0]))), keys[:3])
            out = model(**b)
            pad = ev["input_ids"].shape[1] - out.start_logits.shape[1]
            starts.append(F.pad(out.start_logits.float(), (0, pad), value=-1e4))
            ends.append(F.pad(out.end_logits.float(), (0, pad), value=-1e4))
    save_file({"start_logits": torch.cat(starts).contiguous(), "end_logits": torch.cat(ends).contiguous()},
              os.path.join(dir_, "ref_logits.safetensors"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "finetune"])
    ap.add_argument("dir")
    ap.add_argument("model_dir")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--clip", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, default=0, help="sequences per forward (0: the whole batch)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--no-state", action="store_true", help="train: no ref_grads/ref_params (only the log, logits)")
    a = ap.parse_args()
    (train if a.mode == "train" else finetune)(a)


if __name__ == "__main__":
    main()
