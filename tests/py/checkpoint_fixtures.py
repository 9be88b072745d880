"""Checkpoints in the formats users have, written by the tools that write them,
for tests/lua/test_import.lua.

usage:
  /usr/bin/python3 tests/py/checkpoint_fixtures.py torch OUT
      OUT/st/        transformers BertForPreTraining, safetensors (the twin)
      OUT/hf_bin/    the same model, pytorch_model.bin (torch.save zip) + config.json + vocab.txt
      OUT/legacy/    the same model in torch.save's legacy (pre-1.6, non-zip) format
      OUT/proto4/, OUT/proto5/  the same model, torch.save(..., pickle_protocol=4 / 5) (MEMOIZE opcodes)
      OUT/qa_st/     a BertForQuestionAnswering, safetensors
      OUT/nvidia/    the same QA model as NVIDIA saves it: bert_qa.pt = {"model": state dict with
                     "module." prefixes and NVIDIA's "dense_act" names, "optimizer": ..., "epoch": 2}
                     + bert_config.json + vocab.txt
      OUT/nvidia_pt/ a BertForPreTraining as NVIDIA's run_pretraining.py saves it: its config's vocab_size
                     padded to a multiple of 8 (99 -> 104 rows of random values), {"model": state dict with
                     "module." names, "optimizer": ..., "files": ..., "epoch": ...}, bert_config.json saying 99;
                     the unpadded twin in OUT/st
      OUT/nvidia_full/ the same at NVIDIA's real vocabulary (30522 -> 30528 rows), hidden size 8, one layer
      OUT/evil.pt    a torch.save-shaped zip whose pickle calls os.system("touch OUT/pwned")
      OUT/hostile/*.pt  torch.save-shaped zips with hostile contents (see hostile())
  /usr/bin/python3 tests/py/checkpoint_fixtures.py tf OUT        (needs tensorflow)
      OUT/tf/        bert_model.ckpt.{index,data-00000-of-00001} written by tf.compat.v1.train.Saver
                     with Google's variable names and Adam slots + bert_config.json + vocab.txt
      OUT/tf_ref.safetensors  the batch and transformers' outputs after its own TF->PyTorch
                     conversion (load_tf_weights_in_bert): last_hidden, prediction_logits, nsp_logits
      OUT/tf_padded/ OUT/tf's weights with the word embeddings and output bias padded to 104 rows
      OUT/tf_squad/, OUT/tf_cls/  fine-tuned checkpoints: bert/* + cls/squad/output_* (SQuAD) or
                     output_weights/output_bias (classifier, 3 labels); OUT/tf_heads.safetensors
                     holds those head arrays
Exit code 77 (skip, with the reason) when torch/transformers/tensorflow are missing.
"""
import collections
import io
import json
import os
import pickle
import sys
import zipfile

try:
    import numpy as np
    import torch
    import transformers
    from safetensors.numpy import save_file
except Exception as e:  # noqa: BLE001
    print(f"skipped: torch/transformers/safetensors not importable by {sys.executable}: {e}")
    sys.exit(77)

CFG = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
           max_position_embeddings=40, type_vocab_size=2, hidden_act="gelu", hidden_dropout_prob=0.1,
           attention_probs_dropout_prob=0.1, initializer_range=0.02)


def vocab(path):
    with open(path, "w") as f:
        toks = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"tok{i}" for i in range(5, CFG["vocab_size"])]
        f.write("\n".join(toks) + "\n")


def model(cls, seed):
    torch.manual_seed(seed)
    m = getattr(transformers, cls)(transformers.BertConfig(**CFG)).eval()
    with torch.no_grad():  # non-trivial biases and LayerNorms, so a misplaced tensor shows
        for n, p in m.named_parameters():
            if n.endswith("bias") or "LayerNorm" in n:
                p.add_(torch.randn_like(p) * 0.1)
    return m


def save_dir(m, d, safe):
    m.save_pretrained(d, safe_serialization=safe)
    vocab(os.path.join(d, "vocab.txt"))


def nvidia_names(sd):
    out = {}
    for k, v in sd.items():
        k = k.replace("intermediate.dense.", "intermediate.dense_act.").replace("pooler.dense.", "pooler.dense_act.")
        k = k.replace("transform.dense.", "transform.dense_act.")
        out["module." + k] = v
    return out


VOCAB_ROWS = ("bert.embeddings.word_embeddings.weight", "cls.predictions.decoder.weight", "cls.predictions.bias")


