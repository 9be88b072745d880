/* Elementwise arithmetic with broadcasting. f32 operands take a typed fast
 * path (OpenMP over chunks when contiguous); other dtypes compute in double. */
#include <stdlib.h>
#include "../base/internal.h"
#include "../device/dispatch.h"
#include "../base/rules/elementwise.h"
#include "../base/vecmath.h"

/* The unit-stride f32 loops below are compiled for AVX-512 / AVX2 / baseline
 * x86-64 and picked at first use (OPX_ISA_FN, capped by BL_CPU_ISA), like
 * the CPU ops' kernels (src/base/vecmath.h). FMA contraction is switched off
 * for them, so a*alpha + beta rounds twice exactly as on the baseline path:
 * every variant gives bitwise the same results. */

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif
/* o = a (op) b for unit-stride a and o; b unit-stride (bs = 1) or one value (bs = 0).
 * EW_BLOCK floats are loaded (into t, which stays in registers) before any
 * of them is stored: when o sits a few cache lines after a or b modulo
 * 4 KB, a store followed at once by the load of the same low address bits
 * waits on a false dependency (4K aliasing); AVX-512 add and mul lost 15-25 %
 * to it at output offsets of 64-128 bytes, with blocks they do not. */
#define EW_BLOCK 64
#define EW_LOOP(expr)                                                               \
  do {                                                                              \
    int64_t i_ = 0;                                                                 \
    for (; i_ + EW_BLOCK <= n; i_ += EW_BLOCK) {                                    \
      float t[EW_BLOCK];                                                            \
      _Pragma("GCC unroll 64") for (int j = 0; j < EW_BLOCK; j++) {                 \
        int64_t i = i_ + j;                                                         \
        t[j] = expr;                                                                \
      }                                                                             \
      _Pragma("GCC unroll 64") for (int j = 0; j < EW_BLOCK; j++) o[i_ + j] = t[j]; \
    }                                                                               \
    for (int64_t i = i_; i < n; i++) o[i] = expr;                                   \
  } while (0)
OPX_BODY f32_binary_flat_body(int op, int64_t n, float *o, const float *a, const float *b, int bs) {
  if (bs) {
    switch (op) {
      case BL_ADD: EW_LOOP(a[i] + b[i]); return;
      case BL_SUB: EW_LOOP(a[i] - b[i]); return;
      case BL_MUL: EW_LOOP(a[i] * b[i]); return;
      case BL_DIV: EW_LOOP(a[i] / b[i]); return;
    }
  } else {
    const float bv = b[0];
    switch (op) {
      case BL_ADD: EW_LOOP(a[i] + bv); return;
      case BL_SUB: EW_LOOP(a[i] - bv); return;
      case BL_MUL: EW_LOOP(a[i] * bv); return;
      case BL_DIV: EW_LOOP(a[i] / bv); return;
    }
  }
}
OPX_ISA_FN(f32_binary_flat, (int op, int64_t n, float *o, const float *a, const float *b, int bs), (op, n, o, a, b, bs))

/* o = a * alpha + beta for unit-stride a and o (two roundings: no FMA here). */
OPX_BODY f32_affine_flat_body(int64_t n, float *o, const float *a, float al, float be) { EW_LOOP(a[i] * al + be); }
OPX_ISA_FN(f32_affine_flat, (int64_t n, float *o, const float *a, float al, float be), (n, o, a, al, be))
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

int bl_broadcast_shape(int na, const int64_t *sa, int nb, const int64_t *sb, int *nout, int64_t *sout) {
  int n = na > nb ? na : nb;
  for (int i = 0; i < n; i++) {
    int64_t x = i < n - na ? 1 : sa[i - (n - na)];
    int64_t y = i < n - nb ? 1 : sb[i - (n - nb)];
    if (x != y && x != 1 && y != 1) {
      char a[128], b[128];
      return bl_set_error(BL_EINVAL, "broadcast: shapes %s and %s are not compatible",
                          bl_shape_str(na, sa, a, sizeof a), bl_shape_str(nb, sb, b, sizeof b));
    }
    sout[i] = x == 1 ? y : x;
  }
  *nout = n;
  return 0;
}

