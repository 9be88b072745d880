// Tensor core, device side: strided copy with broadcast and dtype conversion,
// fill, elementwise binary/unary/scalar/affine/where with broadcasting,
// reductions over any set of dims, Philox uniform/normal fills, and the f32
// operand plumbing of common.cuh (cu_load/cu_out/cu_store, index loading,
// deterministic column sums). Mirrors src/tensor/{copy,elementwise,reduce,random}.c:
// the generic path computes in double, like the CPU's generic path.
//
// Layout handling: an operand is a `desc` (data, dtype, shape, strides in
// elements; broadcast dims have stride 0). Before a launch the dims of all
// operands are coalesced (adjacent dims merged when every operand is
// contiguous across them, size-1 dims dropped) so most launches index with
// 1-2 dims. Grid: one thread per output element (grid-stride loop, 256 threads).
#include "common.cuh"
#include "philox.cuh"
#include "../src/base/rules/elementwise.h"
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <atomic>

namespace {

struct desc {
  char *data;
  int dtype;
  int ndim;
  int64_t shape[BL_MAX_DIMS];
  int64_t stride[BL_MAX_DIMS];
};

const char *const redop_names[BL_NUM_REDOPS] = { "sum", "mean", "max", "min", "argmax", "argmin", "prod" };

__device__ __forceinline__ double ld(int dtype, const char *p) {
  switch (dtype) {
    case BL_F32: return *(const float *)p;
    case BL_F64: return *(const double *)p;
    case BL_F16: return __half2float(__ushort_as_half(*(const unsigned short *)p));
    case BL_BF16: return __bfloat162float(__ushort_as_bfloat16(*(const unsigned short *)p));
    case BL_I32: return *(const int32_t *)p;
    case BL_I64: return (double)*(const int64_t *)p;
    case BL_U8: return *(const uint8_t *)p;
    default: return *(const uint8_t *)p ? 1.0 : 0.0;
  }
}

// Same conversions as bl_store (src/base/internal.h): floats round to nearest
// even through f32; out-of-range and NaN to integers are clamped, not UB.
__device__ __forceinline__ void st(int dtype, char *p, double v) {
  switch (dtype) {
    case BL_F32: *(float *)p = (float)v; break;
    case BL_F64: *(double *)p = v; break;
    case BL_F16: *(unsigned short *)p = __half_as_ushort(__float2half_rn((float)v)); break;
    case BL_BF16: *(unsigned short *)p = __bfloat16_as_ushort(__float2bfloat16_rn((float)v)); break;
    case BL_I32: *(int32_t *)p = bl_d2i32(v); break;
    case BL_I64: *(int64_t *)p = bl_d2i64(v); break;
    case BL_U8: *(uint8_t *)p = bl_d2u8(v); break;
    default: *(uint8_t *)p = v != 0; break;
  }
}

__host__ __device__ __forceinline__ int dsize(int dtype) {
  return dtype == BL_F64 || dtype == BL_I64    ? 8
         : dtype == BL_F32 || dtype == BL_I32  ? 4
         : dtype == BL_F16 || dtype == BL_BF16 ? 2
                                               : 1;
}

// Up to 4 operands sharing one (coalesced) iteration shape.
struct iter {
  int nops, ndim;
  int64_t n;
  int64_t shape[BL_MAX_DIMS];
  int64_t stride[4][BL_MAX_DIMS]; // elements
  char *data[4];
  int dtype[4];
};

// Element offsets of linear index i for all 4 operand slots. The operand loop
// has a constant trip count so off[] stays in registers (a runtime count
// would put it in local memory); unused slots have stride 0.
__device__ __forceinline__ void iter_offsets(const iter &it, int64_t i, int64_t off[4]) {
  if (it.ndim == 1) { // the usual case once coalesced (contiguous or one strided dim): no 64-bit div/mod
#pragma unroll
    for (int k = 0; k < 4; k++) off[k] = i * it.stride[k][0];
    return;
  }
#pragma unroll
  for (int k = 0; k < 4; k++) off[k] = 0;
  for (int d = it.ndim - 1; d >= 0; d--) {
    int64_t ix = i % it.shape[d];
    i /= it.shape[d];
#pragma unroll
    for (int k = 0; k < 4; k++) off[k] += ix * it.stride[k][d];
  }
}

// Build and coalesce the iteration: ops[0] is the output (defines the shape).
void make_iter(iter *it, int nops, const bl_tensor *const *ops) {
  const bl_tensor *o = ops[0];
  int nd = o->ndim;
  int64_t shape[BL_MAX_DIMS], str[4][BL_MAX_DIMS];
  memset(it, 0, sizeof *it); // strides of unused operand slots are 0 (iter_offsets reads all 4)
  for (int d = 0; d < nd; d++) shape[d] = o->shape[d];
  for (int k = 0; k < nops; k++) bl_broadcast_strides(ops[k], nd, o->shape, str[k]);
  it->nops = nops;
  it->n = o->numel;
  for (int k = 0; k < nops; k++) {
    it->data[k] = (char *)ops[k]->data;
    it->dtype[k] = ops[k]->dtype;
  }
  // drop size-1 dims, then merge d into the previous kept dim when contiguous for every operand
  int m = 0;
  for (int d = 0; d < nd; d++) {
    if (shape[d] == 1) continue;
    if (m > 0) {
      bool merge = true;
      for (int k = 0; k < nops; k++)
        if (it->stride[k][m - 1] != str[k][d] * shape[d]) {
          merge = false;
          break;
        }
      if (merge) {
        it->shape[m - 1] *= shape[d];
        for (int k = 0; k < nops; k++) it->stride[k][m - 1] = str[k][d];
        continue;
      }
    }
    it->shape[m] = shape[d];
    for (int k = 0; k < nops; k++) it->stride[k][m] = str[k][d];
    m++;
  }
  it->ndim = m;
}

enum { EW_COPY = 0, EW_FILL, EW_BINARY, EW_SCALAR, EW_UNARY, EW_AFFINE, EW_WHERE };

// One generic elementwise kernel (runtime switch, no template explosion).
// Operand 0 is the output; a..c are inputs as required by `kind`.
__global__ void ew_kernel(iter it, int kind, int op, double s, double alpha, int scalar_first) {
  int64_t off[4];
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < it.n; i += (int64_t)gridDim.x * blockDim.x) {
    iter_offsets(it, i, off);
    char *o = it.data[0] + off[0] * dsize(it.dtype[0]);
    const char *a = it.nops > 1 ? it.data[1] + off[1] * dsize(it.dtype[1]) : nullptr;
    switch (kind) {
      case EW_COPY:
        if (it.dtype[0] == it.dtype[1]) {
          switch (dsize(it.dtype[0])) { // raw copy keeps i64 exact and NaN payloads
            case 8: *(uint64_t *)o = *(const uint64_t *)a; break;
            case 4: *(uint32_t *)o = *(const uint32_t *)a; break;
            case 2: *(uint16_t *)o = *(const uint16_t *)a; break;
            default: *(uint8_t *)o = it.dtype[0] == BL_BOOL ? (*(const uint8_t *)a != 0) : *(const uint8_t *)a; break;
          }
        } else {
          st(it.dtype[0], o, ld(it.dtype[1], a));
        }
        break;
      case EW_FILL: st(it.dtype[0], o, s); break;
      case EW_BINARY: {
        const char *b = it.data[2] + off[2] * dsize(it.dtype[2]);
        st(it.dtype[0], o, bl_binop_eval(op, ld(it.dtype[1], a), ld(it.dtype[2], b)));
        break;
      }
      case EW_SCALAR: {
        double x = ld(it.dtype[1], a);
        st(it.dtype[0], o, scalar_first ? bl_binop_eval(op, s, x) : bl_binop_eval(op, x, s));
        break;
      }
      case EW_UNARY: st(it.dtype[0], o, bl_unop_eval(op, ld(it.dtype[1], a))); break;
      case EW_AFFINE: // two roundings as on the CPU: _rn intrinsics keep nvcc from fusing them into an FMA
        if (it.dtype[0] == BL_F32 && it.dtype[1] == BL_F32) // the CPU's f32 fast path computes in f32
          *(float *)o = __fadd_rn(__fmul_rn(*(const float *)a, (float)alpha), (float)s);
        else
          st(it.dtype[0], o, __dadd_rn(__dmul_rn(ld(it.dtype[1], a), alpha), s));
        break;
      default: { // EW_WHERE: operands out, cond, a, b
        bool take = ld(it.dtype[1], a) != 0;
        const char *x = take ? it.data[2] + off[2] * dsize(it.dtype[2]) : it.data[3] + off[3] * dsize(it.dtype[3]);
        st(it.dtype[0], o, ld(take ? it.dtype[2] : it.dtype[3], x));
        break;
      }
    }
  }
}

