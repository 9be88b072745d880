/* Input pipeline to a GPU (contract in bl_loader.h): double-buffered pinned
 * host and device buffers, host-to-device copies on the copy stream, ordered
 * against the compute stream by events. put_next has the loader build the
 * batch's large fields in the pinned buffers themselves. */
#include <stdlib.h>
#include "../base/internal.h"
#include "bl_loader.h"
#ifdef BL_HAVE_CUDA
#include "../device/cuda_ops.h"
#endif

enum { F_IDS, F_TYPES, F_MASK, F_MPOS, F_MLAB, F_NSP, F_COUNT, SLOTS = 2 };

typedef struct {
  int32_t *host[F_COUNT];  /* pinned */
  bl_tensor *dev[F_COUNT]; /* 1-d int32 device buffers of the largest shape */
  void *copied;            /* copy stream: this slot's copies are done */
  void *consumed;          /* compute stream: the step that read this slot is done */
  int consumed_recorded;
  int64_t S, epoch, pos, tokens;
} fslot;

struct bl_feeder {
  int device;
  int64_t B, S_max, P;
  void *copy_stream;
  fslot s[SLOTS];
  int head, count; /* oldest slot in flight, slots in flight */
  int handed;      /* slot handed out by the last get, -1: none */
  int64_t staged;  /* bytes copied from ordinary memory into the pinned buffers */
};

#ifdef BL_HAVE_CUDA
static int64_t field_numel(const bl_feeder *f, int i) {
  return i == F_NSP ? f->B : f->B * (i == F_MPOS || i == F_MLAB ? f->P : f->S_max);
}

void bl_feeder_free(bl_feeder *f) {
  if (!f) return;
  for (int k = 0; k < SLOTS; k++) {
    fslot *s = &f->s[k];
    /* copies may still read the pinned buffers: wait before freeing them */
    if (s->copied) bl_cuda_event_wait_host(f->device, s->copied);
    for (int i = 0; i < F_COUNT; i++) {
      bl_cuda_host_free(s->host[i]);
      bl_tensor_free(s->dev[i]);
    }
    bl_cuda_event_free(s->copied);
    bl_cuda_event_free(s->consumed);
  }
  free(f);
}

int bl_feeder_new(int device, int64_t batch_size, int32_t max_seq_length, int32_t max_predictions, bl_feeder **res) {
  const char *op = "feeder";
  *res = NULL;
  if (batch_size < 1 || max_seq_length < 1 || max_predictions < 0)
    return bl_set_error(BL_EINVAL, "%s: batch %lld, max_seq_length %d, max_predictions %d (need >= 1, >= 1, >= 0)", op,
                        (long long)batch_size, max_seq_length, max_predictions);
  BL_CHECK(bl_dev_check(device, op));
  bl_feeder *f = calloc(1, sizeof *f);
  if (!f) return bl_set_error(BL_ENOMEM, "%s: out of host memory", op);
  f->device = device;
  f->B = batch_size;
  f->S_max = ((int64_t)(max_seq_length < 8 ? 8 : max_seq_length) + 7) / 8 * 8; /* the loader's padding */
  f->P = max_predictions;
  f->handed = -1;
  int st = (f->copy_stream = bl_cuda_copy_stream(device)) ? 0 : BL_EDEVICE;
  for (int k = 0; k < SLOTS && !st; k++) {
    fslot *s = &f->s[k];
    for (int i = 0; i < F_COUNT && !st; i++) {
      int64_t n = field_numel(f, i);
      st = bl_cuda_host_alloc((size_t)n * sizeof(int32_t), (void **)&s->host[i]);
      if (!st) st = bl_tensor_empty(1, &n, BL_I32, device, &s->dev[i]);
    }
    if (!st) st = bl_cuda_event_new(device, &s->copied);
    if (!st) st = bl_cuda_event_new(device, &s->consumed);
  }
  if (st) {
    bl_feeder_free(f);
    return st;
  }
  *res = f;
  return 0;
}

