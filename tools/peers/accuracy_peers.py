"""Accuracy at fp32, bf16 and int8 of today's CPU peers on a fine-tuned model: the accuracy rows beside the
low-precision speed rows of recipes/benchmark.lua (issue 32). tools/peers/accuracy_delta.sh runs it with
bertlua's own rows.

usage: .venv-peers/bin/python tools/peers/accuracy_peers.py --model DIR (--tsv dev.tsv [--rows 200] | --squad eval.json)
       [--calib-file FILE] [--calib 64] [--seq 128] [--stride 96] [--threads 2] [--ours fp32=A,bf16=B,int8=C]

DIR is a fine-tuned model directory as recipes/glue.lua or recipes/squad.lua writes it (config.json,
model.safetensors with Hugging Face names, vocab.txt), read by transformers. --tsv: a sequence classifier on
GLUE SST-2's layout (sentence<TAB>label, a header line), its first --rows rows evaluated, accuracy.
--squad: a QA model on a SQuAD v1.1 file, every question evaluated, F1 of the official v1.1 metric
(transformers' windows: --seq tokens, overlapping by --stride; run_qa.py's best span, as
tests/py/qa_transformers_native.py). OpenVINO's int8 (NNCF) is calibrated on --calib rows or windows of
--calib-file (the same format; training data), by default the SST-2 rows after --rows (a SQuAD run needs it).
Each side quantizes its own way: PyTorch bf16 = torch.autocast; ONNX Runtime int8 = quantize_dynamic of its
fused graph (no bf16 on its CPU provider); OpenVINO bf16 = the bf16 precision hint, int8 = NNCF's
post-training quantization. --ours adds bertlua's figures (fractions for accuracy, F1 in points). One line per
side and precision: "accuracy <side> <precision>: A % (B points from its fp32, N rows)" (SQuAD: "f1 ...").
Exits 77 when a runtime is missing.
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(HERE, "..", "..", "tests", "py"))  # SQuAD windows, spans and the official metric

PRECISIONS = ("fp32", "bf16", "int8")


def read_tsv(path, first, n):
    """n (sentence, label) rows of a GLUE SST-2 TSV from row `first` (0 = the first after the header)."""
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    bad = [i for i, r in enumerate(rows[first:first + n]) if len(r) < 2 or r[-1].strip() not in ("0", "1")]
    if bad:
        raise SystemExit(f"accuracy_peers: {path}: row {first + bad[0] + 2} is not 'sentence<TAB>0|1'")
    return [r[0] for r in rows[first:first + n]], [int(r[-1]) for r in rows[first:first + n]]


def peer_outputs(model, feed, calibration, threads, names):
    """{(side, precision): [one array per output name]}: the transformers model's outputs on feed (input name ->
    int64 array) by PyTorch (fp32, bf16 autocast), ONNX Runtime (fp32, int8) and OpenVINO (fp32, bf16, int8,
    calibrated on `calibration`, a list of one-row feeds), each from the same ONNX export."""
    import numpy as np
    import torch
    from bert_reference import export_onnx
    from bench_bert_onnxruntime import session
    from bench_bert_openvino import compiled
    n = len(feed["input_ids"])

    def over_rows(run, step):  # run(sub-feed) -> outputs, over feed in slices of `step` rows, concatenated
        outs = [run({k: v[i:i + step] for k, v in feed.items()}) for i in range(0, n, step)]
        return [np.concatenate([np.asarray(o[j], dtype=np.float32) for o in outs]) for j in range(len(names))]

    def torch_run(sub):
        return [t.float().numpy() for t in model(**{k: torch.from_numpy(v) for k, v in sub.items()}).to_tuple()]
    out = {}
    with torch.no_grad():
        out["torch", "fp32"] = over_rows(torch_run, 32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out["torch", "bf16"] = over_rows(torch_run, 32)
    with tempfile.TemporaryDirectory() as d:
        raw = os.path.join(d, "model.onnx")
        export_onnx(model, {k: torch.from_numpy(v[:2]) for k, v in feed.items()}, raw, names)
        cfg = model.config
        for p in ("fp32", "int8"):
            sess, _ = session(raw, d, cfg.num_attention_heads, cfg.hidden_size, threads, p)
            out["onnxruntime", p] = over_rows(lambda sub: sess.run(None, sub), 32)
        for p in PRECISIONS:
            # one row per call: the shapes NNCF calibrated at
            c, _ = compiled(raw, {k: v[:1] for k, v in feed.items()}, threads, p, calibration)
            out["openvino", p] = over_rows(lambda sub: list(c(sub).values()), 1)
    return out


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tsv")
    ap.add_argument("--squad")
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--calib-file")
    ap.add_argument("--calib", type=int, default=64)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--stride", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ours", default="", help="bertlua's figures: fp32=A,bf16=B,int8=C (accuracy fractions, F1)")
    a = ap.parse_args(argv)
    if (a.tsv is None) == (a.squad is None):
        raise SystemExit("accuracy_peers: give one of --tsv (SST-2) or --squad (SQuAD v1.1)")
    if a.squad and not a.calib_file:
        raise SystemExit("accuracy_peers: --squad needs --calib-file (SQuAD training questions for OpenVINO's int8)")
    try:
        import numpy as np
        import torch
        from transformers import BertForQuestionAnswering, BertForSequenceClassification, BertTokenizerFast
        import openvino  # noqa: F401
        import onnxruntime  # noqa: F401
    except Exception as e:  # noqa: BLE001
        from bert_reference import skip_not_importable
        return skip_not_importable("torch / transformers / onnxruntime / openvino", e)
    torch.set_num_threads(a.threads)
    tok = BertTokenizerFast(os.path.join(a.model, "vocab.txt"), do_lower_case=True)
    inputs = ("input_ids", "attention_mask", "token_type_ids")

    def as_feed(enc):
        return {k: np.asarray(enc[k], dtype=np.int64) for k in inputs}

    if a.tsv:
        model = BertForSequenceClassification.from_pretrained(a.model, attn_implementation="eager").eval()

        def encode(texts):
            return as_feed(tok(texts, padding="max_length", truncation=True, max_length=a.seq))
        texts, gold = read_tsv(a.tsv, 0, a.rows)
        calib_texts, _ = read_tsv(a.calib_file, 0, a.calib) if a.calib_file else read_tsv(a.tsv, a.rows, a.calib)
        feed, calib, names = encode(texts), encode(calib_texts), ["logits"]
        gold = np.array(gold)
        what, count = "accuracy", f"{len(gold)} rows"

        def score(out):
            return 100 * float((out[0].argmax(-1) == gold).mean())
    else:
        from qa_transformers_native import best_spans, encode as squad_encode, flatten
        from squad_official_eval import evaluate_v1
        model = BertForQuestionAnswering.from_pretrained(a.model, attn_implementation="eager").eval()
        qa = argparse.Namespace(max_seq_length=a.seq, doc_stride=a.stride, n_best=20, max_answer_length=30)
        qs = flatten(a.squad, False)
        enc = squad_encode(tok, qs, qa)
        feed, names = as_feed(enc), ["start_logits", "end_logits"]
        calib = {k: v[:a.calib] for k, v in as_feed(squad_encode(tok, flatten(a.calib_file, True), qa)).items()}
        with open(a.squad, encoding="utf-8") as f:
            data = json.load(f)["data"]
        what, count = "f1", f"{len(qs)} questions, {len(feed['input_ids'])} windows of {a.seq}"

        def score(out):
            # run_qa.py's n-best search, as bertlua's recipes/predict.lua searches by default
            return evaluate_v1(data, best_spans(enc, qs, out[0], out[1], qa, "nbest")[0])["f1"]
    calibration = [{k: v[i:i + 1] for k, v in calib.items()} for i in range(len(calib["input_ids"]))] or None
    res = {k: score(v) for k, v in peer_outputs(model, feed, calibration, a.threads, names).items()}
    for kv in filter(None, a.ours.split(",")):
        p, v = kv.split("=")
        res["bertlua", p] = float(v) * (100 if a.tsv else 1)
    for (side, p), v in sorted(res.items(), key=lambda kv: (kv[0][0], PRECISIONS.index(kv[0][1]))):
        base = res.get((side, "fp32"))
        delta = "" if p == "fp32" or base is None else f", {v - base:+.2f} points from its fp32"
        # bertlua makes its own SQuAD windows: only the question count is shared
        print(f"{what} {side} {p}: {v:.2f}{' %' if a.tsv else ''}{delta}, "
              f"{count.split(',')[0] if side == 'bertlua' else count}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
