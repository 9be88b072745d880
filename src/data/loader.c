/* The pre-training batch loader: shards as one dataset, the epoch order for
 * one rank, padded batches, and a prefetch thread filling a ring of ready
 * batches in host memory (contract in bl_loader.h). The batches are bit-identical to the
 * Lua reference loader in tests/lua/lib/ref_loader.lua. */
#define _POSIX_C_SOURCE 200809L /* pthread_sigmask, clock_gettime */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data_internal.h"

/* One prepared batch: its tensors are built in place by the producer and
 * handed to the caller as they are (no copy). t[] is NULL when empty. */
enum { T_IDS, T_TYPES, T_MASK, T_MPOS, T_MLAB, T_NSP, T_COUNT };
typedef struct slot {
  bl_tensor *t[T_COUNT];
  int64_t S, epoch, pos, tokens;
  int rc; /* nonzero: building failed (out of memory), err says why */
  char err[256];
} slot;

/* What building a batch needs besides the read-only loader: owned by the
 * prefetch thread (or by the caller when there is none). */
typedef struct worker {
  uint32_t *perm;     /* [total] order of perm_epoch */
  int64_t perm_epoch; /* -1: none yet */
  uint64_t *scratch;  /* binning */
  bl_mask_scratch ms;
  int32_t *tok; /* one sequence as int32 */
} worker;

