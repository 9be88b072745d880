"""ONNX Runtime peer of recipes/benchmark.lua --infer --compare=onnxruntime.

usage: /usr/bin/python3 tools/peers/bench_bert_onnxruntime.py --layers L --hidden H --heads A
      --seq S --batch B --steps N --threads T [--vocab V] [--lengths N1,N2,...] [--rounds R] --infer

The encoder (transformers' BertModel with its pooler, the shapes and batch of bert_reference.py's
torch benchmark: the last S/8 tokens of every sequence padded) is exported with torch.onnx.export,
then rewritten by onnxruntime's BERT graph optimizer (fused Attention, SkipLayerNormalization,
BiasGelu / FastGelu, EmbedLayerNormalization: the counts are printed) and timed on the CPU provider
with T intra-op threads: throughput and the median latency of one step (per block of --steps; see
bert_reference.time_rounds for --rounds). --precision int8 times
onnxruntime's own dynamic quantization of the fused graph (quantize_dynamic, per_channel=True,
QInt8 weights; activations uint8 per tensor at run time); other precisions run the fp32 graph
(the CPU provider has no bf16 GEMMs), said so in the output. Exits 77 when onnxruntime, onnx or
transformers cannot be imported.
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    try:
        import numpy as np
        import onnxruntime as ort
        from onnxruntime.transformers import optimizer
        import torch
        from transformers import BertConfig, BertModel
        from bert_reference import bench_args, bench_batch, bench_config, time_rounds
    except Exception as e:  # noqa: BLE001
        print(f"skipped: onnxruntime / onnx / torch / transformers not importable: {e}")
        return 77
    precision = "fp32"
    if "--precision" in argv:  # ours only; the rest are the CPU peers' common options
        i = argv.index("--precision")
        precision, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    a = bench_args(argv)
    if not a.infer:
        print("onnxruntime peer: inference only (pass --infer)")
        return 2

    torch.manual_seed(0)
    model = BertModel(BertConfig(**bench_config(a))).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    ids, mask, _, _ = bench_batch(a.batch, a.seq, a.vocab, a.masked, a.lengths)
    feed = {"input_ids": ids, "attention_mask": mask.long(), "token_type_ids": torch.zeros_like(ids)}
    with tempfile.TemporaryDirectory() as d:
        raw, fused = os.path.join(d, "bert.onnx"), os.path.join(d, "bert_fused.onnx")
        names = list(feed)
        dyn = {n: {0: "batch", 1: "seq"} for n in names}
        torch.onnx.export(model, tuple(feed[n] for n in names), raw, input_names=names,
                          output_names=["last_hidden_state", "pooler_output"], dynamic_axes=dyn, opset_version=14)
        opt = optimizer.optimize_model(raw, model_type="bert", num_heads=a.heads, hidden_size=a.hidden)
        stats = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
        opt.save_model_to_file(fused)
        if precision == "int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic
            quant = os.path.join(d, "bert_int8.onnx")
            import onnx
            # the fused graph's com.microsoft ops defeat onnx's shape inference: their outputs are f32
            quantize_dynamic(fused, quant, per_channel=True, weight_type=QuantType.QInt8,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
            fused = quant
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        sess = ort.InferenceSession(fused, so, providers=["CPUExecutionProvider"])
    what = "int8 quantize_dynamic (per-channel weights)" if precision == "int8" else "fp32"
    if precision not in ("int8", "fp32"):
        what += f" (--precision {precision} has no CPU counterpart here)"
    print(f"onnxruntime {ort.__version__}, fused graph: {stats}, {what}")
    inputs = {n: feed[n].numpy().astype(np.int64) for n in names}
    for _ in range(a.warmup):
        sess.run(None, inputs)
    time_rounds(a, "onnxruntime", lambda: sess.run(None, inputs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