def pad_rows(a, rows, seed):
    """a with random rows appended up to `rows` (NVIDIA's padding rows are trained, not zero)."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([a, torch.randn((rows - a.shape[0],) + tuple(a.shape[1:]), generator=g)])


def nvidia_pretraining_ckpt(sd, cfg, d, rows):
    """A run_pretraining.py checkpoint: the model built with vocab_size padded to `rows`."""
    os.makedirs(d, exist_ok=True)
    sd = {k: pad_rows(v, rows, 7) if k in VOCAB_ROWS else v for k, v in sd.items()}
    sd["cls.predictions.decoder.weight"] = sd["bert.embeddings.word_embeddings.weight"]  # tied, as in training
    torch.save({"model": nvidia_names(sd), "optimizer": {"state": {}, "param_groups": []},
                "master params": [], "files": [0, ["shard_0.hdf5"]], "epoch": 1},
               f"{d}/ckpt_8601.pt")
    with open(f"{d}/bert_config.json", "w") as f:
        json.dump(cfg, f)


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch " + self.marker,))


def make_torch(out):
    pt = model("BertForPreTraining", 1)
    save_dir(pt, f"{out}/st", True)
    save_dir(pt, f"{out}/hf_bin", False)
    assert os.path.exists(f"{out}/hf_bin/pytorch_model.bin")
    os.makedirs(f"{out}/legacy", exist_ok=True)
    torch.save(pt.state_dict(), f"{out}/legacy/pytorch_model.bin", _use_new_zipfile_serialization=False)
    pt.config.to_json_file(f"{out}/legacy/config.json")
    for proto in (4, 5):
        os.makedirs(f"{out}/proto{proto}", exist_ok=True)
        torch.save(pt.state_dict(), f"{out}/proto{proto}/pytorch_model.bin", pickle_protocol=proto)
        pt.config.to_json_file(f"{out}/proto{proto}/config.json")
    qa = model("BertForQuestionAnswering", 2)
    save_dir(qa, f"{out}/qa_st", True)
    os.makedirs(f"{out}/nvidia", exist_ok=True)
    sd = qa.state_dict()
    first = next(iter(sd.values()))
    torch.save({"model": nvidia_names(sd), "epoch": 2,
                "optimizer": {"state": {0: {"exp_avg": torch.zeros_like(first), "step": 10}},
                              "param_groups": [{"lr": 3e-5, "betas": (0.9, 0.999), "params": [0]}]}},
               f"{out}/nvidia/bert_qa.pt")
    with open(f"{out}/nvidia/bert_config.json", "w") as f:
        json.dump(CFG, f)
    vocab(f"{out}/nvidia/vocab.txt")
    nvidia_pretraining_ckpt({k: v for k, v in pt.state_dict().items() if not k.endswith("position_ids")}, CFG,
                            f"{out}/nvidia_pt", 104)
    vocab(f"{out}/nvidia_pt/vocab.txt")
    full = dict(CFG, vocab_size=30522, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=16)
    torch.manual_seed(6)
    big = transformers.BertForPreTraining(transformers.BertConfig(**full)).eval()
    big.save_pretrained(f"{out}/full_st", safe_serialization=True)
    nvidia_pretraining_ckpt({k: v for k, v in big.state_dict().items() if not k.endswith("position_ids")}, full,
                            f"{out}/nvidia_full", 30528)
    with zipfile.ZipFile(f"{out}/evil.pt", "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps({"w": Evil(f"{out}/pwned")}, protocol=2))
        z.writestr("archive/version", "3\n")
    hostile(f"{out}/hostile")


class Storage:
    """Stands for a storage; the pickler turns it into torch's persistent reference."""

    def __init__(self, key, numel):
        self.key, self.numel = key, numel


class Tensor:
    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)


class TorchPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel)
        return None


def torch_zip(path, obj=None, storages=None, raw=None, method=zipfile.ZIP_STORED):
    buf = io.BytesIO()
    if raw is None:
        TorchPickler(buf, protocol=2).dump(obj)
    with zipfile.ZipFile(path, "w", method) as z:
        z.writestr("archive/data.pkl", raw if raw is not None else buf.getvalue())
        for key, data in (storages or {}).items():
            z.writestr(f"archive/data/{key}", data)