struct bl_loader {
  /* read-only after open */
  bl_shard **shards;
  int32_t nshards;
  int64_t *starts;   /* [nshards] first instance index of each shard */
  uint16_t *lengths; /* [total] sequence lengths */
  int64_t total, per_rank, steps, B;
  int32_t rank, world, P, max_length;
  double seed, masked_lm_prob;
  int dynamic, whole_word;
  bl_order_params order;
  bl_mask_params mask;
  uint8_t *is_continuation;
  /* the batch builder and the ring */
  worker prod;
  worker query; /* bl_loader_instance_at's own order, so it never races the thread */
  int32_t K;    /* ring slots (prefetch depth); 0: no thread */
  slot *ring;
  int64_t head, count, gen;
  int64_t pe, pp; /* where the producer goes on (same meaning as a state) */
  int64_t ce, cp; /* the consumer's state */
  int has_thread, stop;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t ready, space;
  bl_loader_stats stats;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The shard holding global instance g: the last shard starting at or before g
 * (as the Lua reference's search, so empty shards are skipped). */
static const bl_shard *locate(const bl_loader *l, int64_t g, int64_t *k) {
  int32_t lo = 0, hi = l->nshards - 1;
  while (lo < hi) {
    int32_t mid = (lo + hi + 1) / 2;
    if (l->starts[mid] <= g)
      lo = mid;
    else
      hi = mid - 1;
  }
  *k = g - l->starts[lo];
  return l->shards[lo];
}

static void ensure_order(const bl_loader *l, worker *w, int64_t epoch) {
  if (w->perm_epoch == epoch) return;
  bl_order_epoch(&l->order, epoch, w->perm, w->scratch);
  w->perm_epoch = epoch;
}

static void slot_clear(slot *s) {
  for (int i = 0; i < T_COUNT; i++) {
    bl_tensor_free(s->t[i]);
    s->t[i] = NULL;
  }
}

static int alloc_tensors(const bl_loader *l, int64_t S, slot *s) {
  const int64_t bs[2] = { l->B, S }, bp[2] = { l->B, l->P }, b1[1] = { l->B };
  const int64_t *shape[T_COUNT] = { bs, bs, bs, bp, bp, b1 };
  for (int i = 0; i < T_COUNT; i++) {
    int rc = bl_tensor_empty(i == T_NSP ? 1 : 2, shape[i], BL_I32, -1, &s->t[i]);
    if (rc != 0) {
      s->t[i] = NULL;
      slot_clear(s);
      return rc;
    }
  }
  return 0;
}

/* The padded sequence length (a multiple of 8) and the real tokens of step pos of epoch. */
static void batch_shape(const bl_loader *l, worker *w, int64_t epoch, int64_t pos, int64_t *S_out, int64_t *tokens) {
  ensure_order(l, w, epoch);
  int64_t S = 8;
  *tokens = 0;
  for (int64_t b = 0; b < l->B; b++) {
    int64_t L = l->lengths[w->perm[(pos * l->B + b) * l->world + l->rank]];
    if (L > S) S = L;
    *tokens += L;
  }
  *S_out = (S + 7) / 8 * 8;
}

/* Step pos of epoch written into dst[T_*]: ids, types, mask [B, S]; positions, labels [B, P]; NSP labels [B]. */
static void fill(const bl_loader *l, worker *w, int64_t epoch, int64_t pos, int64_t S, int32_t *const dst[T_COUNT]) {
  const int64_t B = l->B, P = l->P;
  int32_t *ids0 = dst[T_IDS], *types0 = dst[T_TYPES], *mask0 = dst[T_MASK];
  int32_t *mpos0 = dst[T_MPOS], *mlab0 = dst[T_MLAB], *nsp = dst[T_NSP];
  memset(ids0, 0, (size_t)(B * S) * sizeof(int32_t));
  memset(types0, 0, (size_t)(B * S) * sizeof(int32_t));
  memset(mask0, 0, (size_t)(B * S) * sizeof(int32_t));
  memset(mpos0, 0, (size_t)(B * P) * sizeof(int32_t));
  for (int64_t i = 0; i < B * P; i++) mlab0[i] = -1;
  double epoch_seed = l->dynamic ? bl_mul_add(l->seed, 1000003.0, (double)epoch) : 0;
  for (int64_t b = 0; b < B; b++) {
    int64_t gi = w->perm[(pos * B + b) * l->world + l->rank], k;
    const bl_shard *sh = locate(l, gi, &k);
    bl_shard_record r;
    bl_shard_rec(sh, k, &r);
    int32_t *ids = ids0 + b * S, *types = types0 + b * S, *mask = mask0 + b * S;
    int32_t *mpos = mpos0 + b * P, *mlab = mlab0 + b * P;
    for (int32_t i = 0; i < r.length; i++) {
      ids[i] = (int32_t)bl_shard_token(r.tokens, sh->tb, i);
      mask[i] = 1;
      types[i] = i >= r.len_a;
    }
    nsp[b] = r.next_sentence_label;
    if (l->dynamic) {
      bl_xrng rng;
      bl_xrng_seed(&rng, bl_num_to_u64(bl_mul_add(epoch_seed, 1000003.0, (double)gi)));
      memcpy(w->tok, ids, (size_t)r.length * sizeof(int32_t));
      bl_mask_sequence(&l->mask, &w->ms, &rng, w->tok, r.length, ids, mpos, mlab, (int32_t)P);
    } else {
      int64_t m = r.num_masked < P ? r.num_masked : P;
      for (int64_t j = 0; j < m; j++) {
        uint16_t p;
        memcpy(&p, r.positions + j, 2);
        mpos[j] = p;
        mlab[j] = (int32_t)bl_shard_token(r.labels, sh->tb, j);
      }
    }
  }
}

/* Step pos of epoch into new tensors in s; fails only when memory runs out
 * (shards and options were validated at open). */
static int build(const bl_loader *l, worker *w, int64_t epoch, int64_t pos, slot *s) {
  int64_t S, tokens;
  batch_shape(l, w, epoch, pos, &S, &tokens);
  int rc = alloc_tensors(l, S, s);
  if (rc != 0) return rc;
  int32_t *dst[T_COUNT];
  for (int i = 0; i < T_COUNT; i++) dst[i] = s->t[i]->data;
  fill(l, w, epoch, pos, S, dst);
  s->S = S;
  s->epoch = epoch;
  s->pos = pos;
  s->tokens = tokens;
  return 0;
}

static void *prefetch_main(void *arg) {
  bl_loader *l = arg;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    while (!l->stop && l->count == l->K) pthread_cond_wait(&l->space, &l->mu);
    if (l->stop) break;
    int64_t gen = l->gen, e = l->pe, p = l->pp;
    if (p >= l->steps) {
      e++;
      p = 0;
    }
    slot *s = &l->ring[(l->head + l->count) % l->K];
    pthread_mutex_unlock(&l->mu);
    /* the consumer never touches a slot that is not counted */
    int rc = build(l, &l->prod, e, p, s);
    if (rc != 0) snprintf(s->err, sizeof s->err, "%s", bl_last_error()); /* the message is thread-local */
    s->rc = rc;
    pthread_mutex_lock(&l->mu);
    if (gen == l->gen) {
      l->count++;
      if (rc == 0) {
        l->pe = e;
        l->pp = p + 1;
      }
      pthread_cond_signal(&l->ready);
      /* after a failure the thread waits: the consumer reports it, and retries the same step */
      while (rc != 0 && !l->stop && l->count > 0 && gen == l->gen) pthread_cond_wait(&l->space, &l->mu);
    } else {
      slot_clear(s); /* set_state moved the position: drop it */
      s->rc = 0;
    }
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* ------------------------------------------------------------------ setup */

static int worker_init(const bl_loader *l, worker *w, int with_mask) {
  w->perm_epoch = -1;
  w->perm = malloc((size_t)(l->total > 0 ? l->total : 1) * sizeof *w->perm);
  int64_t ns = bl_order_scratch_size(&l->order);
  if (ns > 0) w->scratch = malloc((size_t)ns * sizeof *w->scratch);
  if (!w->perm || (ns > 0 && !w->scratch))
    return bl_set_error(BL_ENOMEM, "loader: out of memory for the order of %lld instances", (long long)l->total);
  if (with_mask) {
    BL_CHECK(bl_mask_scratch_init(&w->ms, l->max_length));
    w->tok = malloc((size_t)(l->max_length + 1) * sizeof *w->tok);
    if (!w->tok) return bl_set_error(BL_ENOMEM, "loader: out of memory");
  }
  return 0;
}

static void worker_free(worker *w) {
  free(w->perm);
  free(w->scratch);
  free(w->tok);
  if (w->ms.idx || w->ms.covered) bl_mask_scratch_free(&w->ms);
  memset(w, 0, sizeof *w);
}

void bl_loader_close(bl_loader *l) {
  if (!l) return;
  if (l->has_thread) {
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->space);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
  }
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->ready);
  pthread_cond_destroy(&l->space);
  if (l->ring) {
    for (int32_t i = 0; i < l->K; i++) slot_clear(&l->ring[i]);
    free(l->ring);
  }
  worker_free(&l->prod);
  worker_free(&l->query);
  for (int32_t i = 0; i < l->nshards; i++) bl_shard_close(l->shards[i]);
  free(l->shards);
  free(l->starts);
  free(l->lengths);
  free(l->is_continuation);
  free(l);
}

static int check_options(const bl_loader_options *o) {
  if (o->batch_size < 1)
    return bl_set_error(BL_EINVAL, "data: batch_size must be >= 1, got %lld", (long long)o->batch_size);
  if (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size)
    return bl_set_error(BL_EINVAL, "data: rank %d is not in 0..world_size-1 (world_size %d)", o->rank, o->world_size);
  if (o->prefetch < 0 || o->prefetch > 1024)
    return bl_set_error(BL_EINVAL, "data: prefetch must be in 0..1024, got %d", o->prefetch);
  if (o->bin_window < 0) return bl_set_error(BL_EINVAL, "data: bin window must be >= 0, got %d", o->bin_window);
  if (o->max_predictions < 0 || o->max_predictions > 65535)
    return bl_set_error(BL_EINVAL, "data: max_predictions %d is out of range", o->max_predictions);
  if (o->seed != o->seed) return bl_set_error(BL_EINVAL, "data: seed is NaN");
  return 0;
}

/* Open the shards, concatenate them, collect lengths and what masking needs. */
static int open_shards(bl_loader *l, const char **paths, int32_t n, const bl_loader_options *o) {
  l->shards = calloc((size_t)n, sizeof *l->shards);
  l->starts = calloc((size_t)n, sizeof *l->starts);
  if (!l->shards || !l->starts) return bl_set_error(BL_ENOMEM, "loader: out of memory");
  bl_shard_expect ex = { .vocab_hash = o->vocab_hash,
                         .vocab_name = o->vocab_name,
                         .max_seq_length = o->max_seq_length };
  int64_t total = 0;
  int32_t P = o->max_predictions, maxlen = 0, ww = 0;
  for (int32_t i = 0; i < n; i++) {
    BL_CHECK(bl_shard_open(paths[i], &ex, &l->shards[i]));
    l->nshards = i + 1;
    const bl_shard *s = l->shards[i];
    l->starts[i] = total;
    total += s->n;
    if ((int32_t)s->h->max_predictions > P) P = (int32_t)s->h->max_predictions;
    if (s->max_length > maxlen) maxlen = s->max_length;
    if (s->h->flags & BL_SHARD_DYNAMIC_MASKING) l->dynamic = 1;
    if (s->h->flags & BL_SHARD_WHOLE_WORD) ww = 1;
    l->masked_lm_prob = s->h->masked_lm_prob; /* the last shard's, as the reference */
  }
  if (total > (int64_t)UINT32_MAX)
    return bl_set_error(BL_EUNSUPPORTED, "data: %lld instances, more than the loader's limit of 2^32-1",
                        (long long)total);
  if (P > 65535) return bl_set_error(BL_EFORMAT, "data: max_predictions %d is out of range", P);
  l->total = total;
  l->P = P;
  l->max_length = maxlen;
  l->lengths = malloc((size_t)(total > 0 ? total : 1) * sizeof *l->lengths);
  if (!l->lengths) return bl_set_error(BL_ENOMEM, "loader: out of memory for %lld lengths", (long long)total);
  for (int32_t i = 0; i < n; i++) {
    const bl_shard *s = l->shards[i];
    for (int64_t k = 0; k < s->n; k++) {
      uint16_t L;
      memcpy(&L, s->data + s->offs[k], 2);
      l->lengths[l->starts[i] + k] = L;
    }
  }
  l->whole_word = l->dynamic && ww;
  return 0;
}

static int setup_masking(bl_loader *l, const bl_loader_options *o) {
  if (!l->dynamic) return 0;
  if (o->mask_id < 0 || o->vocab_size <= 0)
    return bl_set_error(BL_EINVAL, "data: dynamic-masking shards need vocab= (for [MASK]/[CLS]/[SEP] ids)");
  l->mask = (bl_mask_params){ .cls_id = o->cls_id,
                              .sep_id = o->sep_id,
                              .mask_id = o->mask_id,
                              .vocab_size = o->vocab_size,
                              .max_predictions = l->P,
                              .masked_lm_prob = l->masked_lm_prob };
  if (l->whole_word) {
    if (!o->is_continuation)
      return bl_set_error(BL_EINVAL,
                          "data: whole-word dynamic masking needs the vocabulary's \"##\" pieces (is_continuation)");
    l->is_continuation = malloc((size_t)o->vocab_size);
    if (!l->is_continuation) return bl_set_error(BL_ENOMEM, "loader: out of memory");
    memcpy(l->is_continuation, o->is_continuation, (size_t)o->vocab_size);
    l->mask.is_continuation = l->is_continuation;
  }
  return 0;
}

static int start_thread(bl_loader *l) {
  /* the thread takes no signals: they stay with the Lua thread that handles them */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&l->thread, NULL, prefetch_main, l);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) return bl_set_error(BL_ENOMEM, "loader: cannot start the prefetch thread (error %d)", rc);
  l->has_thread = 1;
  return 0;
}

