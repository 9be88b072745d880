"""A PyTorch reference of NVIDIA DeepLearningExamples' BERT run_pretraining.py,
to compare bertlua's recipes/pretrain.lua with step by step.

usage:
  /usr/bin/python3 tools/peers/nvidia_pretrain_reference.py --init=MODEL_DIR --batches=DIR --output=OUT
      [--steps1=N --lr1=6e-3 --warmup1=0.2843 --total1=N] [--steps2=N --lr2=4e-3 --warmup2=0.128 --total2=N]
      [--dropout=0] [--max-grad-norm=1.0] [--weight-decay=0.01] [--power=0.5] [--threads=1]
      [--seed=12439] [--save-every=N] [--device=cpu|cuda] [--checkpoint-every=N] [--resume] [--max-steps=N]

  MODEL_DIR  config.json + model.safetensors as bertlua's pretrained.save_pretrained writes them (the
             initial weights of phase 1)
  DIR        the micro-batches bertlua trained on: DIR/phaseP/STEP_J.safetensors, written by
             `bertlua recipes/pretrain.lua --dump-batches=DIR ...` (so both sides see the same batches in the
             same order; the instances themselves can be read with tools/peers/blshard.py)
  OUT        OUT/log.jsonl (per step: phase, step, loss, mlm_loss, nsp_loss, grad_norm, lr) and
             OUT/phaseP/{model.safetensors,config.json} after each phase (with --save-every=N also
             OUT/phaseP/step_NNNNNN/ every N steps); with --checkpoint-every=N also OUT/resume.pt (weights,
             optimizer, dropout generator, phase and step) every N steps and at each phase end, which --resume
             continues from: the resumed run writes the log and weights of the uninterrupted one, bit for bit

What it reproduces (the parts of NVIDIA's recipe that decide the numbers):
  - transformers' BertForPreTraining (its word embedding without padding_idx, as NVIDIA's): the MLM head applied to the masked positions only (NVIDIA gathers
    sequence_output[masked_lm_labels != -1] before the transform and the decoder tied to the word embeddings),
    NSP on the pooled [CLS]; loss = MLM cross-entropy (mean over the micro-batch's masked tokens) + NSP
    cross-entropy (mean over its sequences), divided by the accumulation steps before backward;
  - NVLAMB as apex FusedLAMB applies it in run_pretraining.py: betas (0.9, 0.999), eps 1e-6, AdamW-style
    decoupled decay 0.01 except for names containing bias/gamma/beta/LayerNorm, the global gradient norm over
    all parameters and the gradients divided by norm/max_grad_norm when it exceeds max_grad_norm, bias
    correction, and the trust ratio ||p||/||update|| only on decayed tensors (use_nvlamb=False);
  - PolyWarmUpScheduler: update k (1-based) uses p = k/total, lr = base*p/warmup while p < warmup, else
    base*(1-p)^power;
  - phase 2 starts from this reference's own phase-1 weights with a fresh optimizer and schedule.
Where it differs from NVIDIA on purpose: no vocabulary padding to a multiple of 8 (bertlua's weights have the
real vocabulary), no fused kernels or fp16 (fp32 throughout), batches replayed from bertlua instead of NVIDIA's
HDF5 loader. Exit code 77 (skip) when torch/transformers are missing.
"""
import argparse
import glob
import json
import math
import os
import shutil
import sys

try:
    import torch
    import torch.nn.functional as F
    from transformers import BertConfig, BertForPreTraining