const int kCountedDevices = 64;
std::atomic<int64_t> conversions[kCountedDevices];

int launch_ew(const char *op, int dev, int nops, const bl_tensor *const *ops, int kind, int code, double s,
              double alpha, int scalar_first) {
  if (ops[0]->numel == 0) return 0;
  iter it;
  make_iter(&it, nops, ops);
  double bytes = 0;
  for (int k = 0; k < nops; k++) bytes += cu_bytes(ops[k]);
  // A copy that changes the dtype is the generic strided conversion (f32 scratch of a bf16 activation and back),
  // named by the op that needed it.
  bool convert = kind == EW_COPY && ops[0]->dtype != ops[1]->dtype;
  if (convert && dev >= 0 && dev < kCountedDevices) conversions[dev]++;
  cu_cost_kernel(dev, convert ? "convert" : kind == EW_COPY ? "copy" : "elementwise", op, bytes);
  ew_kernel<<<cu_blocks(it.n, 256), 256, 0, cu_stream(dev)>>>(it, kind, code, s, alpha, scalar_first);
  return cu_launched(op, dev);
}

int check_t(const char *op, const bl_tensor *t) {
  if (!t) return bl_set_error(BL_EINVAL, "%s: tensor is NULL", op);
  return bl_tensor_check(t, op);
}