static int open_loader(bl_loader *l, const char **paths, int32_t num_paths, const bl_loader_options *o) {
  BL_CHECK(check_options(o));
  if (num_paths < 1 || !paths) return bl_set_error(BL_EINVAL, "data: no shard files given");
  BL_CHECK(open_shards(l, paths, num_paths, o));
  l->B = o->batch_size;
  l->rank = o->rank;
  l->world = o->world_size;
  l->seed = o->seed;
  l->per_rank = l->total / l->world;
  l->steps = l->per_rank / l->B;
  if (l->steps == 0)
    return bl_set_error(BL_EINVAL, "data: %lld instances are not enough for %d rank(s) x batch %lld",
                        (long long)l->total, l->world, (long long)l->B);
  if (o->bin_window > 0 && (double)o->bin_window * (double)l->B * (double)l->world >= 2147483648.0)
    return bl_set_error(BL_EINVAL, "data: a length-binning window of %d steps x %lld x %d ranks is too large",
                        o->bin_window, (long long)l->B, l->world);
  BL_CHECK(setup_masking(l, o));
  l->order = (bl_order_params){ .total = l->total,
                                .batch = l->B,
                                .world = l->world,
                                .steps = l->steps,
                                .seed = l->seed,
                                .shuffle = o->shuffle != 0,
                                .bin_window = o->bin_window,
                                .lengths = l->lengths };
  BL_CHECK(worker_init(l, &l->prod, l->dynamic));
  l->K = o->prefetch;
  if (l->K > 0) {
    l->ring = calloc((size_t)l->K, sizeof *l->ring);
    if (!l->ring) return bl_set_error(BL_ENOMEM, "loader: out of memory");
    BL_CHECK(start_thread(l));
  }
  return 0;
}