static int check_field(const bl_feeder *f, const bl_tensor *t, int i, int64_t S) {
  static const char *names[F_COUNT] = { "input_ids",           "token_type_ids",   "attention_mask",
                                        "masked_lm_positions", "masked_lm_labels", "next_sentence_labels" };
  int64_t cols = i == F_NSP ? 1 : i == F_MPOS || i == F_MLAB ? f->P : S;
  BL_CHECK(bl_tensor_check(t, "feeder"));
  if (t->device >= 0 || t->dtype != BL_I32 || !bl_tensor_is_contiguous(t) || t->numel != f->B * cols)
    return bl_set_error(BL_EINVAL, "feeder: %s must be a contiguous CPU int32 tensor of %lld x %lld elements", names[i],
                        (long long)f->B, (long long)cols);
  return 0;
}

/* The free slot, once its pinned buffers are no longer read by its previous copies (long ago in a pipeline). */
static int free_slot(bl_feeder *f, fslot **out) {
  if (f->count == SLOTS) return bl_set_error(BL_EINVAL, "feeder: put with %d batches in flight (get one first)", SLOTS);
  fslot *s = &f->s[(f->head + f->count) % SLOTS];
  BL_CHECK(bl_cuda_event_wait_host(f->device, s->copied));
  *out = s;
  return 0;
}

/* The slot's pinned buffers, filled for a batch of sequence length S, to the device on the copy stream. */
static int queue_copies(bl_feeder *f, fslot *s, int64_t S, const bl_loader_batch *b) {
  /* the device buffers are free once the step that read them is done */
  if (s->consumed_recorded) BL_CHECK(bl_cuda_stream_wait_event(f->device, f->copy_stream, s->consumed));
  for (int i = 0; i < F_COUNT; i++) {
    int64_t n = i == F_NSP ? f->B : f->B * (i == F_MPOS || i == F_MLAB ? f->P : S);
    BL_CHECK(
        bl_cuda_memcpy_h2d_on(f->device, f->copy_stream, s->dev[i]->data, s->host[i], (size_t)n * sizeof(int32_t)));
  }
  BL_CHECK(bl_cuda_event_record(f->device, s->copied, f->copy_stream));
  s->S = S;
  s->epoch = b->epoch;
  s->pos = b->pos;
  s->tokens = b->tokens;
  f->count++;
  return 0;
}

int bl_feeder_put(bl_feeder *f, const bl_loader_batch *b) {
  if (!f || !b) return bl_set_error(BL_EINVAL, "feeder: put on a NULL feeder or batch");
  const bl_tensor *t[F_COUNT] = { b->input_ids,           b->token_type_ids,   b->attention_mask,
                                  b->masked_lm_positions, b->masked_lm_labels, b->next_sentence_labels };
  int64_t S = t[F_IDS] && t[F_IDS]->ndim == 2 ? t[F_IDS]->shape[1] : 0;
  if (S < 1 || S > f->S_max)
    return bl_set_error(BL_EINVAL, "feeder: batch of sequence length %lld (this feeder holds 1..%lld)", (long long)S,
                        (long long)f->S_max);
  for (int i = 0; i < F_COUNT; i++) BL_CHECK(check_field(f, t[i], i, S));
  fslot *s = NULL;
  BL_CHECK(free_slot(f, &s));
  for (int i = 0; i < F_COUNT; i++) {
    memcpy(s->host[i], t[i]->data, (size_t)t[i]->numel * sizeof(int32_t));
    f->staged += t[i]->numel * (int64_t)sizeof(int32_t);
  }
  return queue_copies(f, s, S, b);
}