typedef struct {
  int op;
  int dt[3];
  double s;
  int scalar_first;
} ew_ctx;

static void binary_inner(int64_t n, char **p, const int64_t *s, void *vctx) {
  const ew_ctx *c = vctx;
  if (c->dt[0] == BL_F32 && c->dt[1] == BL_F32 && c->dt[2] == BL_F32 && c->op <= BL_DIV) {
    float *o = (float *)p[0];
    const float *a = (const float *)p[1], *b = (const float *)p[2];
    int64_t so = s[0] / 4, sa = s[1] / 4, sb = s[2] / 4;
    if (so == 1 && sa == 1 && (sb == 1 || sb == 0)) { /* unit-stride rows: the common case */
      f32_binary_flat(c->op, n, o, a, b, (int)sb);
      return;
    }
    switch (c->op) {
      case BL_ADD:
        for (int64_t i = 0; i < n; i++) o[i * so] = a[i * sa] + b[i * sb];
        return;
      case BL_SUB:
        for (int64_t i = 0; i < n; i++) o[i * so] = a[i * sa] - b[i * sb];
        return;
      case BL_MUL:
        for (int64_t i = 0; i < n; i++) o[i * so] = a[i * sa] * b[i * sb];
        return;
      case BL_DIV:
        for (int64_t i = 0; i < n; i++) o[i * so] = a[i * sa] / b[i * sb];
        return;
    }
  }
  for (int64_t i = 0; i < n; i++)
    bl_store(c->dt[0], p[0] + i * s[0],
             bl_binop_eval(c->op, bl_load(c->dt[1], p[1] + i * s[1]), bl_load(c->dt[2], p[2] + i * s[2])));
}

static void unary_inner(int64_t n, char **p, const int64_t *s, void *vctx) {
  const ew_ctx *c = vctx;
  if (c->dt[0] == BL_F32 && c->dt[1] == BL_F32) {
    float *o = (float *)p[0];
    const float *a = (const float *)p[1];
    int64_t so = s[0] / 4, sa = s[1] / 4;
    switch (c->op) {
      case BL_NEG:
        for (int64_t i = 0; i < n; i++) o[i * so] = -a[i * sa];
        return;
      case BL_EXP:
        for (int64_t i = 0; i < n; i++) o[i * so] = expf(a[i * sa]);
        return;
      case BL_TANH:
        for (int64_t i = 0; i < n; i++) o[i * so] = tanhf(a[i * sa]);
        return;
      case BL_SQRT:
        for (int64_t i = 0; i < n; i++) o[i * so] = sqrtf(a[i * sa]);
        return;
      default: break;
    }
  }
  for (int64_t i = 0; i < n; i++)
    bl_store(c->dt[0], p[0] + i * s[0], bl_unop_eval(c->op, bl_load(c->dt[1], p[1] + i * s[1])));
}

static void scalar_inner(int64_t n, char **p, const int64_t *s, void *vctx) {
  const ew_ctx *c = vctx;
  for (int64_t i = 0; i < n; i++) {
    double x = bl_load(c->dt[1], p[1] + i * s[1]);
    bl_store(c->dt[0], p[0] + i * s[0],
             c->scalar_first ? bl_binop_eval(c->op, c->s, x) : bl_binop_eval(c->op, x, c->s));
  }
}