// ---------------------------------------------------------------- reductions
struct red_args {
  int op, dtype, odtype;
  int nin, nout;
  int64_t ishape[BL_MAX_DIMS], istride[BL_MAX_DIMS]; // reduced dims (elements)
  int64_t oshape[BL_MAX_DIMS], ostride[BL_MAX_DIMS]; // kept dims: input strides
  int64_t outstr[BL_MAX_DIMS];                       // kept dims: output strides
  int64_t count, total;
  const char *in;
  char *out;
};

// better(a, b) for max/min with the CPU's rule: the first NaN wins, else the
// first extreme value (lower flat index on ties).
__device__ __forceinline__ bool red_better(int op, double v, int64_t i, double w, int64_t j) {
  bool vn = v != v, wn = w != w;
  if (vn || wn) return vn && (!wn || i < j);
  bool mx = op == BL_MAX || op == BL_ARGMAX;
  if (v != w) return mx ? v > w : v < w;
  return i < j;
}

// One block per output element (grid-stride). Threads stride over the reduced
// space; the block combines in a fixed tree order (deterministic).
__global__ void reduce_kernel(red_args a) {
  __shared__ double sv[256];
  __shared__ int64_t si[256];
  const int es = dsize(a.dtype), eo = dsize(a.odtype);
  for (int64_t t = blockIdx.x; t < a.total; t += gridDim.x) {
    int64_t rem = t, ioff = 0, ooff = 0;
    for (int d = a.nout - 1; d >= 0; d--) {
      int64_t ix = rem % a.oshape[d];
      rem /= a.oshape[d];
      ioff += ix * a.ostride[d];
      ooff += ix * a.outstr[d];
    }
    bool ext = a.op == BL_MAX || a.op == BL_MIN || a.op == BL_ARGMAX || a.op == BL_ARGMIN;
    double acc = a.op == BL_PROD ? 1.0 : 0.0;
    int64_t best = -1;
    for (int64_t f = threadIdx.x; f < a.count; f += blockDim.x) {
      int64_t r = f, off = ioff;
      for (int d = a.nin - 1; d >= 0; d--) {
        off += (r % a.ishape[d]) * a.istride[d];
        r /= a.ishape[d];
      }
      double v = ld(a.dtype, a.in + off * es);
      if (ext) {
        if (best < 0 || red_better(a.op, v, f, acc, best)) {
          acc = v;
          best = f;
        }
      } else if (a.op == BL_PROD)
        acc *= v;
      else
        acc += v;
    }
    sv[threadIdx.x] = acc;
    si[threadIdx.x] = best;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if ((int)threadIdx.x < w) {
        double v = sv[threadIdx.x], u = sv[threadIdx.x + w];
        int64_t i = si[threadIdx.x], j = si[threadIdx.x + w];
        if (ext) {
          if (j >= 0 && (i < 0 || red_better(a.op, u, j, v, i))) {
            sv[threadIdx.x] = u;
            si[threadIdx.x] = j;
          }
        } else if (a.op == BL_PROD)
          sv[threadIdx.x] = v * u;
        else
          sv[threadIdx.x] = v + u;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      double r = sv[0];
      if (a.op == BL_MEAN) r = r / (double)a.count;
      if (a.op == BL_ARGMAX || a.op == BL_ARGMIN) r = (double)si[0];
      if (a.count == 0 && a.op != BL_PROD) r = a.op == BL_MEAN ? NAN : 0.0;
      st(a.odtype, a.out + ooff * eo, r);
    }
    __syncthreads(); // sv/si reused by the next output of this block
  }
}

// ---------------------------------------------------------------- random fills (f32 contiguous scratch)
// One Box-Muller pair from two 32-bit draws (24 bits each; u1 in (0, 1]).
__device__ __forceinline__ void box_muller(uint32_t r1, uint32_t r2, double a, double b, float *z0, float *z1) {
  double u1 = bl_philox_u01_pos(r1), u2 = bl_philox_u01(r2);
  // sincospi(2 u2) = (sin, cos)(2 pi u2): no large-argument reduction, whose
  // slow path keeps an array in local memory (cos/sin of a double argument).
  double rad = sqrt(-2.0 * log(u1)), sn, cs;
  sincospi(2.0 * u2, &sn, &cs);
  *z0 = (float)(a + b * rad * cs);
  *z1 = (float)(a + b * rad * sn);
}

