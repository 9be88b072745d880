"""Checks an ONNX file bertlua exported, for tests/lua/test_onnx.lua.

usage: /usr/bin/python3 tests/py/onnx_check.py MODEL.onnx REF.safetensors [--fuse HEADS HIDDEN] [--save OUT]
  onnx.checker.check_model (full check, with shape inference), then onnxruntime runs the
  graph on REF's input_ids / attention_mask / token_type_ids and compares every output that
  REF also holds (bertlua's values). --fuse: onnxruntime's transformer optimizer is run on
  it too and its fused-operator counts are reported. --save: the outputs as safetensors.
Prints one JSON object: {"inputs": {name: dims}, "outputs": [...], "maxdiff": {name: max |ort - bertlua|},
"fused": {...}}; dims are numbers or the names of dynamic dimensions.
Exit code 77 (skip, with the reason) when onnx / onnxruntime are missing.
"""
import argparse
import json
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from safetensors.numpy import load_file, save_file
except Exception as e:  # noqa: BLE001
    print(f"skipped: onnx/onnxruntime/safetensors not importable by {sys.executable}: {e}")
    sys.exit(77)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("ref")
    ap.add_argument("--fuse", nargs=2, type=int)
    ap.add_argument("--save")
    a = ap.parse_args()
    path, ref_path = a.model, a.ref
    onnx.checker.check_model(path, full_check=True)
    ref = load_file(ref_path)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    # the graph as written, not rewritten by onnxruntime's own fusions
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {i.name: ref[i.name].astype(np.int64) for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    outs = dict(zip(names, sess.run(None, feed)))
    res = {"inputs": {i.name: i.shape for i in sess.get_inputs()}, "outputs": names, "maxdiff": {},
           "shapes": {n: list(v.shape) for n, v in outs.items()}}
    for n, v in outs.items():
        if n in ref:
            res["maxdiff"][n] = float(np.abs(v.astype(np.float64) - ref[n].astype(np.float64)).max())
    if a.save:
        save_file({n: np.ascontiguousarray(v.astype(np.float32)) for n, v in outs.items()}, a.save)
    if a.fuse:
        from onnxruntime.transformers import optimizer

        m = optimizer.optimize_model(path, model_type="bert", num_heads=a.fuse[0], hidden_size=a.fuse[1],
                                     opt_level=0)
        res["fused"] = {k: v for k, v in m.get_fused_operator_statistics().items() if v}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
