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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def session(raw, d, heads, hidden, threads, precision):
    """An onnxruntime CPU session of the ONNX BERT at raw (d: a scratch directory): the graph fused by onnxruntime's
    BERT optimizer, int8 its dynamic quantization; returns the session and a line saying what it runs."""
    import onnxruntime as ort
    from onnxruntime.transformers import optimizer
    fused = os.path.join(d, "bert_fused.onnx")
    opt = optimizer.optimize_model(raw, model_type="bert", num_heads=heads, hidden_size=hidden)
    stats = {k: v for k, v in opt.get_fused_operator_statistics().items() if v}
    opt.save_model_to_file(fused)
    if precision == "int8":
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic
        quant = os.path.join(d, "bert_int8.onnx")
        # the fused graph's com.microsoft ops defeat onnx's shape inference: their outputs are f32
        quantize_dynamic(fused, quant, per_channel=True, weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        fused = quant
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(fused, so, providers=["CPUExecutionProvider"])
    what = "int8 quantize_dynamic (per-channel weights)" if precision == "int8" else "fp32"
    if precision not in ("int8", "fp32"):
        what += f" (--precision {precision} has no CPU counterpart here)"
    return sess, f"onnxruntime {ort.__version__}, fused graph: {stats}, {what}"


def main(argv):
    try:
        import onnxruntime  # noqa: F401
        from bert_reference import infer_peer
    except Exception as e:  # noqa: BLE001
        from bert_reference import skip_not_importable
        return skip_not_importable("onnxruntime / onnx / torch / transformers", e)

    def make(raw, d, inputs, a):
        sess, line = session(raw, d, a.heads, a.hidden, a.threads, a.precision)
        return lambda: sess.run(None, inputs), line
    return infer_peer(argv, "onnxruntime", make)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
