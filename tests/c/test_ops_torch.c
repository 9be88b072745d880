/* The op library against PyTorch: runs every op's forward and backward on
 * random inputs (B=3, S=7, H=10, 2 heads), writes inputs and outputs to a
 * temporary file and lets tests/py/ops_reference.py recompute them with
 * torch in float64 (autograd for the backward). Skips (77) when the
 * reference Python ($BL_PYTHON, default /usr/bin/python3) has no torch. */
#include "bertlua.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static FILE *out;
#include "check.h"

static uint64_t st = 0x9E3779B97F4A7C15ULL;
static float nz(void) {
  st ^= st >> 12;
  st ^= st << 25;
  st ^= st >> 27;
  double u = (double)((st * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
  return (float)(u < 0.5 ? -(0.1 + 2 * u) : (0.1 + 2 * (u - 0.5)));
}
static bl_tensor *T(int nd, int64_t a, int64_t b, int64_t c, int64_t d, int dtype) {
  int64_t s[] = { a, b, c, d };
  bl_tensor *t = NULL;
  if (bl_tensor_empty(nd, s, dtype, -1, &t)) {
    printf("alloc: %s\n", bl_last_error());
    exit(1);
  }
  return t;
}
static bl_tensor *R(int nd, int64_t a, int64_t b, int64_t c, int64_t d) {
  bl_tensor *t = T(nd, a, b, c, d, BL_F32);
  for (int64_t i = 0; i < t->numel; i++) ((float *)t->data)[i] = nz();
  return t;
}
static bl_tensor *Z(const bl_tensor *like) {
  bl_tensor *t = NULL;
  if (bl_tensor_empty(like->ndim, like->shape, BL_F32, -1, &t)) exit(1);
  memset(t->data, 0, (size_t)t->numel * 4);
  return t;
}
/* writes the record and frees the tensor (every tensor here is written once, last use) */
static void put(const char *cas, const char *name, bl_tensor *t) {
  char full[128];
  snprintf(full, sizeof full, "%s.%s", cas, name);
  uint32_t n = (uint32_t)strlen(full), nd = (uint32_t)t->ndim;
  fwrite(&n, 4, 1, out);
  fwrite(full, 1, n, out);
  fwrite(&nd, 4, 1, out);
  fwrite(t->shape, 8, nd, out);
  bl_tensor *f = NULL;
  if (bl_tensor_empty(t->ndim, t->shape, BL_F32, -1, &f) || bl_tensor_copy(f, t)) {
    printf("copy: %s\n", bl_last_error());
    exit(1);
  }
  fwrite(f->data, 4, (size_t)f->numel, out);
  bl_tensor_free(f);
  bl_tensor_free(t);
}

int main(void) {
  const char *py = getenv("BL_PYTHON") ? getenv("BL_PYTHON") : "/usr/bin/python3";
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s -c 'import torch' >/dev/null 2>&1", py);
  if (system(cmd) != 0) {
    printf("skipped: %s cannot import torch\n", py);
    return 77;
  }
  char path[] = "/tmp/bl_ops_torch_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0 || !(out = fdopen(fd, "wb"))) {
    printf("cannot create a temp file\n");
    return 1;
  }
  const int B = 3, S = 7, H = 10, NH = 2, O = 6;

  { /* linear */
    bl_tensor *x = R(3, B, S, H, 0), *w = R(2, O, H, 0, 0), *b = R(1, O, 0, 0, 0), *y = T(3, B, S, O, 0, BL_F32);
    bl_tensor *dy = R(3, B, S, O, 0), *dx = Z(x), *dw = Z(w), *db = Z(b);
    OK(bl_linear_forward(y, x, w, b));
    OK(bl_linear_backward(dx, dw, db, dy, x, w, 0));
    put("linear", "x", x);
    put("linear", "w", w);
    put("linear", "b", b);
    put("linear", "y", y);
    put("linear", "dy", dy);
    put("linear", "dx", dx);
    put("linear", "dw", dw);
    put("linear", "db", db);
  }
  { /* layernorm, and the fused residual version with p = 0 */
    for (int fused = 0; fused < 2; fused++) {
      const char *c = fused ? "residual_layernorm" : "layernorm";
      bl_tensor *x = R(3, B, S, H, 0), *r = R(3, B, S, H, 0), *g = R(1, H, 0, 0, 0), *b = R(1, H, 0, 0, 0);
      bl_tensor *y = Z(x), *m = T(1, B * S, 0, 0, 0, BL_F32), *rs = T(1, B * S, 0, 0, 0, BL_F32),
                *dy = R(3, B, S, H, 0);
      bl_tensor *dx = Z(x), *dr = Z(x), *dg = Z(g), *db = Z(b);
      if (fused) {
        OK(bl_residual_layernorm_forward(&(bl_residual_layernorm_args){
            .x = x, .residual = r, .gamma = g, .beta = b, .y = y, .mean = m, .rstd = rs, .eps = 1e-12 }));
        OK(bl_residual_layernorm_backward(
            dx, dr, dg, db, NULL, dy,
            &(bl_residual_layernorm_args){ .x = x, .residual = r, .gamma = g, .mean = m, .rstd = rs }));
      } else {
        OK(bl_layernorm_forward(y, m, rs, x, g, b, 1e-12));
        OK(bl_layernorm_backward(dx, dg, db, dy, x, g, m, rs));
      }
      put(c, "x", x);
      put(c, "g", g);
      put(c, "b", b);
      put(c, "y", y);
      put(c, "dy", dy);
      put(c, "dx", dx);
      put(c, "dg", dg);
      put(c, "db", db);
      if (fused) {
        put(c, "r", r);
        put(c, "dr", dr);
      } else {
        bl_tensor_free(r);
        bl_tensor_free(dr);
      }
      bl_tensor_free(m);
      bl_tensor_free(rs);
    }
  }
  { /* gelu, bias_gelu, tanh on inputs spread over [-4, 4] */
    bl_tensor *x = R(3, B, S, H, 0), *b = R(1, H, 0, 0, 0), *dy = R(3, B, S, H, 0);
    for (int64_t i = 0; i < x->numel; i++) ((float *)x->data)[i] *= 2.0f;
    bl_tensor *y = Z(x), *dx = Z(x), *y2 = Z(x), *dx2 = Z(x), *db = Z(b), *y3 = Z(x), *dx3 = Z(x);
    OK(bl_gelu_forward(y, x));
    OK(bl_gelu_backward(dx, dy, x));
    OK(bl_bias_gelu_forward(y2, x, b));
    OK(bl_bias_gelu_backward(dx2, db, dy, x, b));
    OK(bl_tanh_forward(y3, x));
    OK(bl_tanh_backward(dx3, dy, y3));
    bl_tensor *xc = Z(x), *xc2 = Z(x), *dyc = Z(x), *dyc2 = Z(x);
    OK(bl_tensor_copy(xc, x));
    OK(bl_tensor_copy(xc2, x));
    OK(bl_tensor_copy(dyc, dy));
    OK(bl_tensor_copy(dyc2, dy));
    put("gelu", "x", x);
    put("gelu", "y", y);
    put("gelu", "dy", dy);
    put("gelu", "dx", dx);
    put("bias_gelu", "x", xc);
    put("bias_gelu", "b", b);
    put("bias_gelu", "y", y2);
    put("bias_gelu", "dy", dyc);
    put("bias_gelu", "dx", dx2);
    put("bias_gelu", "db", db);
    put("tanh", "x", xc2);
    put("tanh", "y", y3);
    put("tanh", "dy", dyc2);
    put("tanh", "dx", dx3);
  }
  { /* softmax over [B, heads, S, S] scores with BERT's extended mask [B,1,1,S] */
    bl_tensor *x = R(4, B, NH, S, S), *m = T(4, B, 1, 1, S, BL_F32), *dy = R(4, B, NH, S, S);
    for (int i = 0; i < B * S; i++) ((float *)m->data)[i] = (i % S) >= S - 1 - i / S ? -10000.0f : 0.0f;
    for (int64_t i = 0; i < x->numel; i++) ((float *)x->data)[i] *= 3.0f;
    bl_tensor *y = Z(x), *dx = Z(x);
    OK(bl_softmax_forward(y, x, m));
    OK(bl_softmax_backward(dx, dy, y));
    put("softmax", "x", x);
    put("softmax", "m", m);
    put("softmax", "y", y);
    put("softmax", "dy", dy);
    put("softmax", "dx", dx);
  }
  { /* attention, no dropout (the torch side is HF's BertSelfAttention math) */
    bl_tensor *q = R(3, B, S, H, 0), *k = R(3, B, S, H, 0), *v = R(3, B, S, H, 0), *mask = T(2, B, S, 0, 0, BL_F32);
    for (int i = 0; i < B * S; i++) ((float *)mask->data)[i] = (i % S) < S - i / S ? 1.0f : 0.0f;
    for (int64_t i = 0; i < q->numel; i++) {
      ((float *)q->data)[i] *= 2;
      ((float *)k->data)[i] *= 2;
    }
    bl_tensor *ctx = Z(q), *probs = T(4, B, NH, S, S, BL_F32), *dctx = R(3, B, S, H, 0), *dq = Z(q), *dk = Z(q),
              *dv = Z(q);
    OK(bl_attention_forward(
        &(bl_attention_args){ .q = q, .k = k, .v = v, .key_mask = mask, .ctx = ctx, .saved = probs, .heads = NH }));
    OK(bl_attention_backward(dq, dk, dv, dctx,
                             &(bl_attention_args){ .q = q, .k = k, .v = v, .saved = probs, .heads = NH }));
    bl_tensor *heads = T(1, 1, 0, 0, 0, BL_F32);
    ((float *)heads->data)[0] = NH;
    put("attention", "heads", heads);
    put("attention", "q", q);
    put("attention", "k", k);
    put("attention", "v", v);
    put("attention", "mask", mask);
    put("attention", "ctx", ctx);
    put("attention", "dy", dctx);
    put("attention", "dq", dq);
    put("attention", "dk", dk);
    put("attention", "dv", dv);
    bl_tensor_free(probs);
  }
  { /* cross-entropy with ignored targets (-100), MLM-sized vocab slice */
    bl_tensor *logits = R(2, B * S, 37, 0, 0), *tg = T(1, B * S, 0, 0, 0, BL_I64), *loss = T(1, 1, 0, 0, 0, BL_F32);
    for (int64_t i = 0; i < logits->numel; i++) ((float *)logits->data)[i] *= 4.0f;
    for (int i = 0; i < B * S; i++) ((int64_t *)tg->data)[i] = i % 4 == 1 ? -100 : (i * 13) % 37;
    bl_tensor *dl = Z(logits);
    OK(bl_cross_entropy(loss, dl, logits, tg, -100, 1.0, NULL));
    put("ce", "logits", logits);
    put("ce", "targets", tg);
    put("ce", "loss", loss);
    put("ce", "dlogits", dl);
  }
  { /* MSE (STS-B) */
    bl_tensor *pred = R(2, 9, 1, 0, 0), *tg = R(1, 9, 0, 0, 0), *loss = T(1, 1, 0, 0, 0, BL_F32), *dp = Z(pred);
    OK(bl_mse_loss(loss, dp, pred, tg, 1.0));
    put("mse", "pred", pred);
    put("mse", "target", tg);
    put("mse", "loss", loss);
    put("mse", "dpred", dp);
  }
  { /* embedding with repeated ids */
    bl_tensor *table = R(2, 13, H, 0, 0), *ids = T(2, B, S, 0, 0, BL_I32), *y = T(3, B, S, H, 0, BL_F32),
              *dy = R(3, B, S, H, 0);
    for (int i = 0; i < B * S; i++) ((int32_t *)ids->data)[i] = (i * 5) % 13 % 9;
    bl_tensor *dt = Z(table);
    OK(bl_embedding_forward(y, table, ids, 0));
    OK(bl_embedding_backward(dt, dy, ids));
    put("embedding", "table", table);
    put("embedding", "ids", ids);
    put("embedding", "y", y);
    put("embedding", "dy", dy);
    put("embedding", "dtable", dt);
  }
  fclose(out);
  if (failures) {
    unlink(path);
    printf("%d op call(s) failed\n", failures);
    return 1;
  }
  snprintf(cmd, sizeof cmd, "%s tests/py/ops_reference.py %s", py, path);
  int rc = system(cmd);
  unlink(path);
  if (rc == -1 || !WIFEXITED(rc)) {
    printf("could not run %s\n", cmd);
    return 1;
  }
  rc = WEXITSTATUS(rc);
  return rc == 0 ? 0 : rc == 77 ? 77 : 1;
}