// Four values per Philox block, named scalars rather than arrays so nothing
// is kept in local memory.
__global__ void rand_kernel(float *p, int64_t n, uint64_t seed, uint64_t offset, double a, double b, int normal) {
  int64_t nblk = (n + 3) / 4;
  for (int64_t blk = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; blk < nblk;
       blk += (int64_t)gridDim.x * blockDim.x) {
    uint4 r = bl_philox4x32_dev(seed, offset + (uint64_t)blk);
    float v0, v1, v2, v3;
    if (normal) {
      box_muller(r.x, r.y, a, b, &v0, &v1);
      box_muller(r.z, r.w, a, b, &v2, &v3);
    } else {
      v0 = bl_philox_uniform_ab(r.x, a, b);
      v1 = bl_philox_uniform_ab(r.y, a, b);
      v2 = bl_philox_uniform_ab(r.z, a, b);
      v3 = bl_philox_uniform_ab(r.w, a, b);
    }
    int64_t i = blk * 4; // < n
    p[i] = v0;
    if (i + 1 < n) p[i + 1] = v1;
    if (i + 2 < n) p[i + 2] = v2;
    if (i + 3 < n) p[i + 3] = v3;
  }
}

// ---------------------------------------------------------------- column sums
// Stage 1: block (x: 32 columns, y: a chunk of CS_ROWS rows) with 32x8 threads;
// each thread sums rows r = chunk*CS_ROWS + ty, +8, ... in order, then the 8
// partials of a column are added in ty order. Stage 2 adds the chunks in order.
#define CS_ROWS 256
template <class T>
__global__ void colsum_partial(const T *x, int64_t rows, int64_t cols, float *part) {
  __shared__ float sh[8][33];
  int64_t j = blockIdx.x * 32LL + threadIdx.x;
  int64_t r0 = blockIdx.y * (int64_t)CS_ROWS, r1 = min(r0 + CS_ROWS, rows);
  float acc = 0.0f;
  if (j < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) acc += to_f(x[r * cols + j]);
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float s = 0.0f;
    for (int k = 0; k < 8; k++) s += sh[k][threadIdx.x];
    part[blockIdx.y * cols + j] = s;
  }
}
__global__ void colsum_final(const float *part, int64_t nchunk, int64_t cols, float *out) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x) {
    float s = 0.0f;
    for (int64_t c = 0; c < nchunk; c++) s += part[c * cols + j];
    out[j] += s;
  }
}

// ---------------------------------------------------------------- native casts of contiguous buffers
const int kCastV = 8; // elements per thread: 16 bytes of a half type, 32 of f32

// out[i] = in[i] converted (one rounding, through f32 registers: exact for every source of these types).
template <class TO, class TI>
__global__ void cast_kernel(TO *out, const TI *in, int64_t n) {
  const int64_t nv = n / kCastV;
  for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < nv; v += (int64_t)gridDim.x * blockDim.x) {
    cu_vec<TI, kCastV> a;
    cu_vec<TO, kCastV> b;
    a.load(in + v * kCastV);
#pragma unroll
    for (int e = 0; e < kCastV; e++) from_f(to_f(a.t[e]), &b.t[e]);
    b.store(out + v * kCastV);
  }
  for (int64_t i = nv * kCastV + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    from_f(to_f(in[i]), &out[i]);
}

template <class T>
__global__ void widen_ids(int64_t *out, const T *in, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = (int64_t)in[i];
}

template <class TO>
int launch_cast_to(const char *op, int dev, void *out, const void *in, int in_dtype, int64_t n) {
  const unsigned grid = cu_blocks(n / kCastV + 1, 256);
  cudaStream_t s = cu_stream(dev);
  if (in_dtype == BL_BF16)
    cast_kernel<TO, __nv_bfloat16><<<grid, 256, 0, s>>>((TO *)out, (const __nv_bfloat16 *)in, n);
  else if (in_dtype == BL_F16)
    cast_kernel<TO, __half><<<grid, 256, 0, s>>>((TO *)out, (const __half *)in, n);
  else
    cast_kernel<TO, float><<<grid, 256, 0, s>>>((TO *)out, (const float *)in, n);
  return cu_launched(op, dev);
}

bool half_or_f32(int dtype) { return dtype == BL_F32 || dtype == BL_BF16 || dtype == BL_F16; }