typedef struct {
  double alpha, beta;
  int dt[2];
} affine_ctx;
static void affine_inner(int64_t n, char **p, const int64_t *s, void *vctx) {
  const affine_ctx *c = vctx;
  if (c->dt[0] == BL_F32 && c->dt[1] == BL_F32) {
    float *o = (float *)p[0];
    const float *a = (const float *)p[1];
    int64_t so = s[0] / 4, sa = s[1] / 4;
    float al = (float)c->alpha, be = (float)c->beta;
    if (so == 1 && sa == 1) { /* unit stride: vectorisable, same operations */
      f32_affine_flat(n, o, a, al, be);
      return;
    }
    for (int64_t i = 0; i < n; i++) o[i * so] = a[i * sa] * al + be;
    return;
  }
  for (int64_t i = 0; i < n; i++)
    bl_store(c->dt[0], p[0] + i * s[0], bl_load(c->dt[1], p[1] + i * s[1]) * c->alpha + c->beta);
}

/* Runs fn over out and its inputs (broadcast to out's shape). For large
 * contiguous same-shape operands the work is split across OpenMP threads. */
static void run(int nin, bl_tensor *out, const bl_tensor **in, bl_inner_fn fn, void *ctx) {
  int64_t st[4][BL_MAX_DIMS];
  char *base[4];
  for (int i = 0; i < out->ndim; i++) st[0][i] = out->stride[i] * bl_dtype_size(out->dtype);
  base[0] = out->data;
  int flat = bl_tensor_is_contiguous(out);
  for (int k = 0; k < nin; k++) {
    bl_broadcast_strides_bytes(in[k], out->ndim, out->shape, st[k + 1]);
    base[k + 1] = in[k]->data;
    if (!(bl_tensor_is_contiguous(in[k]) && in[k]->numel == out->numel)) flat = 0;
  }
  if (flat && out->numel >= (1 << 16)) {
    int64_t n = out->numel, chunk = 1 << 14;
    int64_t nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunks; c++) {
      char *p[4];
      int64_t s[4];
      int64_t start = c * chunk, len = n - start < chunk ? n - start : chunk;
      p[0] = base[0] + start * bl_dtype_size(out->dtype);
      s[0] = bl_dtype_size(out->dtype);
      for (int k = 0; k < nin; k++) {
        s[k + 1] = bl_dtype_size(in[k]->dtype);
        p[k + 1] = base[k + 1] + start * s[k + 1];
      }
      fn(len, p, s, ctx);
    }
    return;
  }
  bl_foreach(nin + 1, base, st, out->ndim, out->shape, fn, ctx);
}

static int check_common(const char *op, bl_tensor *out, const bl_tensor *a) {
  BL_CHECK(bl_tensor_check(out, op));
  BL_CHECK(bl_tensor_check(a, op));
  BL_CHECK(bl_check_same_device(out, a, op));
  return 0;
}

int bl_binary(int op, bl_tensor *out, const bl_tensor *a, const bl_tensor *b) {
  if (op < 0 || op >= BL_NUM_BINOPS) return bl_set_error(BL_EINVAL, "binary: unknown operation %d", op);
  const char *name = bl_binop_names[op];
  BL_CHECK(check_common(name, out, a));
  BL_CHECK(bl_tensor_check(b, name));
  BL_CHECK(bl_check_same_device(a, b, name));
  int n;
  int64_t shape[BL_MAX_DIMS];
  if (bl_broadcast_shape(a->ndim, a->shape, b->ndim, b->shape, &n, shape)) {
    char sa[128], sb[128];
    return bl_set_error(BL_EINVAL, "%s: shapes %s and %s are not compatible", name, BL_SHAPE(a, sa), BL_SHAPE(b, sb));
  }
  BL_CHECK(bl_check_out_shape(name, out, n, shape));
  if (out->device >= 0) return BL_ON_CUDA(name, out->device, bl_cuda_binary(op, out, a, b));
  ew_ctx c = { op, { out->dtype, a->dtype, b->dtype }, 0, 0 };
  const bl_tensor *in[2] = { a, b };
  run(2, out, in, binary_inner, &c);
  return 0;
}

