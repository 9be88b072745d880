"""ONNX Runtime's own dynamic int8 on all-MiniLM-L6-v2: the peer of tests/lua/test_infer_lowp.lua's
accuracy figures (BENCHMARKS.md, "CPU bf16 and dynamic-int8 inference").

usage: /usr/bin/python3 tests/py/minilm_int8_onnxruntime.py MODEL_DIR [SST2_DEV_TSV]

The same sentences as the Lua test (SST-2 dev's first 64, else its five built-in ones), tokenized by
transformers' tokenizer of the model directory (max 128 tokens), through transformers' BertModel in
fp32 (torch) and through onnxruntime: the exported fp32 graph, and that graph after
onnxruntime.quantization.quantize_dynamic (QInt8 weights; per_channel False, its default, and True;
activations uint8 per tensor at run time). Prints, for each, the cosine similarity to torch's fp32
output: sentence embeddings (mean of the last layer over real tokens) and every real token's vector.
Exits 77 when torch, transformers or onnxruntime cannot be imported.
"""
import os
import sys
import tempfile

BUILTIN = ["a charming and often affecting journey.", "unflinchingly bleak and desperate",
           "the acting, costumes, music, cinematography and sound are all astounding given the production's "
           "austere locales.", "it's slow -- very, very slow.", "a sometimes tedious film."]


def cosines(ref, out, mask):
    import numpy as np
    m = mask.astype(bool)
    a, b = ref[m], out[m]
    tok = (a * b).sum(1) / np.sqrt((a * a).sum(1) * (b * b).sum(1))
    w = mask[..., None]
    sa, sb = (ref * w).sum(1), (out * w).sum(1)
    sent = (sa * sb).sum(1) / np.sqrt((sa * sa).sum(1) * (sb * sb).sum(1))
    return sent.min(), tok.min(), tok.mean(), np.abs(a - b).max()


def main(argv):
    try:
        import numpy as np
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
        import torch
        from transformers import BertModel, BertTokenizerFast
    except Exception as e:  # noqa: BLE001
        print(f"skipped: torch / transformers / onnxruntime not importable: {e}")
        return 77
    model_dir = argv[0]
    sents = BUILTIN
    if len(argv) > 1 and os.path.exists(argv[1]):
        with open(argv[1], encoding="utf-8") as f:
            sents = [line.split("\t")[0] for line in f.read().splitlines()[1:65]]
    tok = BertTokenizerFast.from_pretrained(model_dir)
    enc = tok(sents, padding=True, truncation=True, max_length=128, return_tensors="pt")
    model = BertModel.from_pretrained(model_dir, add_pooling_layer=False).eval()
    with torch.no_grad():
        ref = model(**enc).last_hidden_state.numpy()
    mask = enc["attention_mask"].numpy()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    feed = {n: enc[n].numpy().astype(np.int64) for n in names}
    print(f"{len(sents)} sentences, onnxruntime {ort.__version__}; cosine to torch fp32:")
    with tempfile.TemporaryDirectory() as d:
        raw = os.path.join(d, "minilm.onnx")
        torch.onnx.export(model, tuple(enc[n] for n in names), raw, input_names=names,
                          output_names=["last_hidden_state"], opset_version=14,
                          dynamic_axes={n: {0: "batch", 1: "seq"} for n in names})
        runs = [("fp32", raw)]
        for per_channel in (False, True):
            q = os.path.join(d, f"minilm_int8_{per_channel}.onnx")
            quantize_dynamic(raw, q, per_channel=per_channel, weight_type=QuantType.QInt8)
            runs.append((f"int8 quantize_dynamic per_channel={per_channel}", q))
        for name, path in runs:
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            out = sess.run(["last_hidden_state"], feed)[0]
            s, tmin, tmean, dmax = cosines(ref, out, mask)
            print(f"onnxruntime {name}: sentence cosine min {s:.5f}; token cosine min {tmin:.5f} mean {tmean:.5f}; "
                  f"max |diff| {dmax:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