int bl_loader_open(const char **paths, int32_t num_paths, const bl_loader_options *opts, bl_loader **out) {
  if (!out || !opts) return bl_set_error(BL_EINVAL, "data: loader options and out are required");
  *out = NULL;
  bl_loader *l = calloc(1, sizeof *l);
  if (!l) return bl_set_error(BL_ENOMEM, "loader: out of memory");
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->ready, NULL);
  pthread_cond_init(&l->space, NULL);
  int rc = open_loader(l, paths, num_paths, opts);
  if (rc != 0) {
    bl_loader_close(l);
    return rc;
  }
  *out = l;
  return 0;
}

/* ------------------------------------------------------------------ use */

int bl_loader_get_info(const bl_loader *l, bl_loader_info *info) {
  if (!l || !info) return bl_set_error(BL_EINVAL, "data: loader is NULL (closed?)");
  *info = (bl_loader_info){ .total = l->total,
                            .per_rank = l->per_rank,
                            .steps_per_epoch = l->steps,
                            .max_predictions = l->P,
                            .max_length = l->max_length,
                            .dynamic = l->dynamic,
                            .whole_word = l->whole_word,
                            .num_shards = l->nshards,
                            .prefetch = l->K,
                            .masked_lm_prob = l->masked_lm_prob };
  return 0;
}

