"""SQuAD v1.1 fine-tuning done entirely the transformers way, for issue 19's
comparison with recipes/squad.lua: transformers' own windows (fast tokenizer,
truncation="only_second", `stride` = overlap between windows, answer labels
from the offsets, [CLS] when a window misses the answer), its own QA head
initialisation from --seed, torch AdamW + clip_grad_norm_ + linear warmup and
decay (qa_finetune_reference.fit), and the simple best-span post-processing of
transformers' run_qa.py example (top --n-best starts x ends), and beside it an
exhaustive search of every valid span, both scored by the official v1.1 metric.

usage: /usr/bin/python3 tests/py/qa_transformers_native.py TRAIN.json EVAL.json MODEL_DIR OUT_DIR [options]
  Writes OUT_DIR/predictions.json (n-best), OUT_DIR/predictions_exhaustive.json, OUT_DIR/ref_log.json and,
  last, OUT_DIR/eval_results.json ({nbest: {exact_match, f1, empty}, exhaustive: {...}, exact_match and f1 of
  nbest, questions, train_features, eval_features, steps}; empty: questions without a valid span); prints it.
  Every --checkpoint-every steps (0: never) OUT_DIR/resume.pt holds the training state: a run started again into
  OUT_DIR goes on from there, with the same results as one uninterrupted run.
Exit code 77 (skip) when torch or transformers is missing.
"""
import argparse
import collections
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qa_finetune_reference import batch_of, fit, shuffled_order  # noqa: E402 (exits 77 without torch)
from squad_official_eval import evaluate_v1  # noqa: E402

import torch  # noqa: E402
from transformers import BertForQuestionAnswering, BertTokenizerFast  # noqa: E402

SEARCHES = ("nbest", "exhaustive")


def flatten(path, first_answer_only):
    """(id, question, context, answers) per question of a SQuAD file."""
    with open(path) as f:
        data = json.load(f)["data"]
    out = []
    for art in data:
        for p in art["paragraphs"]:
            for qa in p["qas"]:
                answers = qa["answers"][:1] if first_answer_only else qa["answers"]
                out.append((qa["id"], qa["question"].lstrip(), p["context"], answers))
    return out


def encode(tok, qs, a):
    """run_qa.py's tokenisation: question first, the context cut into overlapping windows."""
    return tok([q[1] for q in qs], [q[2] for q in qs], truncation="only_second", max_length=a.max_seq_length,
               stride=a.doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True,
               padding="max_length")


