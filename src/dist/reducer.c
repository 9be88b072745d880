/* Bucketed gradient all-reduce (contract in bl_dist.h). The bucket views and
 * the bf16 copy are made once in bl_reducer_new, so a step allocates nothing;
 * CUDA buffers go to the NCCL buckets of nccl.c, CPU buffers to
 * MPI_Iallreduce. */
#include <mpi.h>
#include <stdlib.h>
#include "../base/internal.h"
#include "bl_dist.h"
#include "dist_internal.h"

struct bl_reducer {
  bl_tensor *grads;           /* f32, the caller's buffer (own header, shared storage) */
  bl_tensor *buf;             /* what is summed: grads itself, or its bf16/f16 copy */
  bl_tensor **gpart, **bpart; /* bucket views of grads and buf */
  int n;
  char *launched;
  MPI_Request *req; /* CPU path */
  MPI_Op half_sum;  /* CPU path, bf16 or f16 */
#ifdef BL_HAVE_NCCL
  bl_nccl_buckets *dev; /* CUDA path */
#endif
};

static int world_of_one(void) { return !bl_dist_initialized() || bl_dist_size() == 1; }

/* MPI user ops: half + half rounded to half (nearest even), as NCCL's bf16 and f16 sums. */
static void bf16_add(void *in, void *inout, int *len, MPI_Datatype *ty) {
  (void)ty;
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++) b[i] = bl_f32_to_bf16(bl_bf16_to_f32(a[i]) + bl_bf16_to_f32(b[i]));
}
static void f16_add(void *in, void *inout, int *len, MPI_Datatype *ty) {
  (void)ty;
  const uint16_t *a = in;
  uint16_t *b = inout;
  for (int i = 0; i < *len; i++) b[i] = bl_f32_to_f16(bl_f16_to_f32(a[i]) + bl_f16_to_f32(b[i]));
}

void bl_reducer_free(bl_reducer *r) {
  if (!r) return;
#ifdef BL_HAVE_NCCL
  bl_nccl_buckets_free(r->dev);
#endif
  for (int i = 0; i < r->n; i++) {
    if (r->gpart) bl_tensor_free(r->gpart[i]);
    if (r->bpart && r->bpart[i] != (r->gpart ? r->gpart[i] : NULL)) bl_tensor_free(r->bpart[i]);
  }
  if (r->buf != r->grads) bl_tensor_free(r->buf);
  bl_tensor_free(r->grads);
  if (r->half_sum != MPI_OP_NULL) MPI_Op_free(&r->half_sum);
  free(r->gpart);
  free(r->bpart);
  free(r->launched);
  free(r->req);
  free(r);
}

static int make_parts(bl_reducer *r, int64_t bucket_elems) {
  int64_t n = r->grads->numel;
  for (int i = 0; i < r->n; i++) {
    int64_t start = (int64_t)i * bucket_elems, len = n - start < bucket_elems ? n - start : bucket_elems;
    BL_CHECK(bl_tensor_narrow(r->grads, 0, start, len, &r->gpart[i]));
    if (r->buf == r->grads)
      r->bpart[i] = r->gpart[i];
    else
      BL_CHECK(bl_tensor_narrow(r->buf, 0, start, len, &r->bpart[i]));
    r->req[i] = MPI_REQUEST_NULL;
  }
  return 0;
}

int bl_reducer_new(bl_tensor *grads, int64_t bucket_elems, int reduce_dtype, bl_reducer **res) {
  const char *op = "reducer";
  *res = NULL;
  BL_CHECK(bl_tensor_check(grads, op));
  if (grads->dtype != BL_F32 || grads->ndim != 1 || !bl_tensor_is_contiguous(grads))
    return bl_set_error(BL_EINVAL, "%s: gradients must be a contiguous 1-d f32 buffer (got %s, %d dims)", op,
                        bl_dtype_name(grads->dtype), grads->ndim);
  if (reduce_dtype != BL_F32 && reduce_dtype != BL_BF16 && reduce_dtype != BL_F16)
    return bl_set_error(BL_EINVAL, "%s: reduction dtype must be f32, bf16 or f16, not %s", op,
                        bl_dtype_name(reduce_dtype));
  if (bucket_elems < 1) return bl_set_error(BL_EINVAL, "%s: bucket size %lld < 1 element", op, (long long)bucket_elems);
  if (bucket_elems > INT32_MAX)
    return bl_set_error(BL_EINVAL, "%s: bucket of %lld elements is too large for one collective", op,
                        (long long)bucket_elems);
  int64_t nb = (grads->numel + bucket_elems - 1) / bucket_elems;
  if (nb > 1 << 20) return bl_set_error(BL_EINVAL, "%s: %lld buckets: make them larger", op, (long long)nb);
  bl_reducer *r = calloc(1, sizeof *r);
  if (!r) return bl_set_error(BL_ENOMEM, "%s: out of host memory", op);
  r->half_sum = MPI_OP_NULL;
  r->n = nb > 0 ? (int)nb : 1;
  int st = bl_tensor_alias(grads, &r->grads);
  if (!st && reduce_dtype != BL_F32 && !world_of_one()) { /* alone: nothing to sum, no copy */
    int64_t shape = grads->numel;
    st = bl_tensor_empty(1, &shape, reduce_dtype, grads->device, &r->buf);
  } else if (!st) {
    r->buf = r->grads;
  }
  r->gpart = calloc((size_t)r->n, sizeof *r->gpart);
  r->bpart = calloc((size_t)r->n, sizeof *r->bpart);
  r->launched = calloc((size_t)r->n, 1);
  r->req = calloc((size_t)r->n, sizeof *r->req);
  if (!st && (!r->gpart || !r->bpart || !r->launched || !r->req)) st = bl_set_error(BL_ENOMEM, "%s: out of memory", op);
  if (!st) st = make_parts(r, bucket_elems);
  if (!st && reduce_dtype != BL_F32 && grads->device < 0 && !world_of_one() &&
      MPI_Op_create(reduce_dtype == BL_BF16 ? bf16_add : f16_add, 1, &r->half_sum) != MPI_SUCCESS)
    st = bl_set_error(BL_EIO, "%s: MPI_Op_create failed", op);
#ifdef BL_HAVE_NCCL
  /* collective: every rank joins it even after a local failure (nccl.c), so none waits for a dead one */
  if (grads->device >= 0 && !world_of_one()) {
    bl_tensor *probe = r->buf ? r->buf : grads;
    int dst = bl_nccl_buckets_new(probe, r->n, bl_dist_comm(), bl_dist_rank(), bl_dist_size(), &r->dev);
    if (!st) st = dst;
  }
#else
  if (!st && grads->device >= 0 && !world_of_one())
    st = bl_set_error(BL_EUNSUPPORTED, "%s: gradients on cuda:%d need NCCL, which this build lacks", op, grads->device);
#endif
  if (st) {
    bl_reducer_free(r);
    return st;
  }
  *res = r;
  return 0;
}