// Contiguous dst <- src of equal numel, between two different dtypes of f32/bf16/f16, with vector accesses when both
// buffers are 16-byte aligned; BL_EUNSUPPORTED (no error set) for anything else.
int cast_native(const char *op, int dev, const bl_tensor *dst, const bl_tensor *src) {
  if (dst->dtype == src->dtype || !half_or_f32(dst->dtype) || !half_or_f32(src->dtype)) return BL_EUNSUPPORTED;
  if (dst->numel != src->numel || !cu_is_contig(dst) || !cu_is_contig(src)) return BL_EUNSUPPORTED;
  if ((uintptr_t)dst->data % 16 || (uintptr_t)src->data % 16) return BL_EUNSUPPORTED;
  const int64_t n = dst->numel;
  if (n == 0) return 0;
  cu_cost_kernel(dev, "cast", op, cu_bytes(dst) + cu_bytes(src));
  if (dst->dtype == BL_BF16) return launch_cast_to<__nv_bfloat16>(op, dev, dst->data, src->data, src->dtype, n);
  if (dst->dtype == BL_F16) return launch_cast_to<__half>(op, dev, dst->data, src->data, src->dtype, n);
  return launch_cast_to<float>(op, dev, dst->data, src->data, src->dtype, n);
}

} // namespace

// ================================================================ common.cuh plumbing
int cu_is_contig(const bl_tensor *t) {
  int64_t s = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->stride[d] != s) return 0;
    s *= t->shape[d];
  }
  return 1;
}

// Contiguous image <-> tensor conversions through the generic copy kernel.
static int copy_between(const char *op, int dev, const bl_tensor *dst, const bl_tensor *src) {
  const bl_tensor *ops[2] = { dst, src };
  return launch_ew(op, dev, 2, ops, EW_COPY, 0, 0, 0, 0);
}

static void contig_header(bl_tensor *h, const bl_tensor *like, void *data, int dtype) {
  memset(h, 0, sizeof *h);
  h->data = data;
  h->ndim = like->ndim;
  h->numel = like->numel;
  h->dtype = dtype;
  h->device = like->device;
  int64_t s = 1;
  for (int d = like->ndim - 1; d >= 0; d--) {
    h->shape[d] = like->shape[d];
    h->stride[d] = s;
    s *= like->shape[d];
  }
}

int cu_load(const char *op, const bl_tensor *t, cu_buf *b) {
  b->n = t->numel;
  if (t->dtype == BL_F32 && cu_is_contig(t)) {
    b->p = (float *)t->data;
    return 0;
  }
  BL_CHECK(b->mem.alloc(op, t->device, (size_t)t->numel * sizeof(float)));
  b->p = b->mem.as<float>();
  bl_tensor h;
  contig_header(&h, t, b->p, BL_F32);
  return copy_between(op, t->device, &h, t);
}

int cu_out(const char *op, bl_tensor *t, cu_buf *b, int keep) {
  b->n = t->numel;
  if (t->dtype == BL_F32 && cu_is_contig(t)) {
    b->p = (float *)t->data;
    return 0;
  }
  BL_CHECK(b->mem.alloc(op, t->device, (size_t)t->numel * sizeof(float)));
  b->p = b->mem.as<float>();
  if (!keep) return 0;
  bl_tensor h;
  contig_header(&h, t, b->p, BL_F32);
  return copy_between(op, t->device, &h, t);
}

int cu_store(const char *op, bl_tensor *t, cu_buf *b) {
  if (!b->owned()) return 0;
  bl_tensor h;
  contig_header(&h, t, b->p, BL_F32);
  return copy_between(op, t->device, t, &h);
}

int cu_load_ids(const char *op, const bl_tensor *t, cu_mem *ids) {
  BL_CHECK(ids->alloc(op, t->device, (size_t)t->numel * sizeof(int64_t)));
  const int64_t n = t->numel;
  if (cu_is_contig(t) && (t->dtype == BL_I32 || t->dtype == BL_I64)) { // the usual case: no generic copy
    if (n == 0) return 0;
    cu_cost_kernel(t->device, "index check", "widen_ids", (double)n * (8 + bl_dtype_size(t->dtype)));
    const unsigned grid = cu_blocks(n, 256);
    cudaStream_t s = cu_stream(t->device);
    if (t->dtype == BL_I32)
      widen_ids<int32_t><<<grid, 256, 0, s>>>(ids->as<int64_t>(), (const int32_t *)t->data, n);
    else
      widen_ids<int64_t><<<grid, 256, 0, s>>>(ids->as<int64_t>(), (const int64_t *)t->data, n);
    return cu_launched(op, t->device);
  }
  bl_tensor h;
  contig_header(&h, t, ids->p, BL_I64);
  return copy_between(op, t->device, &h, t);
}