int bl_feeder_put_next(bl_feeder *f, bl_loader *l, bl_loader_batch *host) {
  if (!f || !l || !host) return bl_set_error(BL_EINVAL, "feeder: put_next on a NULL feeder, loader or batch");
  fslot *s = NULL;
  BL_CHECK(free_slot(f, &s));
  int32_t *const dst[3] = { s->host[F_IDS], s->host[F_TYPES], s->host[F_MASK] };
  int64_t S = 0;
  BL_CHECK(bl_loader_next_into(l, dst, f->S_max, &S, host));
  /* the small host-side fields (the pre-training head reads them on the host) go to the device too */
  const bl_tensor *t[F_COUNT] = {
    NULL, NULL, NULL, host->masked_lm_positions, host->masked_lm_labels, host->next_sentence_labels
  };
  int st = 0;
  for (int i = F_MPOS; i < F_COUNT && !st; i++) st = check_field(f, t[i], i, S);
  for (int i = F_MPOS; i < F_COUNT && !st; i++) {
    memcpy(s->host[i], t[i]->data, (size_t)t[i]->numel * sizeof(int32_t));
    f->staged += t[i]->numel * (int64_t)sizeof(int32_t);
  }
  if (!st) st = queue_copies(f, s, S, host);
  if (st) { /* the batch is lost with its position moved on: the caller's error ends the run */
    bl_tensor_free(host->masked_lm_positions);
    bl_tensor_free(host->masked_lm_labels);
    bl_tensor_free(host->next_sentence_labels);
    memset(host, 0, sizeof *host);
  }
  return st;
}

int bl_feeder_get(bl_feeder *f, bl_loader_batch *out) {
  if (!f || !out) return bl_set_error(BL_EINVAL, "feeder: get on a NULL feeder or batch");
  if (f->count == 0) return bl_set_error(BL_EINVAL, "feeder: get with no batch in flight (put one first)");
  /* the slot handed out last time is read by the work queued so far, and by nothing later */
  if (f->handed >= 0) {
    BL_CHECK(bl_cuda_event_record(f->device, f->s[f->handed].consumed, NULL));
    f->s[f->handed].consumed_recorded = 1;
  }
  fslot *s = &f->s[f->head];
  BL_CHECK(bl_cuda_stream_wait_event(f->device, NULL, s->copied));
  bl_tensor **o[F_COUNT] = { &out->input_ids,           &out->token_type_ids,   &out->attention_mask,
                             &out->masked_lm_positions, &out->masked_lm_labels, &out->next_sentence_labels };
  memset(out, 0, sizeof *out);
  for (int i = 0; i < F_COUNT; i++) {
    int64_t cols = i == F_MPOS || i == F_MLAB ? f->P : s->S;
    int64_t shape[2] = { f->B, cols }, stride[2] = { i == F_NSP ? 1 : cols, 1 };
    int st = bl_tensor_as_strided(s->dev[i], i == F_NSP ? 1 : 2, shape, stride, 0, o[i]);
    if (st) {
      for (int j = 0; j < i; j++) bl_tensor_free(*o[j]);
      memset(out, 0, sizeof *out);
      return st;
    }
  }
  out->epoch = s->epoch;
  out->pos = s->pos;
  out->tokens = s->tokens;
  f->handed = f->head;
  f->head = (f->head + 1) % SLOTS;
  f->count--;
  return 0;
}

/* ---- bl_stager: any batch through pinned buffers (evaluation and prediction) */
typedef struct {
  void *host[BL_STAGER_FIELDS];     /* pinned, cap[i] bytes */
  bl_tensor *dev[BL_STAGER_FIELDS]; /* 1-d device buffers of the field's dtype, cap[i] bytes */
  size_t cap[BL_STAGER_FIELDS];
  struct {
    int ndim;
    int64_t shape[BL_MAX_DIMS];
  } dims[BL_STAGER_FIELDS]; /* of the staged batch */
  void *copied, *consumed;
  int consumed_recorded, n;
} sslot;

struct bl_stager {
  int device;
  void *copy_stream;
  sslot s[SLOTS];
  int head, count, handed;
};

void bl_stager_free(bl_stager *st) {
  if (!st) return;
  for (int k = 0; k < SLOTS; k++) {
    sslot *s = &st->s[k];
    if (s->copied) bl_cuda_event_wait_host(st->device, s->copied);
    for (int i = 0; i < BL_STAGER_FIELDS; i++) {
      bl_cuda_host_free(s->host[i]);
      bl_tensor_free(s->dev[i]);
    }
    bl_cuda_event_free(s->copied);
    bl_cuda_event_free(s->consumed);
  }
  free(st);
}

