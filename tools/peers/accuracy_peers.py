"""Accuracy at fp32, bf16 and int8 of today's CPU peers on a fine-tuned sequence classifier: the accuracy rows
beside the low-precision speed rows of recipes/benchmark.lua (issue 32). tools/peers/accuracy_delta.sh runs it
with bertlua's own rows.

usage: .venv-peers/bin/python tools/peers/accuracy_peers.py --model DIR --tsv dev.tsv [--rows 200] [--calib 64]
       [--seq 128] [--threads 2] [--ours fp32=A,bf16=B,int8=C]

DIR is a fine-tuned sequence-classification model directory as recipes/glue.lua writes it (config.json,
model.safetensors with Hugging Face names, vocab.txt), read by transformers. The TSV is GLUE SST-2's layout
(sentence<TAB>label, a header line): its first --rows rows are evaluated, the --calib rows after them calibrate
OpenVINO's int8 (NNCF). Each side quantizes its own way: PyTorch bf16 = torch.autocast; ONNX Runtime int8 =
quantize_dynamic of its fused graph (no bf16 on its CPU provider); OpenVINO bf16 = the bf16 precision hint,
int8 = NNCF's post-training quantization. --ours adds bertlua's accuracies (fractions). One line per side and
precision: "accuracy <side> <precision>: A % (B points from its fp32, N rows)". Exits 77 when a runtime is missing.
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def read_tsv(path, first, n):
    """n (sentence, label) rows of a GLUE SST-2 TSV from row `first` (0 = the first after the header)."""
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    bad = [i for i, r in enumerate(rows[first:first + n]) if len(r) < 2 or r[-1].strip() not in ("0", "1")]
    if bad:
        raise SystemExit(f"accuracy_peers: {path}: row {first + bad[0] + 2} is not 'sentence<TAB>0|1'")
    return [r[0] for r in rows[first:first + n]], [int(r[-1]) for r in rows[first:first + n]]


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tsv", required=True)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--calib", type=int, default=64)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ours", default="", help="bertlua's accuracies: fp32=A,bf16=B,int8=C (fractions)")
    a = ap.parse_args(argv)
    try:
        import numpy as np
        import torch
        from transformers import BertForSequenceClassification, BertTokenizer
        from bert_reference import export_onnx
        from bench_bert_onnxruntime import session
        from bench_bert_openvino import compiled
    except Exception as e:  # noqa: BLE001
        from bert_reference import skip_not_importable
        return skip_not_importable("torch / transformers / onnxruntime / openvino", e)
    torch.set_num_threads(a.threads)
    tok = BertTokenizer(os.path.join(a.model, "vocab.txt"), do_lower_case=True)
    model = BertForSequenceClassification.from_pretrained(a.model, attn_implementation="eager").eval()
    cfg = model.config

    def encode(texts):
        enc = tok(texts, padding="max_length", truncation=True, max_length=a.seq, return_tensors="np")
        return {n: enc[n].astype(np.int64) for n in ("input_ids", "attention_mask", "token_type_ids")}
    texts, gold = read_tsv(a.tsv, 0, a.rows)
    feed = encode(texts)
    calib_texts, _ = read_tsv(a.tsv, a.rows, a.calib)
    calibration = [{n: v[i:i + 1] for n, v in encode(calib_texts).items()} for i in range(len(calib_texts))] or None
    gold = np.array(gold)

    acc = {}
    with torch.no_grad():
        t = {n: torch.from_numpy(v) for n, v in feed.items()}
        acc["torch", "fp32"] = model(**t).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            acc["torch", "bf16"] = model(**t).logits.float()
    with tempfile.TemporaryDirectory() as d:
        raw = os.path.join(d, "model.onnx")
        export_onnx(model, {n: torch.from_numpy(v) for n, v in feed.items()}, raw, ["logits"])
        for p in ("fp32", "int8"):
            sess, _ = session(raw, d, cfg.num_attention_heads, cfg.hidden_size, a.threads, p)
            acc["onnxruntime", p] = sess.run(None, feed)[0]
        for p in ("fp32", "bf16", "int8"):
            # one row per call: the shapes NNCF calibrated at
            c, _ = compiled(raw, {n: v[:1] for n, v in feed.items()}, a.threads, p, calibration)
            acc["openvino", p] = np.concatenate([c({n: v[i:i + 1] for n, v in feed.items()})[0]
                                                 for i in range(len(gold))])
    for k, logits in acc.items():
        acc[k] = float((np.asarray(logits).argmax(-1) == gold).mean())
    for kv in filter(None, a.ours.split(",")):
        p, v = kv.split("=")
        acc["bertlua", p] = float(v)
    for (side, p), v in sorted(acc.items(), key=lambda kv: (kv[0][0], ("fp32", "bf16", "int8").index(kv[0][1]))):
        base = acc.get((side, "fp32"))
        delta = "" if p == "fp32" or base is None else f", {100 * (v - base):+.2f} points from its fp32"
        print(f"accuracy {side} {p}: {100 * v:.2f} %{delta}, {len(gold)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