static void hand_over(bl_loader *l, slot *s, bl_loader_batch *out) {
  out->input_ids = s->t[T_IDS];
  out->token_type_ids = s->t[T_TYPES];
  out->attention_mask = s->t[T_MASK];
  out->masked_lm_positions = s->t[T_MPOS];
  out->masked_lm_labels = s->t[T_MLAB];
  out->next_sentence_labels = s->t[T_NSP];
  for (int i = 0; i < T_COUNT; i++) s->t[i] = NULL;
  out->epoch = s->epoch;
  out->pos = s->pos;
  out->tokens = s->tokens;
  l->ce = s->epoch;
  l->cp = s->pos + 1;
  l->stats.batches++;
  l->stats.tokens += s->tokens;
  l->stats.padded += l->B * s->S;
}

int bl_loader_next(bl_loader *l, bl_loader_batch *out) {
  if (!l || !out) return bl_set_error(BL_EINVAL, "data: next on a NULL loader (closed?)");
  if (!l->has_thread) {
    int64_t e = l->ce, p = l->cp;
    if (p >= l->steps) {
      e++;
      p = 0;
    }
    slot s;
    memset(&s, 0, sizeof s);
    BL_CHECK(build(l, &l->prod, e, p, &s));
    hand_over(l, &s, out);
    return 0;
  }
  pthread_mutex_lock(&l->mu);
  if (l->count == 0) {
    double t0 = now_s();
    l->stats.waits++;
    while (l->count == 0) pthread_cond_wait(&l->ready, &l->mu);
    l->stats.wait_seconds += now_s() - t0;
  }
  slot *s = &l->ring[l->head];
  int rc = s->rc;
  if (rc != 0) {
    /* drop the failed slot; the thread goes on from the same step */
    bl_set_error(rc, "%s", s->err);
    s->rc = 0;
    l->count = 0;
    pthread_cond_signal(&l->space);
    pthread_mutex_unlock(&l->mu);
    return rc;
  }
  hand_over(l, s, out);
  l->head = (l->head + 1) % l->K;
  l->count--;
  pthread_cond_signal(&l->space);
  pthread_mutex_unlock(&l->mu);
  return 0;
}

/* The prefetch thread ends and what it prepared is dropped; the consumer's position stays. */
static void stop_thread(bl_loader *l) {
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_broadcast(&l->space);
  pthread_mutex_unlock(&l->mu);
  pthread_join(l->thread, NULL);
  l->has_thread = 0;
  for (int32_t i = 0; i < l->K; i++) slot_clear(&l->ring[i]);
  l->count = 0;
}