def hostile(d):
    os.makedirs(d, exist_ok=True)
    four = {"0": np.arange(1, 5, dtype=np.float32).tobytes()}
    s = Storage("0", 4)
    torch_zip(f"{d}/ok.pt", {"w": Tensor(s, 0, (2, 2), (2, 1)), "wt": Tensor(s, 0, (2, 2), (1, 2))}, four)
    torch_zip(f"{d}/huge_shape.pt", {"w": Tensor(s, 0, (1 << 40, 1 << 40), (1, 1))}, four)
    torch_zip(f"{d}/past_storage.pt", {"w": Tensor(s, 3, (4,), (1,))}, four)
    torch_zip(f"{d}/storage_size.pt", {"w": Tensor(Storage("0", 1 << 40), 0, (4,), (1,))}, four)
    torch_zip(f"{d}/missing_storage.pt", {"w": Tensor(Storage("7", 4), 0, (4,), (1,))}, four)
    torch_zip(f"{d}/compressed.pt", {"w": Tensor(s, 0, (4,), (1,))}, four, method=zipfile.ZIP_DEFLATED)
    n = 100000
    torch_zip(f"{d}/deep.pt", raw=b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b".")
    cyc = []
    cyc.append(cyc)
    torch_zip(f"{d}/cycle.pt", {"loop": cyc, "w": Tensor(s, 0, (4,), (1,))}, four)
    torch_zip(f"{d}/bad_opcode.pt", raw=b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01\xffu.")


# Google's variable names for a transformers state dict; kernels are stored [in, out]
def google_names(sd):
    out = {}
    for k, v in sd.items():
        a = v.detach().numpy().astype(np.float32)
        if k == "cls.predictions.decoder.weight" or k.endswith("position_ids"):
            continue
        if k == "cls.predictions.bias":
            out["cls/predictions/output_bias"] = a
            continue
        if k.startswith("cls.seq_relationship."):
            out["cls/seq_relationship/output_" + ("weights" if k.endswith("weight") else "bias")] = a
            continue
        n = k.replace(".", "/")
        for i in range(CFG["num_hidden_layers"]):
            n = n.replace(f"layer/{i}/", f"layer_{i}/")
        if "LayerNorm" in n:
            n = n.replace("/weight", "/gamma").replace("/bias", "/beta")
        elif "_embeddings" in n:
            n = n[: -len("/weight")]
        elif n.endswith("/weight"):
            n, a = n[: -len("/weight")] + "/kernel", a.T.copy()
        out[n] = a
    return out


def tf_save(tf, variables, d, slots=True):
    os.makedirs(d, exist_ok=True)
    g = tf.Graph()
    with g.as_default():
        vs = [tf.compat.v1.get_variable(n, initializer=tf.constant(a)) for n, a in variables.items()]
        if slots:  # what Google's AdamWeightDecayOptimizer leaves in a checkpoint
            for n, a in variables.items():
                vs.append(tf.compat.v1.get_variable(n + "/adam_m", initializer=tf.constant(a * 0.5)))
                vs.append(tf.compat.v1.get_variable(n + "/adam_v", initializer=tf.constant(a * a)))
            vs.append(tf.compat.v1.train.get_or_create_global_step())
        saver = tf.compat.v1.train.Saver(vs)
        with tf.compat.v1.Session(graph=g) as s:
            s.run(tf.compat.v1.global_variables_initializer())
            saver.save(s, f"{d}/bert_model.ckpt", write_meta_graph=False, write_state=False)
    with open(f"{d}/bert_config.json", "w") as f:
        json.dump(CFG, f)
    vocab(f"{d}/vocab.txt")


def make_tf(out):
    try:
        import tensorflow as tf
    except Exception as e:  # noqa: BLE001
        print(f"skipped: tensorflow not importable by {sys.executable} (pip install tensorflow-cpu): {e}")
        sys.exit(77)
    pt = model("BertForPreTraining", 3)
    tf_save(tf, google_names(pt.state_dict()), f"{out}/tf")
    # the reference: transformers' own conversion of the checkpoint TensorFlow wrote
    conv = transformers.BertForPreTraining(transformers.BertConfig(**CFG)).eval()
    transformers.load_tf_weights_in_bert(conv, conv.config, f"{out}/tf/bert_model.ckpt")
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(5, CFG["vocab_size"], (2, 9), generator=g)
    ids[:, 0] = 2
    tt = torch.zeros_like(ids)
    tt[:, 5:] = 1
    am = torch.ones_like(ids)
    am[1, 7:] = 0
    with torch.no_grad():
        o = conv(input_ids=ids, token_type_ids=tt, attention_mask=am, output_hidden_states=True)
    save_file({"input_ids": ids.numpy().astype(np.int64), "token_type_ids": tt.numpy().astype(np.int64),
               "attention_mask": am.numpy().astype(np.int64),
               "last_hidden": o.hidden_states[-1].numpy(), "prediction_logits": o.prediction_logits.numpy(),
               "nsp_logits": o.seq_relationship_logits.numpy()}, f"{out}/tf_ref.safetensors")
    padded = google_names(pt.state_dict())
    for k in ("bert/embeddings/word_embeddings", "cls/predictions/output_bias"):
        padded[k] = pad_rows(torch.from_numpy(padded[k]), 104, 8).numpy()
    tf_save(tf, padded, f"{out}/tf_padded", slots=False)
    enc = {k: v for k, v in google_names(pt.state_dict()).items() if k.startswith("bert/")}
    rng = np.random.default_rng(5)
    heads = {"cls/squad/output_weights": rng.standard_normal((2, CFG["hidden_size"]), dtype=np.float32),
             "cls/squad/output_bias": rng.standard_normal(2, dtype=np.float32),
             "output_weights": rng.standard_normal((3, CFG["hidden_size"]), dtype=np.float32),
             "output_bias": rng.standard_normal(3, dtype=np.float32)}
    tf_save(tf, {**enc, **{k: v for k, v in heads.items() if "squad" in k}}, f"{out}/tf_squad", slots=False)
    tf_save(tf, {**enc, **{k: v for k, v in heads.items() if k.startswith("output")}}, f"{out}/tf_cls", slots=False)
    save_file({k.replace("/", "."): v for k, v in heads.items()}, f"{out}/tf_heads.safetensors")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("torch", "tf"):
        print(__doc__)
        sys.exit(2)
    os.makedirs(sys.argv[2], exist_ok=True)
    (make_torch if sys.argv[1] == "torch" else make_tf)(sys.argv[2])