int bl_binary_scalar(int op, bl_tensor *out, const bl_tensor *a, double s, int scalar_first) {
  if (op < 0 || op >= BL_NUM_BINOPS) return bl_set_error(BL_EINVAL, "binary: unknown operation %d", op);
  const char *name = bl_binop_names[op];
  BL_CHECK(check_common(name, out, a));
  BL_CHECK(bl_check_out_shape(name, out, a->ndim, a->shape));
  if (out->device >= 0) return BL_ON_CUDA(name, out->device, bl_cuda_binary_scalar(op, out, a, s, scalar_first));
  /* x+s, x-s and x*s are exact as alpha*x+beta; division is not (1/s rounds), so it takes the generic path. */
  if (!scalar_first && (op == BL_ADD || op == BL_SUB || op == BL_MUL))
    return bl_affine(out, a, op == BL_MUL ? s : 1.0, op == BL_ADD ? s : op == BL_SUB ? -s : 0.0);
  ew_ctx c = { op, { out->dtype, a->dtype, 0 }, s, scalar_first };
  const bl_tensor *in[1] = { a };
  run(1, out, in, scalar_inner, &c);
  return 0;
}

int bl_unary(int op, bl_tensor *out, const bl_tensor *a) {
  if (op < 0 || op >= BL_NUM_UNOPS) return bl_set_error(BL_EINVAL, "unary: unknown operation %d", op);
  const char *name = bl_unop_names[op];
  BL_CHECK(check_common(name, out, a));
  BL_CHECK(bl_check_out_shape(name, out, a->ndim, a->shape));
  if (out->device >= 0) return BL_ON_CUDA(name, out->device, bl_cuda_unary(op, out, a));
  ew_ctx c = { op, { out->dtype, a->dtype, 0 }, 0, 0 };
  const bl_tensor *in[1] = { a };
  run(1, out, in, unary_inner, &c);
  return 0;
}

int bl_affine(bl_tensor *out, const bl_tensor *a, double alpha, double beta) {
  BL_CHECK(check_common("affine", out, a));
  BL_CHECK(bl_check_out_shape("affine", out, a->ndim, a->shape));
  if (out->device >= 0) return BL_ON_CUDA("affine", out->device, bl_cuda_affine(out, a, alpha, beta));
  affine_ctx c = { alpha, beta, { out->dtype, a->dtype } };
  const bl_tensor *in[1] = { a };
  run(1, out, in, affine_inner, &c);
  return 0;
}

static void where_inner(int64_t n, char **p, const int64_t *s, void *vctx) {
  const int *dt = vctx;
  for (int64_t i = 0; i < n; i++) {
    int take_a = bl_load(dt[1], p[1] + i * s[1]) != 0;
    double v = take_a ? bl_load(dt[2], p[2] + i * s[2]) : bl_load(dt[3], p[3] + i * s[3]);
    bl_store(dt[0], p[0] + i * s[0], v);
  }
}

int bl_where(bl_tensor *out, const bl_tensor *cond, const bl_tensor *a, const bl_tensor *b) {
  BL_CHECK(check_common("where", out, a));
  BL_CHECK(bl_tensor_check(cond, "where"));
  BL_CHECK(bl_tensor_check(b, "where"));
  BL_CHECK(bl_check_same_device(a, b, "where"));
  BL_CHECK(bl_check_same_device(a, cond, "where"));
  int n1, n2;
  int64_t s1[BL_MAX_DIMS], s2[BL_MAX_DIMS];
  BL_CHECK(bl_broadcast_shape(a->ndim, a->shape, b->ndim, b->shape, &n1, s1));
  BL_CHECK(bl_broadcast_shape(n1, s1, cond->ndim, cond->shape, &n2, s2));
  BL_CHECK(bl_check_out_shape("where", out, n2, s2));
  if (out->device >= 0) return BL_ON_CUDA("where", out->device, bl_cuda_where(out, cond, a, b));
  int dt[4] = { out->dtype, cond->dtype, a->dtype, b->dtype };
  const bl_tensor *in[3] = { cond, a, b };
  run(3, out, in, where_inner, dt);
  return 0;
}