int cu_copy_from_contig(const char *op, bl_tensor *dst, const void *src, int src_dtype) {
  bl_tensor h;
  contig_header(&h, dst, (void *)src, src_dtype);
  return copy_between(op, dst->device, dst, &h);
}

int cu_copy_header(const char *op, int dev, const bl_tensor *dst, const bl_tensor *src) {
  BL_CHECK(bl_check_broadcast_to(op, src, dst));
  return copy_between(op, dev, dst, src);
}

int64_t cu_conversions(int dev) { return dev >= 0 && dev < kCountedDevices ? conversions[dev].load() : 0; }

int cu_copy_to_contig(const char *op, void *dst, int dst_dtype, const bl_tensor *src) {
  bl_tensor h;
  contig_header(&h, src, dst, dst_dtype);
  return copy_between(op, src->device, &h, src);
}

int cu_read_i64(const char *op, int dev, const int64_t *dptr, int64_t *host, int n) {
  cu_cost_call(dev, "host copy", "cudaMemcpyAsync d2h", BL_ENGINE_PCIE, 0, (double)n * sizeof(int64_t));
  CU_TRY(op, dev, cudaMemcpyAsync(host, dptr, (size_t)n * sizeof(int64_t), cudaMemcpyDeviceToHost, cu_stream(dev)));
  cu_count_sync(dev);
  CU_TRY(op, dev, cudaStreamSynchronize(cu_stream(dev)));
  return 0;
}

template <class T>
int colsum_acc(const char *op, int dev, const T *x, int64_t rows, int64_t cols, float *out) {
  if (rows == 0 || cols == 0) return 0;
  int64_t nchunk = (rows + CS_ROWS - 1) / CS_ROWS;
  if (nchunk > 65535)
    return bl_set_error(BL_EUNSUPPORTED, "%s: cuda:%d: %lld rows is too many for the column sum", op, dev,
                        (long long)rows);
  cu_mem part;
  BL_CHECK(part.alloc(op, dev, (size_t)(nchunk * cols) * sizeof(float)));
  dim3 grid((unsigned)((cols + 31) / 32), (unsigned)nchunk);
  cu_cost_kernel(dev, "bias grad", "colsum_partial", (sizeof(T) * (double)rows + 4.0 * nchunk) * cols);
  colsum_partial<T><<<grid, dim3(32, 8), 0, cu_stream(dev)>>>(x, rows, cols, part.as<float>());
  BL_CHECK(cu_launched(op, dev));
  cu_cost_kernel(dev, "bias grad", "colsum_final", 4.0 * (double)(nchunk + 2) * cols);
  colsum_final<<<cu_blocks(cols, 256), 256, 0, cu_stream(dev)>>>(part.as<float>(), nchunk, cols, out);
  return cu_launched(op, dev);
}

int cu_colsum_acc(const char *op, int dev, const float *x, int64_t rows, int64_t cols, float *out) {
  return colsum_acc(op, dev, x, rows, cols, out);
}

int cu_colsum_acc_native(const char *op, int dev, const bl_tensor *x, int64_t rows, int64_t cols, float *out) {
  if (!cu_is_contig(x)) return BL_EUNSUPPORTED;
  if (x->dtype == BL_BF16) return colsum_acc(op, dev, (const __nv_bfloat16 *)x->data, rows, cols, out);
  if (x->dtype == BL_F16) return colsum_acc(op, dev, (const __half *)x->data, rows, cols, out);
  return BL_EUNSUPPORTED;
}

// ================================================================ public tensor-core twins
extern "C" int bl_cuda_tensor_copy(bl_tensor *dst, const bl_tensor *src) {
  const char *op = "copy";
  BL_CHECK(check_t(op, dst));
  BL_CHECK(check_t(op, src));
  int dev;
  const bl_tensor *ts[] = { dst, src };
  BL_CHECK(cu_device(op, 2, ts, &dev));
  BL_CHECK(bl_check_broadcast_to(op, src, dst));
  int rc = cast_native(op, dev, dst, src);
  return rc != BL_EUNSUPPORTED ? rc : copy_between(op, dev, dst, src);
}

extern "C" int bl_cuda_cast(bl_tensor *dst, const bl_tensor *src) {
  const char *op = "cast";
  BL_CHECK(check_t(op, dst));
  BL_CHECK(check_t(op, src));
  if (dst->numel != src->numel || !cu_is_contig(dst) || !cu_is_contig(src)) {
    char a[128], b[128];
    return bl_set_error(BL_EINVAL, "%s: dst %s and src %s must be contiguous with equal numel", op, BL_SHAPE(dst, a),
                        BL_SHAPE(src, b));
  }
  int dev;
  const bl_tensor *ts[] = { dst, src };
  BL_CHECK(cu_device(op, 2, ts, &dev));
  bl_tensor h;
  contig_header(&h, dst, src->data, src->dtype); // src viewed with dst's shape
  int rc = cast_native(op, dev, dst, &h);
  return rc != BL_EUNSUPPORTED ? rc : copy_between(op, dev, dst, &h);
}