def train_features(tok, qs, a):
    """Token ids and start/end labels of every window (run_qa.py's prepare_train_features)."""
    enc = encode(tok, qs, a)
    starts, ends = [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        ans = qs[enc["overflow_to_sample_mapping"][i]][3][0]
        a0, a1 = ans["answer_start"], ans["answer_start"] + len(ans["text"])
        seq = enc.sequence_ids(i)
        c0 = seq.index(1)
        c1 = len(seq) - 1 - seq[::-1].index(1)
        if not (offsets[c0][0] <= a0 and offsets[c1][1] >= a1):
            starts.append(0)
            ends.append(0)
            continue
        s = c0
        while s <= c1 and offsets[s][0] <= a0:
            s += 1
        e = c1
        while e >= c0 and offsets[e][1] >= a1:
            e -= 1
        starts.append(s - 1)
        ends.append(e + 1)
    feats = {k: torch.tensor(enc[k], dtype=torch.int32) for k in ("input_ids", "token_type_ids", "attention_mask")}
    feats["start_positions"] = torch.tensor(starts, dtype=torch.int32)
    feats["end_positions"] = torch.tensor(ends, dtype=torch.int32)
    return feats


def window_candidates(sl, el, seq, a, search):
    """(score, start, end) of the spans searched in one window: start and end in the context, start <= end, at
    most --max-answer-length tokens. nbest: the --n-best best starts x the --n-best best ends (run_qa.py);
    exhaustive: the best of every such pair."""
    if search == "nbest":
        top_s = sorted(range(len(sl)), key=lambda k: -sl[k])[:a.n_best]
        top_e = sorted(range(len(el)), key=lambda k: -el[k])[:a.n_best]
        for s in top_s:
            for e in top_e:
                if seq[s] == 1 and seq[e] == 1 and s <= e and e - s + 1 <= a.max_answer_length:
                    yield sl[s] + el[e], s, e
        return
    n = len(sl)
    ctx = torch.tensor([x == 1 for x in seq])
    pos = torch.arange(n)
    length = pos[None, :] - pos[:, None] + 1
    valid = ctx[:, None] & ctx[None, :] & (length >= 1) & (length <= a.max_answer_length)
    if not bool(valid.any()):
        return
    scores = torch.tensor(sl, dtype=torch.float64)[:, None] + torch.tensor(el, dtype=torch.float64)[None, :]
    k = int(torch.argmax(scores.masked_fill(~valid, -math.inf)))
    s, e = divmod(k, n)
    yield sl[s] + el[e], s, e


def best_spans(enc, qs, start, end, a, search):
    """The best span per question over its windows (run_qa.py's postprocess_qa_predictions without null answers;
    window_candidates says which spans are searched): enc = encode(tok, qs, a), start and end the windows' logits
    (one row per window). Returns {id: answer text} and the number of questions without a valid span (answer "")."""
    best = collections.OrderedDict((q[0], (None, "")) for q in qs)
    for i, (sl, el) in enumerate(zip(start, end)):
        q = qs[enc["overflow_to_sample_mapping"][i]]
        seq, offsets = enc.sequence_ids(i), enc["offset_mapping"][i]
        sl, el = list(map(float, sl)), list(map(float, el))
        for score, s, e in window_candidates(sl, el, seq, a, search):
            if best[q[0]][0] is None or score > best[q[0]][0]:
                best[q[0]] = (score, q[2][offsets[s][0]:offsets[e][1]])
    empty = sum(1 for v in best.values() if v[0] is None)
    return {k: v[1] for k, v in best.items()}, empty


def predict(model, tok, qs, a):
    """The windows' logits through best_spans with each search: {search: (predictions, empty)}, and the number of
    windows."""
    enc = encode(tok, qs, a)
    ids = torch.tensor(enc["input_ids"])
    tt, am = torch.tensor(enc["token_type_ids"]), torch.tensor(enc["attention_mask"])
    start, end = [], []
    model.eval()
    with torch.no_grad():
        for b in range(0, ids.shape[0], 64):
            out = model(input_ids=ids[b:b + 64], token_type_ids=tt[b:b + 64], attention_mask=am[b:b + 64])
            start += out.start_logits.tolist()
            end += out.end_logits.tolist()
    return {search: best_spans(enc, qs, start, end, a, search) for search in SEARCHES}, ids.shape[0]


def main():
    ap = argparse.ArgumentParser()
    for p in ("train_file", "eval_file", "model_dir", "out"):
        ap.add_argument(p)
    for name, typ, default in (("max-seq-length", int, 192), ("doc-stride", int, 96), ("lr", float, 1e-4),
                               ("epochs", int, 2), ("batch", int, 32), ("micro-batch", int, 8), ("warmup", float, 0.1),
                               ("weight-decay", float, 0.01), ("eps", float, 1e-8), ("clip", float, 1.0),
                               ("dropout", float, 0.1), ("seed", int, 1), ("threads", int, 2), ("n-best", int, 20),
                               ("max-answer-length", int, 30), ("checkpoint-every", int, 50)):
        ap.add_argument("--" + name, type=typ, default=default)
    a = ap.parse_args()
    a.dir = a.out
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)  # the fresh QA head, as a transformers user gets it
    tok = BertTokenizerFast(os.path.join(a.model_dir, "vocab.txt"), do_lower_case=True)
    model = BertForQuestionAnswering.from_pretrained(
        a.model_dir, hidden_dropout_prob=a.dropout, attention_probs_dropout_prob=a.dropout)
    feats = train_features(tok, flatten(a.train_file, True), a)
    order = shuffled_order(feats["input_ids"].shape[0], a)
    fit(model, a, order, lambda idx: batch_of(feats, idx))
    by_search, n_eval = predict(model, tok, flatten(a.eval_file, False), a)
    with open(a.eval_file) as f:
        data = json.load(f)["data"]
    r = {}
    for search, (preds, empty) in by_search.items():
        name = "predictions.json" if search == "nbest" else f"predictions_{search}.json"
        with open(os.path.join(a.out, name), "w") as f:
            json.dump(preds, f)
        r[search] = dict(evaluate_v1(data, preds), empty=empty)
    r.update(r["nbest"])
    r.update(questions=len(by_search["nbest"][0]), train_features=int(feats["input_ids"].shape[0]),
             eval_features=n_eval, steps=len(order))
    path = os.path.join(a.out, "eval_results.json")
    with open(path + ".tmp", "w") as f:  # whole or absent: its presence marks the run done
        json.dump(r, f)
    os.replace(path + ".tmp", path)
    if os.path.exists(os.path.join(a.out, "resume.pt")):
        os.remove(os.path.join(a.out, "resume.pt"))
    print(json.dumps(r))


if __name__ == "__main__":
    main()
