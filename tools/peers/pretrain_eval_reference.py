"""Held-out pre-training metrics of BERT models in PyTorch (transformers' BertForPreTraining): MLM loss and accuracy
over the masked tokens, NSP loss and accuracy over the sequences, on the first N instances of bertlua's held-out
shards (test_*.blshard, read by tools/peers/blshard.py in file order: the instances bertlua's evaluator,
bertlua.train.pretrain_eval with an unshuffled loader, counts).

usage:
  /usr/bin/python3 tools/peers/pretrain_eval_reference.py --data=DIR --instances=N [--batch=8] [--threads=1]
      [--device=cpu] [--config=config.json] --output=FILE.jsonl MODEL_DIR [MODEL_DIR...]

  DIR        a shard directory holding test_*.blshard
  MODEL_DIR  config.json + model.safetensors (bertlua's model directories and checkpoints, the reference's
             snapshots); a directory without config.json takes --config's
  FILE       one JSON object per model: model, mlm_loss, mlm_acc, mlm_count, nsp_loss, nsp_acc, nsp_count

The models are evaluated in fp32 with dropout off (eval mode). Exit code 77 (skip) when torch/transformers are
missing.
"""
import argparse
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from nvidia_pretrain_reference import load_model, use_device, torch, F  # noqa: E402  (exits 77 without torch)
from blshard import Shard  # noqa: E402


def fail(msg):
    sys.exit(f"pretrain_eval_reference: {msg}")


def instances(data, n):
    files = sorted(glob.glob(os.path.join(data, "test_*.blshard")))
    if not files:
        fail(f"--data={data}: no test_*.blshard")
    out = []
    for f in files:
        try:
            s = Shard(f)
        except (OSError, ValueError) as e:
            fail(str(e))
        for k in range(len(s)):
            if len(out) == n:
                return out
            out.append(s[k])
    if len(out) < n:
        fail(f"--instances={n}: {data} holds {len(out)} held-out instances")
    return out


def batch_tensors(recs):
    S = max(len(r["tokens"]) for r in recs)
    B = len(recs)
    ids = torch.zeros(B, S, dtype=torch.long)
    types = torch.zeros(B, S, dtype=torch.long)
    mask = torch.zeros(B, S, dtype=torch.long)
    rows, pos, lab = [], [], []
    for b, r in enumerate(recs):
        L = len(r["tokens"])
        ids[b, :L] = torch.tensor(r["tokens"])
        types[b, r["len_a"]:L] = 1
        mask[b, :L] = 1
        rows += [b] * len(r["positions"])
        pos += list(r["positions"])
        lab += list(r["labels"])
    nsp = torch.tensor([r["nsp"] for r in recs], dtype=torch.long)
    return ids, types, mask, torch.tensor(rows, dtype=torch.long), torch.tensor(pos, dtype=torch.long), \
        torch.tensor(lab, dtype=torch.long), nsp


@torch.no_grad()
def evaluate(model, recs, batch):
    s = [0.0, 0, 0, 0.0, 0, 0]
    for i in range(0, len(recs), batch):
        dev = next(model.parameters()).device
        ids, types, mask, rows, pos, lab, nsp = (t.to(dev) for t in batch_tensors(recs[i:i + batch]))
        out = model.bert(input_ids=ids, token_type_ids=types, attention_mask=mask)
        seq, pooled = out[0], out[1]
        if len(lab):
            scores = model.cls.predictions(seq[rows, pos]).float()
            s[0] += float(F.cross_entropy(scores, lab, reduction="sum"))
            s[1] += int((scores.argmax(-1) == lab).sum())
            s[2] += len(lab)
        logits = model.cls.seq_relationship(pooled).float()
        s[3] += float(F.cross_entropy(logits, nsp, reduction="sum"))
        s[4] += int((logits.argmax(-1) == nsp).sum())
        s[5] += len(nsp)
    return {"mlm_loss": s[0] / max(s[2], 1), "mlm_acc": s[1] / max(s[2], 1), "mlm_count": s[2],
            "nsp_loss": s[3] / max(s[5], 1), "nsp_acc": s[4] / max(s[5], 1), "nsp_count": s[5]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--instances", type=int, required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    ap.add_argument("--config", help="config.json for model directories without one")
    ap.add_argument("--output", required=True)
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    if a.instances < 1 or a.batch < 1:
        fail("--instances and --batch must be positive")
    torch.set_num_threads(a.threads)
    recs = instances(a.data, a.instances)
    with open(a.output, "w") as f:
        for m in a.models:
            has_config = os.path.isfile(os.path.join(m, "config.json"))
            if not has_config and not a.config:
                fail(f"{m}: no config.json (pass --config)")
            if not os.path.isfile(os.path.join(m, "model.safetensors")):
                fail(f"{m}: no model.safetensors")
            model = load_model(m, 0.0, None if has_config else a.config).to(use_device(a.device))
            model.eval()
            r = evaluate(model, recs, a.batch)
            r["model"] = m
            f.write(json.dumps(r) + "\n")
            f.flush()


if __name__ == "__main__":
    main()