extern "C" int bl_cuda_tensor_fill(bl_tensor *t, double value) {
  const char *op = "fill";
  BL_CHECK(check_t(op, t));
  int dev;
  const bl_tensor *ts[] = { t };
  BL_CHECK(cu_device(op, 1, ts, &dev));
  return launch_ew(op, dev, 1, ts, EW_FILL, 0, value, 0, 0);
}

extern "C" int bl_cuda_binary(int op, bl_tensor *out, const bl_tensor *a, const bl_tensor *b) {
  if (op < 0 || op >= BL_NUM_BINOPS) return bl_set_error(BL_EINVAL, "binary: unknown operation %d", op);
  const char *name = bl_binop_names[op];
  BL_CHECK(check_t(name, out));
  BL_CHECK(check_t(name, a));
  BL_CHECK(check_t(name, b));
  int dev;
  const bl_tensor *ts[] = { out, a, b };
  BL_CHECK(cu_device(name, 3, ts, &dev));
  int n;
  int64_t shape[BL_MAX_DIMS];
  if (bl_broadcast_shape(a->ndim, a->shape, b->ndim, b->shape, &n, shape)) {
    char sa[128], sb[128];
    return bl_set_error(BL_EINVAL, "%s: shapes %s and %s are not compatible", name, BL_SHAPE(a, sa), BL_SHAPE(b, sb));
  }
  BL_CHECK(bl_check_out_shape(name, out, n, shape));
  return launch_ew(name, dev, 3, ts, EW_BINARY, op, 0, 0, 0);
}

extern "C" int bl_cuda_binary_scalar(int op, bl_tensor *out, const bl_tensor *a, double s, int scalar_first) {
  if (op < 0 || op >= BL_NUM_BINOPS) return bl_set_error(BL_EINVAL, "binary: unknown operation %d", op);
  const char *name = bl_binop_names[op];
  BL_CHECK(check_t(name, out));
  BL_CHECK(check_t(name, a));
  int dev;
  const bl_tensor *ts[] = { out, a };
  BL_CHECK(cu_device(name, 2, ts, &dev));
  BL_CHECK(bl_check_out_shape(name, out, a->ndim, a->shape));
  if (!scalar_first && (op == BL_ADD || op == BL_SUB || op == BL_MUL)) // as bl_binary_scalar: exact as affine
    return launch_ew(name, dev, 2, ts, EW_AFFINE, 0,
                     op == BL_ADD   ? s
                     : op == BL_SUB ? -s
                                    : 0.0,
                     op == BL_MUL ? s : 1.0, 0);
  return launch_ew(name, dev, 2, ts, EW_SCALAR, op, s, 0, scalar_first);
}

extern "C" int bl_cuda_unary(int op, bl_tensor *out, const bl_tensor *a) {
  if (op < 0 || op >= BL_NUM_UNOPS) return bl_set_error(BL_EINVAL, "unary: unknown operation %d", op);
  const char *name = bl_unop_names[op];
  BL_CHECK(check_t(name, out));
  BL_CHECK(check_t(name, a));
  int dev;
  const bl_tensor *ts[] = { out, a };
  BL_CHECK(cu_device(name, 2, ts, &dev));
  BL_CHECK(bl_check_out_shape(name, out, a->ndim, a->shape));
  return launch_ew(name, dev, 2, ts, EW_UNARY, op, 0, 0, 0);
}

extern "C" int bl_cuda_affine(bl_tensor *out, const bl_tensor *a, double alpha, double beta) {
  const char *name = "affine";
  BL_CHECK(check_t(name, out));
  BL_CHECK(check_t(name, a));
  int dev;
  const bl_tensor *ts[] = { out, a };
  BL_CHECK(cu_device(name, 2, ts, &dev));
  BL_CHECK(bl_check_out_shape(name, out, a->ndim, a->shape));
  return launch_ew(name, dev, 2, ts, EW_AFFINE, 0, beta, alpha, 0);
}