except Exception as e:  # noqa: BLE001
    print(f"skipped: torch/transformers not importable by {sys.executable}: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "recipes", "peers"))
from bert_reference import st_load, st_save  # noqa: E402  (the minimal safetensors reader/writer)

NO_DECAY = ("bias", "gamma", "beta", "LayerNorm")


def fail(msg):
    sys.exit(f"nvidia_pretrain_reference: {msg}")


def load_model(init_dir, dropout, config=None):
    """BertForPreTraining from init_dir's model.safetensors and config.json (or the file config)."""
    with open(config or os.path.join(init_dir, "config.json")) as f:
        cfg = BertConfig(**json.load(f))
    if dropout is not None:
        cfg.hidden_dropout_prob = cfg.attention_probs_dropout_prob = dropout
    model = BertForPreTraining(cfg)
    sd = st_load(os.path.join(init_dir, "model.safetensors"))
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    missing = [k for k in missing if k not in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
                                               "bert.embeddings.position_ids")]
    if missing or unexpected:
        fail(f"{init_dir}/model.safetensors: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    # transformers' word embedding has padding_idx = [PAD] (no gradient for that row); NVIDIA's and Google's have
    # none, and a masked token replaced by a random word can be [PAD]
    model.bert.embeddings.word_embeddings.padding_idx = None
    model.train()
    return model


def norm2(t):
    """Squared L2 norm summed in float64: torch 1.13's float32 CPU norm of a large tensor is off by ~1e-4
    relative (word embeddings of BERT), while apex's multi-tensor norm sums blocks in a tree."""
    return float(torch.sum(t.double() ** 2))


class NVLAMB:
    """apex FusedLAMB(adam_w_mode=True, bias_correction=True, grad_averaging=True, use_nvlamb=False)."""

    def __init__(self, named_params, weight_decay, max_grad_norm, betas=(0.9, 0.999), eps=1e-6):
        self.params = [(p, 0.0 if any(n in name for n in NO_DECAY) else weight_decay) for name, p in named_params]
        self.max_grad_norm, self.betas, self.eps, self.t = max_grad_norm, betas, eps, 0
        self.m = [torch.zeros_like(p) for p, _ in self.params]
        self.v = [torch.zeros_like(p) for p, _ in self.params]

    def grad_norm(self):
        return math.sqrt(sum(norm2(p.grad) for p, _ in self.params))

    @torch.no_grad()
    def step(self, lr):
        gn = self.grad_norm()
        clip = gn / self.max_grad_norm if gn > self.max_grad_norm else 1.0
        self.t += 1
        b1, b2 = self.betas
        bc1, bc2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for (p, wd), m, v in zip(self.params, self.m, self.v):
            g = p.grad / clip
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            update = (m / bc1) / ((v / bc2).sqrt() + self.eps)
            ratio = 1.0
            if wd != 0:
                update.add_(p, alpha=wd)
                pn, un = math.sqrt(norm2(p)), math.sqrt(norm2(update))
                if pn > 0 and un > 0:
                    ratio = pn / un
            p.add_(update, alpha=-lr * ratio)
        return gn


def use_device(name):
    """torch.device(name); on a GPU fp32 stays fp32 (no TF32 matrix products)."""
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            fail(f"--device={name}: torch sees no GPU")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return dev


def poly_warmup_lr(base, step, total, warmup, power):
    p = step / total
    return base * p / warmup if p < warmup else base * max(1.0 - p, 0.0) ** power


def micro_loss(model, b):
    dev = next(model.parameters()).device
    b = {k: v.to(dev) for k, v in b.items()}
    out = model.bert(input_ids=b["input_ids"].long(), token_type_ids=b["token_type_ids"].long(),
                     attention_mask=b["attention_mask"].long())
    seq, pooled = out[0], out[1]
    pos, lab = b["masked_lm_positions"].long(), b["masked_lm_labels"].long()
    keep = lab != -1
    rows = torch.arange(pos.shape[0], device=pos.device).unsqueeze(1).expand_as(pos)[keep]
    scores = model.cls.predictions(seq[rows, pos[keep]])  # the head on the masked positions only
    mlm = F.cross_entropy(scores.float(), lab[keep]) if keep.any() else scores.sum() * 0
    nsp = F.cross_entropy(model.cls.seq_relationship(pooled).float(), b["next_sentence_labels"].long())
    return mlm, nsp


def run_phase(model, phase, a, log):
    files = sorted(glob.glob(os.path.join(a.batches, f"phase{phase}", "*.safetensors")))
    steps, lr, warmup = getattr(a, f"steps{phase}"), getattr(a, f"lr{phase}"), getattr(a, f"warmup{phase}")
    total = getattr(a, f"total{phase}") or steps
    by_step = {}
    for f in files:
        s, j = os.path.basename(f).split(".")[0].split("_")
        by_step.setdefault(int(s), []).append((int(j), f))
    if any(s not in by_step for s in range(1, steps + 1)):
        fail(f"{a.batches}/phase{phase}: batches for steps 1..{steps} expected, found {len(by_step)} steps")
    opt = NVLAMB([(n, p) for n, p in model.named_parameters()], a.weight_decay, a.max_grad_norm)
    first = 1
    if a.state and a.state["phase"] == phase:
        restore(model, opt, a.state)
        first = a.state["step"] + 1
    for step in range(first, steps + 1):
        if a.max_steps and a.done >= a.max_steps:
            return False
        micro = [f for _, f in sorted(by_step[step])]
        for p in model.parameters():
            p.grad = None
        tot = mlm_tot = nsp_tot = 0.0
        for f in micro:
            mlm, nsp = micro_loss(model, st_load(f))
            ((mlm + nsp) / len(micro)).backward()
            tot, mlm_tot, nsp_tot = tot + (mlm + nsp).item(), mlm_tot + mlm.item(), nsp_tot + nsp.item()
        k = len(micro)
        rate = poly_warmup_lr(lr, step, total, warmup, a.power)
        gn = opt.step(rate)
        log.write(json.dumps({"phase": phase, "step": step, "loss": tot / k, "mlm_loss": mlm_tot / k,
                              "nsp_loss": nsp_tot / k, "grad_norm": gn, "lr": rate}) + "\n")
        log.flush()
        if a.save_every and step % a.save_every == 0 and step < steps:
            save(model, os.path.join(a.output, f"phase{phase}", f"step_{step:06d}"), a.init)
        a.done += 1
        if a.checkpoint_every and (step % a.checkpoint_every == 0 or step == steps):
            checkpoint(model, opt, phase, step, a.output)
    save(model, os.path.join(a.output, f"phase{phase}"), a.init)
    return True


def checkpoint(model, opt, phase, step, out):
    """OUT/resume.pt, atomically: what the next step needs to be the uninterrupted run's (the log's length too)."""
    with open(os.path.join(out, "log.jsonl"), "rb") as f:
        lines = f.read().count(b"\n")
    state = {"phase": phase, "step": step, "log_lines": lines, "t": opt.t, "rng": torch.get_rng_state(),
             "model": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
             "m": [x.cpu() for x in opt.m], "v": [x.cpu() for x in opt.v]}
    torch.save(state, os.path.join(out, "resume.pt.tmp"))
    os.replace(os.path.join(out, "resume.pt.tmp"), os.path.join(out, "resume.pt"))


def restore(model, opt, state):
    dev = next(model.parameters()).device
    model.load_state_dict({k: v.to(dev) for k, v in state["model"].items()})
    model.tie_weights()
    opt.t = state["t"]
    for dst, src in zip(opt.m + opt.v, state["m"] + state["v"]):
        dst.copy_(src)
    torch.set_rng_state(state["rng"])


def load_checkpoint(a):
    """The state --resume continues from (None: start afresh), its log cut to the steps it covers."""
    path = os.path.join(a.output, "resume.pt")
    if not a.resume or not os.path.isfile(path):
        return None
    try:
        state = torch.load(path, weights_only=False)
    except TypeError:  # torch before 1.13's weights_only
        state = torch.load(path)
    except Exception as e:  # noqa: BLE001
        fail(f"{path}: not a checkpoint of this script ({e}); remove it to start afresh")
    log = os.path.join(a.output, "log.jsonl")
    with open(log, "rb") as f:
        lines = f.read().split(b"\n")
    if len(lines) - 1 < state["log_lines"]:
        fail(f"{log}: shorter than {path} says ({state['log_lines']} lines); remove both to start afresh")
    with open(log + ".tmp", "wb") as f:
        f.write(b"".join(x + b"\n" for x in lines[:state["log_lines"]]))
    os.replace(log + ".tmp", log)
    print(f"resumed from {path}: phase {state['phase']} step {state['step']}", flush=True)
    return state


def save(model, out, init):
    """out/model.safetensors (HF names, the tied decoder left out as bertlua writes it) and init's config.json."""
    os.makedirs(out, exist_ok=True)
    sd = {k: v for k, v in model.state_dict().items()
          if k not in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
          and not k.endswith("position_ids")}
    st_save(os.path.join(out, "model.safetensors.tmp"), sd)
    os.replace(os.path.join(out, "model.safetensors.tmp"), os.path.join(out, "model.safetensors"))
    shutil.copyfile(os.path.join(init, "config.json"), os.path.join(out, "config.json"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--init", required=True)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--output", required=True)
    for p, lr, w in ((1, 6e-3, 0.2843), (2, 4e-3, 0.128)):
        ap.add_argument(f"--steps{p}", type=int, default=0, help=f"phase {p} optimizer steps (0: skip the phase)")
        ap.add_argument(f"--total{p}", type=int, default=0, help="schedule length (0: --steps)")
        ap.add_argument(f"--lr{p}", type=float, default=lr)
        ap.add_argument(f"--warmup{p}", type=float, default=w)
    ap.add_argument("--dropout", type=float, default=None, help="hidden and attention dropout (default: config)")
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--power", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N] (fp32: TF32 off)")
    ap.add_argument("--seed", type=int, default=12439, help="dropout stream")
    ap.add_argument("--checkpoint-every", type=int, default=0,
                    help="write OUT/resume.pt every N steps and at each phase end (0: never)")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/resume.pt when there is one")
    ap.add_argument("--max-steps", type=int, default=0,
                    help="stop after N optimizer steps of this invocation (with --checkpoint-every, to --resume)")
    ap.add_argument("--save-every", type=int, default=0,
                    help="also save the weights every N steps of a phase to OUT/phaseP/step_NNNNNN/ "
                    "(0: only at the end)")
    a = ap.parse_args()
    if a.max_steps and not a.checkpoint_every:
        fail("--max-steps needs --checkpoint-every (a run stopped without a checkpoint could not be resumed)")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    for f in ("config.json", "model.safetensors"):
        if not os.path.isfile(os.path.join(a.init, f)):
            fail(f"--init={a.init}: no {f} (a directory written by bertlua's pretrained.save_pretrained)")
    model = load_model(a.init, a.dropout).to(use_device(a.device))
    os.makedirs(a.output, exist_ok=True)
    a.state, a.done = load_checkpoint(a), 0
    start = a.state["phase"] if a.state else 1
    with open(os.path.join(a.output, "log.jsonl"), "a" if a.state else "w") as log:
        for phase in (1, 2):
            if phase >= start and getattr(a, f"steps{phase}") > 0 and not run_phase(model, phase, a, log):
                print(f"stopped by --max-steps after {a.done} steps", flush=True)
                return


if __name__ == "__main__":
    main()
