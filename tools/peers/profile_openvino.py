"""OpenVINO's own per-node profile of the benchmark encoder (bench_bert_openvino.py's model, compiled the same way
with PERF_COUNT on), to set beside a perf profile of bertlua on the same shape.

usage: .venv-peers/bin/python tools/peers/profile_openvino.py --layers 12 --hidden 768 --heads 12 --seq 128
      --batch 1 --threads 2 --steps 20 [--warmup 3] [--precision fp32|bf16|int8] [--lengths N1,N2,...]

Prints the median wall time of one inference, then the executed nodes' real time per step summed by node type and
kernel (OpenVINO's exec_type), largest first, with each one's share and nodes per step; --layer0 lists the first
encoder layer's nodes one by one instead. The rows are bench_batch's (the last S/8 tokens padded), which OpenVINO
computes. Exits 77 when openvino cannot be imported (bash scripts/peers.sh).
"""
import collections
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    layer0 = "--layer0" in argv
    argv = [a for a in argv if a != "--layer0"]
    try:
        from bench_bert_openvino import compiled
        from bert_reference import bench_args, bench_encoder_onnx
    except Exception as e:  # noqa: BLE001
        from bert_reference import skip_not_importable
        return skip_not_importable("openvino / torch / transformers", e)
    a = bench_args(argv + ["--infer"])
    with tempfile.TemporaryDirectory() as d:
        raw = os.path.join(d, "bert.onnx")
        inputs = bench_encoder_onnx(a, raw)
        c, line = compiled(raw, inputs, a.threads, a.precision, extra={"PERF_COUNT": True})
    print(line)
    req = c.create_infer_request()
    for _ in range(a.warmup):
        req.infer(inputs)
    total, count, walls = collections.defaultdict(float), collections.Counter(), []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        req.infer(inputs)
        walls.append(time.perf_counter() - t0)
        for p in req.get_profiling_info():
            if p.status != p.status.EXECUTED:
                continue
            if layer0 and "layer.0/" not in p.node_name:
                continue
            key = (p.node_name if layer0 else p.node_type, p.exec_type)
            total[key] += p.real_time.total_seconds() * 1e3
            count[key] += 1
    walls.sort()
    per_step = sum(total.values()) / a.steps
    print(f"wall per inference: median {walls[len(walls) // 2] * 1e3:.1f} ms (min {walls[0] * 1e3:.1f}); "
          f"node times {per_step:.1f} ms per step{' (encoder layer 0)' if layer0 else ''}")
    for (name, kind), ms in sorted(total.items(), key=lambda kv: -kv[1]):
        ms /= a.steps
        print(f"{ms:9.2f} ms {100 * ms / per_step:5.1f} %  x{count[(name, kind)] // a.steps:<3d} {name}  {kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
