"""OpenVINO peer of recipes/benchmark.lua --infer --compare=openvino.

usage: .venv-peers/bin/python tools/peers/bench_bert_openvino.py --layers L --hidden H --heads A
      --seq S --batch B --steps N --threads T [--vocab V] [--lengths N1,N2,...] [--rounds R]
      [--precision fp32|bf16|int8] --infer

The encoder of bench_bert_onnxruntime.py (the same ONNX export: transformers' BertModel with its
pooler, the same weights, batch and rows) read by OpenVINO and compiled for its CPU plugin with
T inference threads, one stream, the latency hint and INFERENCE_PRECISION_HINT set explicitly
(OpenVINO's default on a CPU with AVX512-BF16/AMX is bf16): fp32 -> f32, bf16 -> bf16, int8 ->
OpenVINO's own post-training quantization of the model (nncf.quantize, transformer preset,
calibrated on the benchmark batch), the rest in f32. Throughput and the median latency of one
step as bert_reference.time_rounds prints them. Exits 77 when openvino/nncf/torch/transformers
cannot be imported (bash scripts/peers.sh installs them in .venv-peers/).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HINT = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}


def compiled(raw, inputs, threads, precision, calibration=None, extra=None):
    """The ONNX BERT at raw compiled by OpenVINO for the CPU, static shapes of inputs (name -> array), `threads`
    threads, one stream, the precision hint of `precision` and, int8, NNCF's quantization calibrated on
    `calibration` (a list of such inputs; default [inputs]); extra: more compile properties (e.g. PERF_COUNT).
    Returns the compiled model and a line saying what runs."""
    import openvino as ov
    core = ov.Core()
    model = core.read_model(raw)
    model.reshape({n: list(v.shape) for n, v in inputs.items()})  # static shapes, as the rows are fixed
    what = f"INFERENCE_PRECISION_HINT={HINT[precision]}"
    if precision == "int8":
        import nncf
        model = nncf.quantize(model, nncf.Dataset(calibration or [inputs]), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(calibration or [inputs]))
        what = f"int8 nncf {nncf.__version__} post-training quantization (transformer preset), rest " + what
    c = core.compile_model(model, "CPU", {
        "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": HINT[precision], **(extra or {})})
    got = c.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    return c, f"openvino {ov.__version__}, {what} (compiled: {got}, {c.get_property('INFERENCE_NUM_THREADS')} threads)"


def main(argv):
    try:
        import openvino  # noqa: F401
        import nncf  # noqa: F401
        from bert_reference import infer_peer
    except Exception as e:  # noqa: BLE001
        from bert_reference import skip_not_importable
        return skip_not_importable("openvino / nncf / torch / transformers", e)

    def make(raw, d, inputs, a):
        if a.precision not in HINT:
            raise SystemExit(f"openvino peer: --precision {a.precision}: fp32, bf16 or int8")
        c, line = compiled(raw, inputs, a.threads, a.precision)
        req = c.create_infer_request()
        return lambda: req.infer(inputs), line
    return infer_peer(argv, "openvino", make)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