int bl_loader_next_into(bl_loader *l, int32_t *const dst[3], int64_t max_S, int64_t *S_out, bl_loader_batch *out) {
  if (!l || !dst || !S_out || !out) return bl_set_error(BL_EINVAL, "data: next_into on a NULL loader or buffer");
  if (l->has_thread) stop_thread(l);
  int64_t e = l->ce, p = l->cp, S, tokens;
  if (p >= l->steps) {
    e++;
    p = 0;
  }
  batch_shape(l, &l->prod, e, p, &S, &tokens);
  if (S > max_S)
    return bl_set_error(BL_EINVAL, "data: next_into: a batch of sequence length %lld does not fit buffers of %lld",
                        (long long)S, (long long)max_S);
  slot s;
  memset(&s, 0, sizeof s);
  const int64_t bp[2] = { l->B, l->P }, b1[1] = { l->B };
  int rc = bl_tensor_empty(2, bp, BL_I32, -1, &s.t[T_MPOS]);
  if (!rc) rc = bl_tensor_empty(2, bp, BL_I32, -1, &s.t[T_MLAB]);
  if (!rc) rc = bl_tensor_empty(1, b1, BL_I32, -1, &s.t[T_NSP]);
  if (rc) {
    slot_clear(&s);
    return rc;
  }
  int32_t *ptr[T_COUNT] = { dst[0], dst[1], dst[2], s.t[T_MPOS]->data, s.t[T_MLAB]->data, s.t[T_NSP]->data };
  fill(l, &l->prod, e, p, S, ptr);
  s.S = S;
  s.epoch = e;
  s.pos = p;
  s.tokens = tokens;
  hand_over(l, &s, out);
  *S_out = S;
  return 0;
}

int bl_loader_get_state(const bl_loader *l, int64_t *epoch, int64_t *pos) {
  if (!l || !epoch || !pos) return bl_set_error(BL_EINVAL, "data: state of a NULL loader (closed?)");
  *epoch = l->ce;
  *pos = l->cp;
  return 0;
}

int bl_loader_set_state(bl_loader *l, int64_t epoch, int64_t pos) {
  if (!l) return bl_set_error(BL_EINVAL, "data: set_state on a NULL loader (closed?)");
  if (epoch < 0 || pos < 0 || pos > l->steps)
    return bl_set_error(BL_EINVAL, "data: loader state epoch %lld pos %lld is out of range (%lld steps per epoch)",
                        (long long)epoch, (long long)pos, (long long)l->steps);
  pthread_mutex_lock(&l->mu);
  l->gen++;                                /* a batch being built now is dropped when it is done */
  for (int64_t i = 0; i < l->count; i++) { /* and what was prefetched is discarded */
    slot *s = &l->ring[(l->head + i) % l->K];
    slot_clear(s);
    s->rc = 0;
  }
  l->count = 0;
  l->pe = l->ce = epoch;
  l->pp = l->cp = pos;
  pthread_cond_signal(&l->space);
  pthread_mutex_unlock(&l->mu);
  return 0;
}

int bl_loader_get_stats(const bl_loader *l, bl_loader_stats *st) {
  if (!l || !st) return bl_set_error(BL_EINVAL, "data: stats of a NULL loader (closed?)");
  *st = l->stats;
  return 0;
}

int bl_loader_instance_at(bl_loader *l, int64_t epoch, int64_t pos, int64_t b, int64_t *index) {
  if (!l || !index) return bl_set_error(BL_EINVAL, "data: instance_at on a NULL loader (closed?)");
  if (epoch < 0 || pos < 0 || pos >= l->steps || b < 0 || b >= l->B)
    return bl_set_error(BL_EINVAL, "data: instance_at(%lld, %lld, %lld) is out of range", (long long)epoch,
                        (long long)pos, (long long)b);
  if (!l->query.perm) {
    int rc = worker_init(l, &l->query, 0);
    if (rc != 0) {
      worker_free(&l->query);
      return rc;
    }
  }
  ensure_order(l, &l->query, epoch);
  *index = l->query.perm[(pos * l->B + b) * l->world + l->rank];
  return 0;
}