int bl_stager_new(int device, bl_stager **res) {
  const char *op = "stager";
  *res = NULL;
  BL_CHECK(bl_dev_check(device, op));
  bl_stager *st = calloc(1, sizeof *st);
  if (!st) return bl_set_error(BL_ENOMEM, "%s: out of host memory", op);
  st->device = device;
  st->handed = -1;
  int rc = (st->copy_stream = bl_cuda_copy_stream(device)) ? 0 : BL_EDEVICE;
  for (int k = 0; k < SLOTS && !rc; k++) {
    rc = bl_cuda_event_new(device, &st->s[k].copied);
    if (!rc) rc = bl_cuda_event_new(device, &st->s[k].consumed);
  }
  if (rc) {
    bl_stager_free(st);
    return rc;
  }
  *res = st;
  return 0;
}

/* Field i of slot s able to hold t: grown (pinned and device memory) when t is larger or of another dtype. A new
 * device buffer may reuse memory the compute stream still reads, so its copy waits for the work queued so far. */
static int stager_fit(bl_stager *st, sslot *s, int i, const bl_tensor *t) {
  size_t n = (size_t)t->numel * (size_t)bl_dtype_size(t->dtype);
  if (s->dev[i] && s->dev[i]->dtype == t->dtype && s->cap[i] >= n) return 0;
  bl_cuda_host_free(s->host[i]);
  bl_tensor_free(s->dev[i]);
  s->host[i] = NULL, s->dev[i] = NULL, s->cap[i] = 0;
  int64_t numel = t->numel > 0 ? t->numel : 1;
  BL_CHECK(bl_cuda_host_alloc((size_t)numel * (size_t)bl_dtype_size(t->dtype), &s->host[i]));
  BL_CHECK(bl_tensor_empty(1, &numel, t->dtype, st->device, &s->dev[i]));
  s->cap[i] = (size_t)numel * (size_t)bl_dtype_size(t->dtype);
  BL_CHECK(bl_cuda_event_record(st->device, s->consumed, NULL));
  s->consumed_recorded = 1;
  return 0;
}

int bl_stager_put(bl_stager *st, int n, bl_tensor *const *fields) {
  const char *op = "stager";
  if (!st || (n > 0 && !fields)) return bl_set_error(BL_EINVAL, "%s: put on a NULL stager or field list", op);
  if (n < 1 || n > BL_STAGER_FIELDS)
    return bl_set_error(BL_EINVAL, "%s: %d fields (1..%d)", op, n, (int)BL_STAGER_FIELDS);
  for (int i = 0; i < n; i++) {
    BL_CHECK(bl_tensor_check(fields[i], op));
    if (fields[i]->device >= 0 || !bl_tensor_is_contiguous(fields[i]))
      return bl_set_error(BL_EINVAL, "%s: field %d must be a contiguous CPU tensor", op, i + 1);
  }
  if (st->count == SLOTS)
    return bl_set_error(BL_EINVAL, "%s: put with %d batches in flight (get one first)", op, SLOTS);
  sslot *s = &st->s[(st->head + st->count) % SLOTS];
  BL_CHECK(bl_cuda_event_wait_host(st->device, s->copied)); /* its pinned buffers are no longer read */
  for (int i = 0; i < n; i++) BL_CHECK(stager_fit(st, s, i, fields[i]));
  if (s->consumed_recorded) BL_CHECK(bl_cuda_stream_wait_event(st->device, st->copy_stream, s->consumed));
  for (int i = 0; i < n; i++) {
    size_t bytes = (size_t)fields[i]->numel * (size_t)bl_dtype_size(fields[i]->dtype);
    if (bytes) memcpy(s->host[i], fields[i]->data, bytes);
    BL_CHECK(bl_cuda_memcpy_h2d_on(st->device, st->copy_stream, s->dev[i]->data, s->host[i], bytes));
    s->dims[i].ndim = fields[i]->ndim;
    memcpy(s->dims[i].shape, fields[i]->shape, sizeof s->dims[i].shape);
  }
  BL_CHECK(bl_cuda_event_record(st->device, s->copied, st->copy_stream));
  s->n = n;
  st->count++;
  return 0;
}