extern "C" int bl_cuda_where(bl_tensor *out, const bl_tensor *cond, const bl_tensor *a, const bl_tensor *b) {
  const char *name = "where";
  BL_CHECK(check_t(name, out));
  BL_CHECK(check_t(name, cond));
  BL_CHECK(check_t(name, a));
  BL_CHECK(check_t(name, b));
  int dev;
  const bl_tensor *ts[] = { out, cond, a, b };
  BL_CHECK(cu_device(name, 4, ts, &dev));
  int n1, n2;
  int64_t s1[BL_MAX_DIMS], s2[BL_MAX_DIMS];
  BL_CHECK(bl_broadcast_shape(a->ndim, a->shape, b->ndim, b->shape, &n1, s1));
  BL_CHECK(bl_broadcast_shape(n1, s1, cond->ndim, cond->shape, &n2, s2));
  BL_CHECK(bl_check_out_shape(name, out, n2, s2));
  return launch_ew(name, dev, 4, ts, EW_WHERE, 0, 0, 0, 0);
}

extern "C" int bl_cuda_reduce(int op, bl_tensor *out, const bl_tensor *a, uint32_t dim_mask, int keepdim) {
  if (op < 0 || op >= BL_NUM_REDOPS) return bl_set_error(BL_EINVAL, "reduce: unknown operation %d", op);
  const char *name = redop_names[op];
  BL_CHECK(check_t(name, out));
  BL_CHECK(check_t(name, a));
  int dev;
  const bl_tensor *ts[] = { out, a };
  BL_CHECK(cu_device(name, 2, ts, &dev));
  if (a->ndim < 32 && (dim_mask >> a->ndim))
    return bl_set_error(BL_EINVAL, "%s: dimension out of range for a tensor with %d dims", name, a->ndim);
  red_args r;
  memset(&r, 0, sizeof r);
  r.op = op;
  r.dtype = a->dtype;
  r.odtype = out->dtype;
  r.count = 1;
  r.in = (const char *)a->data;
  r.out = (char *)out->data;
  int64_t kshape[BL_MAX_DIMS];
  int nk = 0;
  for (int i = 0; i < a->ndim; i++) {
    if (dim_mask & (1u << i)) {
      r.ishape[r.nin] = a->shape[i];
      r.istride[r.nin++] = a->stride[i];
      r.count *= a->shape[i];
      if (keepdim) kshape[nk++] = 1;
    } else {
      r.oshape[r.nout] = a->shape[i];
      r.ostride[r.nout++] = a->stride[i];
      kshape[nk++] = a->shape[i];
    }
  }
  BL_CHECK(bl_check_out_shape(name, out, nk, kshape));
  if (r.count == 0 && (op == BL_MAX || op == BL_MIN || op == BL_ARGMAX || op == BL_ARGMIN))
    return bl_set_error(BL_EINVAL, "%s: cannot reduce over an empty dimension", name);
  for (int i = 0, k = 0; i < out->ndim; i++) {
    if (keepdim && (dim_mask & (1u << i))) continue;
    r.outstr[k++] = out->stride[i];
  }
  r.total = 1;
  for (int i = 0; i < r.nout; i++) r.total *= r.oshape[i];
  if (r.total == 0) return 0;
  int threads = 32;
  while (threads < 256 && threads < r.count) threads <<= 1;
  cu_cost_kernel(dev, "reduce", "reduce_kernel", cu_bytes(a) + cu_bytes(out));
  reduce_kernel<<<cu_blocks(r.total, 1, 1 << 20), threads, 0, cu_stream(dev)>>>(r);
  return cu_launched(name, dev);
}

static int rand_fill(const char *op, bl_tensor *t, uint64_t seed, uint64_t offset, double a, double b, int normal) {
  BL_CHECK(check_t(op, t));
  int dev;
  const bl_tensor *ts[] = { t };
  BL_CHECK(cu_device(op, 1, ts, &dev));
  if (!bl_dtype_is_float(t->dtype))
    return bl_set_error(BL_EINVAL, "%s: floating-point output required, got %s", op, bl_dtype_name(t->dtype));
  if (t->numel == 0) return 0;
  cu_buf o;
  BL_CHECK(cu_out(op, t, &o, 0));
  cu_cost_kernel(dev, "random", "rand_kernel", 4.0 * t->numel);
  rand_kernel<<<cu_blocks((t->numel + 3) / 4, 256), 256, 0, cu_stream(dev)>>>(o.p, t->numel, seed, offset, a, b,
                                                                              normal);
  BL_CHECK(cu_launched(op, dev));
  return cu_store(op, t, &o);
}

extern "C" int bl_cuda_rand_uniform(bl_tensor *t, uint64_t seed, uint64_t offset, double low, double high) {
  return rand_fill("rand", t, seed, offset, low, high, 0);
}

extern "C" int bl_cuda_rand_normal(bl_tensor *t, uint64_t seed, uint64_t offset, double mean, double std) {
  if (!(std >= 0)) return bl_set_error(BL_EINVAL, "randn: std must be >= 0, got %g", std);
  return rand_fill("randn", t, seed, offset, mean, std, 1);
}
