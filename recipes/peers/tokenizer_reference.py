#!/usr/bin/env python3
"""Reference tokenization for the bertlua tokenizer tests and benchmark.

Reads UTF-8 text on stdin (bytes decoded with errors="replace", lines split on
"\n" only) and writes one line per input line: the Hugging Face *slow*
BertTokenizer's tokens (or ids, or basic tokens) separated by single spaces.

  tokenizer_reference.py --vocab=FILE [--cased] [--mode=tokens|ids|basic] < in > out
  tokenizer_reference.py --vocab=FILE [--cased] --bench=FILE   # HF tokenizers (Rust), 1 thread

Exits 77 after printing "skipped: ..." when transformers (or, for --bench,
tokenizers) is not importable. Install: /usr/bin/python3 -m pip install
--break-system-packages transformers==4.39.3 tokenizers==0.15.2
"""
import argparse
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--cased", action="store_true")
    ap.add_argument("--mode", default="tokens", choices=["tokens", "ids", "basic"])
    ap.add_argument("--bench", default=None, help="time HF tokenizers (Rust) on this file")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if a.bench:
        return bench(a)
    try:
        from transformers import BertTokenizer
    except Exception as e:  # noqa: BLE001 - any import failure means "no reference here"
        print(f"skipped: transformers is not importable ({e.__class__.__name__}: {e})")
        return 77
    tok = BertTokenizer(a.vocab, do_lower_case=not a.cased)
    if a.mode == "basic":
        tok.wordpiece_tokenizer.tokenize = lambda t: [t]
    data = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    lines = data.split("\n")
    if data.endswith("\n"):
        lines.pop()
    out = []
    for line in lines:
        toks = tok.tokenize(line)
        if a.mode == "ids":
            toks = [str(i) for i in tok.convert_tokens_to_ids(toks)]
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