int bl_stager_get(bl_stager *st, int n, bl_tensor **out) {
  const char *op = "stager";
  if (!st || !out) return bl_set_error(BL_EINVAL, "%s: get on a NULL stager or output list", op);
  if (st->count == 0) return bl_set_error(BL_EINVAL, "%s: get with no batch in flight (put one first)", op);
  sslot *s = &st->s[st->head];
  if (n != s->n) return bl_set_error(BL_EINVAL, "%s: get of %d fields, the batch has %d", op, n, s->n);
  if (st->handed >= 0) { /* the slot handed out last is read by the work queued so far */
    BL_CHECK(bl_cuda_event_record(st->device, st->s[st->handed].consumed, NULL));
    st->s[st->handed].consumed_recorded = 1;
  }
  BL_CHECK(bl_cuda_stream_wait_event(st->device, NULL, s->copied));
  for (int i = 0; i < n; i++) out[i] = NULL;
  for (int i = 0; i < n; i++) {
    int nd = s->dims[i].ndim;
    const int64_t *shape = s->dims[i].shape;
    int64_t stride[BL_MAX_DIMS], k = 1;
    for (int d = nd - 1; d >= 0; k *= shape[d], d--) stride[d] = k;
    int rc = bl_tensor_as_strided(s->dev[i], nd, shape, stride, 0, &out[i]);
    if (rc) {
      for (int j = 0; j < i; j++) bl_tensor_free(out[j]), out[j] = NULL;
      return rc;
    }
  }
  st->handed = st->head;
  st->head = (st->head + 1) % SLOTS;
  st->count--;
  return 0;
}
#else
void bl_feeder_free(bl_feeder *f) { (void)f; }
int bl_feeder_new(int device, int64_t batch_size, int32_t max_seq_length, int32_t max_predictions, bl_feeder **res) {
  (void)batch_size, (void)max_seq_length, (void)max_predictions;
  *res = NULL;
  return bl_set_error(BL_EDEVICE, "feeder: cuda:%d requested, but this bertlua was built without CUDA", device);
}
int bl_feeder_put(bl_feeder *f, const bl_loader_batch *b) {
  (void)f, (void)b;
  return bl_set_error(BL_EDEVICE, "feeder: this bertlua was built without CUDA");
}
int bl_feeder_put_next(bl_feeder *f, bl_loader *l, bl_loader_batch *host) {
  (void)f, (void)l, (void)host;
  return bl_set_error(BL_EDEVICE, "feeder: this bertlua was built without CUDA");
}
int bl_feeder_get(bl_feeder *f, bl_loader_batch *out) {
  (void)f, (void)out;
  return bl_set_error(BL_EDEVICE, "feeder: this bertlua was built without CUDA");
}
struct bl_stager {
  int count;
};
void bl_stager_free(bl_stager *st) { (void)st; }
int bl_stager_new(int device, bl_stager **res) {
  *res = NULL;
  return bl_set_error(BL_EDEVICE, "stager: cuda:%d requested, but this bertlua was built without CUDA", device);
}
int bl_stager_put(bl_stager *st, int n, bl_tensor *const *fields) {
  (void)st, (void)n, (void)fields;
  return bl_set_error(BL_EDEVICE, "stager: this bertlua was built without CUDA");
}
int bl_stager_get(bl_stager *st, int n, bl_tensor **out) {
  (void)st, (void)n, (void)out;
  return bl_set_error(BL_EDEVICE, "stager: this bertlua was built without CUDA");
}
#endif

int bl_stager_in_flight(const bl_stager *st) { return st ? st->count : 0; }

int bl_feeder_in_flight(const bl_feeder *f) { return f ? f->count : 0; }

int64_t bl_feeder_staged_bytes(const bl_feeder *f) { return f ? f->staged : 0; }

void bl_feeder_drop(bl_feeder *f) {
  if (f) f->count = 0;
}
