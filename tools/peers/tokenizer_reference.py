#!/usr/bin/env python3
"""Reference tokenization for the bertlua tokenizer tests and benchmark.

Reads UTF-8 text on stdin (bytes decoded with errors="replace", lines split on
"\n" only) and writes one line per input line: the reference's tokens (or ids,
or basic tokens) separated by single spaces. --impl picks the reference:
  slow    Hugging Face transformers' Python BertTokenizer (default)
  google  google-research/bert tokenization.py (pip bert-tensorflow; its
          TensorFlow import is only used to open the vocabulary, so a stub
          stands in for it); the special tokens are cut out verbatim first, as
          the other two do
  rust    Hugging Face tokenizers (BertWordPieceTokenizer), tokens/ids only
For google and rust, private-use (Co) and unassigned (Cn) code points are
dropped first: Google keeps them as text, the Rust one keeps unassigned ones
(its Unicode tables), transformers' Python tokenizer and bertlua clean both
away with the controls.

  tokenizer_reference.py --vocab=FILE [--cased] [--impl=slow|google|rust] [--mode=tokens|ids|basic] < in > out
  tokenizer_reference.py --vocab=FILE [--cased] --bench=FILE   # HF tokenizers (Rust), 1 thread

Exits 77 after printing "skipped: ..." when the reference is not importable.
Install: /usr/bin/python3 -m pip install --break-system-packages -r scripts/requirements-test.txt
"""
import argparse
import os
import re
import sys
import time
import types
import unicodedata

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def drop_private_unassigned(line):
    return "".join(c for c in line if unicodedata.category(c) not in ("Co", "Cn"))


def google_tokenizer(vocab, cased, basic):
    tf = types.ModuleType("tensorflow")
    tf.compat = types.SimpleNamespace(v1=types.SimpleNamespace(gfile=types.SimpleNamespace(GFile=open)))
    sys.modules.setdefault("tensorflow", tf)
    sys.modules.setdefault("tensorflow.compat", tf.compat)
    sys.modules.setdefault("tensorflow.compat.v1", tf.compat.v1)
    from bert import tokenization
    from absl import flags
    flags.FLAGS(["tokenizer_reference"])  # its flags at their defaults (preserve_unused_tokens=False)
    full = tokenization.FullTokenizer(vocab, do_lower_case=not cased)
    step = full.basic_tokenizer.tokenize if basic else full.tokenize
    split = re.compile("(" + "|".join(re.escape(t) for t in SPECIALS) + ")")

    def tokenize(line):
        line = drop_private_unassigned(line)
        out = []
        for part in split.split(line):
            out.extend([part] if part in SPECIALS else step(part))
        return out
    return tokenize, full.convert_tokens_to_ids


def make_tokenizer(a):
    if a.impl == "google":
        return google_tokenizer(a.vocab, a.cased, a.mode == "basic")
    if a.impl == "rust":
        from tokenizers import BertWordPieceTokenizer
        if a.mode == "basic":
            raise SystemExit("--impl=rust has no basic mode")
        tok = BertWordPieceTokenizer(a.vocab, lowercase=not a.cased, strip_accents=None,
                                     clean_text=True, handle_chinese_chars=True)
        tok.add_special_tokens(SPECIALS)
        return (lambda line: tok.encode(drop_private_unassigned(line), add_special_tokens=False).tokens), \
            (lambda toks: [tok.token_to_id(t) for t in toks])
    from transformers import BertTokenizer
    tok = BertTokenizer(a.vocab, do_lower_case=not a.cased)
    if a.mode == "basic":
        tok.wordpiece_tokenizer.tokenize = lambda t: [t]
    return tok.tokenize, tok.convert_tokens_to_ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--cased", action="store_true")
    ap.add_argument("--mode", default="tokens", choices=["tokens", "ids", "basic"])
    ap.add_argument("--impl", default="slow", choices=["slow", "google", "rust"])
    ap.add_argument("--bench", default=None, help="time HF tokenizers (Rust) on this file")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if a.bench:
        return bench(a)
    try:
        tokenize, to_ids = make_tokenizer(a)
    except ImportError as e:
        print(f"skipped: the {a.impl} reference is not importable ({e.__class__.__name__}: {e})")
        return 77
    data = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    lines = data.split("\n")
    if data.endswith("\n"):
        lines.pop()
    out = []
    for line in lines:
        toks = tokenize(line)
        if a.mode == "ids":
            toks = [str(i) for i in to_ids(toks)]
        out.append(" ".join(toks))
    sys.stdout.buffer.write(("\n".join(out) + ("\n" if out else "")).encode("utf-8", errors="surrogatepass"))
    return 0


def bench(a):
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        from tokenizers import BertWordPieceTokenizer
    except Exception as e:  # noqa: BLE001
        print(f"skipped: tokenizers is not importable ({e})")
        return 77
    tok = BertWordPieceTokenizer(a.vocab, lowercase=not a.cased, strip_accents=None if a.cased else True,
                                 clean_text=True, handle_chinese_chars=True)
    with open(a.bench, "rb") as f:
        raw = f.read()
    lines = raw.decode("utf-8", errors="replace").split("\n")
    best = None
    ntok = 0
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        ntok = 0
        for line in lines:  # one call per line, single thread
            ntok += len(tok.encode(line, add_special_tokens=False).ids)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    t0 = time.perf_counter()
    enc = tok.encode_batch(lines, add_special_tokens=False)
    dtb = time.perf_counter() - t0
    print(f"hf_tokenizers_rust bytes={len(raw)} tokens={ntok} seconds={best:.4f} MBps={len(raw) / best / 1e6:.2f} "
          f"batch_seconds={dtb:.4f} batch_MBps={len(raw) / dtb / 1e6:.2f} batch_tokens={sum(len(e.ids) for e in enc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
