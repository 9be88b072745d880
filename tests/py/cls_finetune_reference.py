"""Hugging Face transformers + torch.optim.AdamW fine-tuning of a real BERT
for GLUE classification on features that bertlua wrote, the twin of
qa_finetune_reference.py's finetune mode (tests/lua/glue_accuracy.lua).

usage: /usr/bin/python3 tests/py/cls_finetune_reference.py DIR MODEL_DIR [options]
  DIR holds features.safetensors (input_ids, token_type_ids, attention_mask
  [N,L] i32, labels [N] i32), head.safetensors (the initial
  classifier.weight/bias) and eval_features.safetensors (the same without
  labels). BertForSequenceClassification is trained as transformers users do
  (a shuffled order from --seed per epoch, last partial batch kept, AdamW
  without decay on biases/LayerNorm, clip_grad_norm_, linear warmup/decay);
  writes DIR/ref_log.json and the eval logits to DIR/ref_logits.safetensors
  (logits [M, num_labels]).
  Options: those of qa_finetune_reference.py, with --num-labels.
Exit code 77 (skip) when torch or transformers is missing.
"""
import argparse
import os
import sys

from qa_finetune_reference import batch_of, fit, shuffled_order  # exits 77 without torch/transformers

import torch
from safetensors.torch import load_file, save_file
from transformers import BertForSequenceClassification

KEYS = ("input_ids", "token_type_ids", "attention_mask")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("model_dir")
    ap.add_argument("--num-labels", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--clip", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=0, help="sequences per forward (0: the whole batch)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    feats = load_file(os.path.join(a.dir, "features.safetensors"))
    head = load_file(os.path.join(a.dir, "head.safetensors"))
    model = BertForSequenceClassification.from_pretrained(
        a.model_dir, num_labels=a.num_labels, hidden_dropout_prob=a.dropout, attention_probs_dropout_prob=a.dropout)
    with torch.no_grad():
        model.classifier.weight.copy_(head["classifier.weight"])
        model.classifier.bias.copy_(head["classifier.bias"])
    order = shuffled_order(feats["input_ids"].shape[0], a)
    fit(model, a, order, lambda idx: batch_of(feats, idx, KEYS + ("labels",)))
    ev = load_file(os.path.join(a.dir, "eval_features.safetensors"))
    model.eval()
    n = ev["input_ids"].shape[0]
    with torch.no_grad():
        logits = [model(**batch_of(ev, list(range(i, min(i + 64, n))), KEYS)).logits.float()
                  for i in range(0, n, 64)]
    save_file({"logits": torch.cat(logits).contiguous()}, os.path.join(a.dir, "ref_logits.safetensors"))


if __name__ == "__main__":
    sys.exit(main())