int bl_reducer_buckets(const bl_reducer *r) { return r ? r->n : 0; }

int bl_reducer_launch(bl_reducer *r, int bucket) {
  const char *op = "reducer";
  if (!r) return bl_set_error(BL_EINVAL, "%s: no reducer", op);
  if (bucket < 0 || bucket >= r->n) return bl_set_error(BL_EINVAL, "%s: bucket %d outside 0..%d", op, bucket, r->n - 1);
  if (r->launched[bucket]) return bl_set_error(BL_EINVAL, "%s: bucket %d launched twice in one step", op, bucket);
  r->launched[bucket] = 1;
  if (world_of_one()) return 0;
  bl_tensor *g = r->gpart[bucket], *b = r->bpart[bucket];
  if (b != g) BL_CHECK(bl_tensor_copy(b, g)); /* half copy; on a GPU queued on the compute stream */
#ifdef BL_HAVE_NCCL
  if (r->dev) return bl_nccl_buckets_launch(r->dev, b, bucket);
#endif
  int half = b != g;
  int err = MPI_Iallreduce(MPI_IN_PLACE, b->data, (int)b->numel, half ? MPI_UINT16_T : MPI_FLOAT,
                           half ? r->half_sum : MPI_SUM, bl_dist_comm(), &r->req[bucket]);
  return err == MPI_SUCCESS ? 0 : bl_set_error(BL_EIO, "%s: MPI_Iallreduce of bucket %d failed", op, bucket);
}

int bl_reducer_finish(bl_reducer *r) {
  const char *op = "reducer";
  if (!r) return bl_set_error(BL_EINVAL, "%s: no reducer", op);
  int st = 0;
  for (int i = 0; i < r->n && !st; i++)
    if (!r->launched[i]) st = bl_reducer_launch(r, i);
  for (int i = 0; i < r->n; i++) r->launched[i] = 0;
  BL_CHECK(st);
  if (world_of_one()) return 0;
#ifdef BL_HAVE_NCCL
  if (r->dev)
    st = bl_nccl_buckets_finish(r->dev);
  else
#endif
    st = bl_dist_wait(r->req, r->n, op, "all-reduce of the gradient buckets", NULL);
  BL_CHECK(st);
  /* bf16/f16: the sums go back into the f32 buffer (on a GPU after the communication stream, see above) */
  return r->buf != r->grads ? bl_tensor_copy(r->grads, r->buf) : 0;
}

int bl_reducer_cancel(bl_reducer *r) {
  if (!r) return bl_set_error(BL_EINVAL, "reducer: no reducer");
  for (int i = 0; i < r->n; i++) r->launched[i] = 0;
  return 0;
}

int bl_reducer_replayed(bl_reducer *r) {
  if (!r) return bl_set_error(BL_EINVAL, "reducer: no reducer");
#ifdef BL_HAVE_NCCL
  if (r->dev) bl_nccl_buckets_replayed(r->dev);
#endif
  return 0;
}

int bl_reducer_poll(bl_reducer *r) {
  if (!r) return bl_set_error(BL_EINVAL, "reducer: no reducer");
#ifdef BL_HAVE_NCCL
  if (r->dev) return bl_nccl_buckets_poll(r->dev);
#endif
  return 0;
}

int bl_reducer_wait(bl_reducer *r) {
  if (!r) return bl_set_error(BL_EINVAL, "reducer: no reducer");
#ifdef BL_HAVE_NCCL
  if (r->dev) return bl_nccl_buckets_wait(r->dev);
#endif
  return 0;
}
