/* bertlua — pre-training shards and the batch loader (lua/bertlua/data/loader.lua
 * wraps this as loader.Loader).
 *
 * Shard file format BLSHARD1, version 1 (little-endian; written atomically by
 * bl_shard_writer below):
 *   header, 80 bytes:
 *     char     magic[8]        "BLSHARD1"
 *     uint32   version         1
 *     uint32   header_bytes    80
 *     uint64   vocab_hash      FNV-1a 64 of the vocab file's bytes
 *     uint32   vocab_size
 *     uint32   max_seq_length
 *     uint32   max_predictions
 *     uint32   flags           1 = dynamic masking (no masks stored), 2 = whole-word masking
 *     float32  masked_lm_prob
 *     uint32   token_bytes     2 when vocab_size <= 65535, else 4
 *     uint64   seed
 *     uint64   num_instances   N
 *     uint64   data_bytes      bytes after the offsets table
 *     uint64   checksum        FNV-1a 64 of the offsets table and the data
 *   uint64 offsets[N + 1]      record k is data[offsets[k], offsets[k+1])
 *   records:
 *     uint16 length L, uint16 len_a (tokens of "[CLS] A [SEP]"), uint16 M (masked),
 *     uint8 next_sentence_label (1 = B is a random sentence), uint8 reserved,
 *     token ids[L] (token_bytes each, masks applied), uint16 positions[M], labels[M] (token_bytes each)
 *
 * bl_shard_open memory-maps a file and refuses it (BL_EFORMAT, message
 * "shard PATH: what failed") unless: the size covers the header; magic,
 * version, header size and token width are right; header + offsets + data
 * bytes equal the file size; offsets are non-decreasing and within the data;
 * the FNV-1a checksum matches; every record fits its slot, has
 * 1 <= L <= max_seq_length of its header, len_a <= L, M <= L, positions < L,
 * token ids and labels < vocab_size; and, when asked, the vocabulary hash and
 * a maximum sequence length match. After that nothing is read out of bounds.
 *
 * The loader (bl_loader_open) opens a list of shards as one dataset of
 * `total` instances and serves batches for rank r of W:
 *   - epoch e is a permutation of all instances: the identity when shuffle is
 *     off, otherwise a Fisher-Yates shuffle with the generator below seeded
 *     by seed*1000003 + e;
 *   - step p of rank r takes entries (p*B + b)*W + r, b = 0..B-1, of it, so
 *     ranks are disjoint and all ranks of a step read one contiguous block of
 *     B*W entries; steps_per_epoch = floor(floor(total / W) / B) (the rest of
 *     the epoch is dropped so every rank runs the same number of steps);
 *   - length binning (bin_window = K > 0): the used part of the permutation is
 *     cut into windows of K steps (K*B*W entries), each window is sorted by
 *     sequence length (ties by permutation order) and its K step blocks are
 *     shuffled (seeded by seed and epoch), so a batch holds sequences of
 *     similar length and pads less, each instance is still seen once per
 *     epoch, and the order is a function of (seed, epoch, B, W, K) only;
 *   - dynamic masking (shards with flag 1): instance i of epoch e is masked with
 *     the rng seeded by (seed*1000003 + e)*1000003 + i, by the algorithm of
 *     bertlua.data.pretraining.mask (15% of tokens, capped; never [CLS]/[SEP];
 *     80% [MASK] / 10% unchanged / 10% random; whole words when the shard
 *     has flag 2 and is_continuation is given). The seed arithmetic is done in
 *     double, as the Lua reference does it, so both give the same bits.
 * A batch is padded to its longest sequence rounded up to a multiple of 8
 * (at least 8): input_ids, token_type_ids, attention_mask int32 [B, S],
 * masked_lm_positions int32 [B, P] (0 padded), masked_lm_labels int32 [B, P]
 * (-1 padded), next_sentence_labels int32 [B]; P = max(max_predictions, the
 * shards' max_predictions).
 *
 * The generator (bl_xrng; Lua: bertlua.util.rng) is xorshift64*: state
 * s = 0x9E3779B97F4A7C15 + seed * 0x100000001B3 (mod 2^64); a draw does
 * s ^= s >> 12, s ^= s << 25, s ^= s >> 27 and returns
 * ((s * 0x2545F4914F6CDD1D mod 2^64) >> 11) / 2^53, a double in [0, 1);
 * an integer in 1..n is floor(draw * n) + 1.
 *
 * Prefetch: with prefetch = K > 0 a thread builds the next K batches, each in
 * its own new CPU tensors, into a ring; bl_loader_next hands the oldest over
 * (no copy; the caller owns and frees them). prefetch = 0 builds on the call.
 * The position (epoch, pos) is that of the consumer, not of the thread:
 * bl_loader_set_state discards what was prefetched, and bl_loader_close joins
 * the thread. One loader is driven from one thread at a time.
 */
#ifndef BL_LOADER_H
#define BL_LOADER_H
#include "bl_base.h"
#include "bl_tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* BL_CDEF_BEGIN */
typedef struct bl_shard_header {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t vocab_hash;
  uint32_t vocab_size;
  uint32_t max_seq_length;
  uint32_t max_predictions;
  uint32_t flags;
  float masked_lm_prob;
  uint32_t token_bytes;
  uint64_t seed;
  uint64_t num_instances;
  uint64_t data_bytes;
  uint64_t checksum;
} bl_shard_header;

enum { BL_SHARD_DYNAMIC_MASKING = 1, BL_SHARD_WHOLE_WORD = 2 };

typedef struct bl_shard bl_shard;

/* What the caller expects of a shard; zero fields are not checked. */
typedef struct bl_shard_expect {
  uint64_t vocab_hash;
  const char *vocab_name; /* named when the hash differs */
  int32_t max_seq_length;
  int32_t pad_;
} bl_shard_expect;

/* One record; pointers into the mapping, valid until bl_shard_close. */
typedef struct bl_shard_record {
  int32_t length, len_a, num_masked, next_sentence_label;
  const void *tokens;        /* length ids, token_bytes each */
  const uint16_t *positions; /* num_masked */
  const void *labels;        /* num_masked ids, token_bytes each */
} bl_shard_record;

int bl_shard_open(const char *path, const bl_shard_expect *expect, bl_shard **out);
const bl_shard_header *bl_shard_get_header(const bl_shard *s);
int64_t bl_shard_count(const bl_shard *s);
int bl_shard_get_record(const bl_shard *s, int64_t k, bl_shard_record *rec); /* k 0-based */
void bl_shard_close(bl_shard *s);

/* bl_shard_writer: builds a BLSHARD1 file in memory and publishes it through
 * the checked atomic writer (bl_stream.h) on commit, so the file is whole or
 * absent. `meta` gives vocab_hash, vocab_size, max_seq_length,
 * max_predictions, flags, masked_lm_prob and seed; the writer fills magic,
 * version, header_bytes, token_bytes (2 when vocab_size <= 65535, else 4),
 * num_instances, data_bytes and checksum. bl_shard_writer_add appends one
 * record (token ids, then positions and labels of the num_masked masked
 * tokens) and refuses one the reader would refuse (length 0 or above
 * max_seq_length or 65535, len_a > length, num_masked > length, a position
 * >= length, an id or label >= vocab_size), naming the file and the record.
 * commit and abort free the writer, whether commit succeeds or not. */
typedef struct bl_shard_writer bl_shard_writer;
int bl_shard_writer_open(const char *path, const bl_shard_header *meta, bl_shard_writer **res);
int bl_shard_writer_add(bl_shard_writer *w, int32_t length, int32_t len_a, int32_t next_sentence_label,
                        const int32_t *tokens, int32_t num_masked, const int32_t *positions, const int32_t *labels);
int bl_shard_writer_commit(bl_shard_writer *w);
void bl_shard_writer_abort(bl_shard_writer *w);

typedef struct bl_loader bl_loader;

typedef struct bl_loader_options {
  int64_t batch_size;
  int32_t rank, world_size;
  double seed;             /* a number, as Lua has it: seeds are derived in double */
  int32_t shuffle;         /* 0: every epoch in file order */
  int32_t max_seq_length;  /* shards holding longer sequences are refused; 0: no check */
  int32_t max_predictions; /* masked slots per sequence (at least the shards') */
  int32_t prefetch;        /* batches prepared ahead on a thread; 0: no thread */
  int32_t bin_window;      /* length binning over this many steps; 0: off */
  int32_t pad_;
  uint64_t vocab_hash; /* 0: not checked */
  const char *vocab_name;
  /* dynamic masking (needed only when a shard has BL_SHARD_DYNAMIC_MASKING) */
  int32_t cls_id, sep_id, mask_id, vocab_size; /* mask_id < 0: no vocabulary given */
  const uint8_t *is_continuation;              /* [vocab_size] 1 for "##" pieces, or NULL; copied */
} bl_loader_options;

typedef struct bl_loader_info {
  int64_t total;    /* instances in all shards */
  int64_t per_rank; /* floor(total / world_size) */
  int64_t steps_per_epoch;
  int32_t max_predictions; /* P */
  int32_t max_length;      /* longest sequence in the shards */
  int32_t dynamic;         /* 1 when masks are drawn by the loader */
  int32_t whole_word;      /* 1 when dynamic masks cover whole words */
  int32_t num_shards;
  int32_t prefetch;
  double masked_lm_prob;
} bl_loader_info;

typedef struct bl_loader_batch {
  bl_tensor *input_ids, *token_type_ids, *attention_mask; /* int32 [B, S] */
  bl_tensor *masked_lm_positions, *masked_lm_labels;      /* int32 [B, P] */
  bl_tensor *next_sentence_labels;                        /* int32 [B] */
  int64_t epoch, pos;                                     /* where this batch is in the epoch order (pos 0-based) */
  int64_t tokens;                                         /* real (unpadded) tokens in the batch */
} bl_loader_batch;

typedef struct bl_loader_stats {
  int64_t batches;        /* returned by bl_loader_next */
  int64_t waits;          /* times bl_loader_next found no batch ready */
  double wait_seconds;    /* time spent waiting for the prefetch thread */
  int64_t tokens, padded; /* real tokens and B*S summed over returned batches */
} bl_loader_stats;

int bl_loader_open(const char **paths, int32_t num_paths, const bl_loader_options *opts, bl_loader **out);
int bl_loader_get_info(const bl_loader *l, bl_loader_info *info);
/* The next batch; starts the next epoch transparently. The tensors are the
 * caller's (bl_tensor_free). Fails only when memory runs out; the same step is
 * then tried again by the next call. */
int bl_loader_next(bl_loader *l, bl_loader_batch *out);
/* The next batch built on the call with its ids, token types and attention mask written straight into the
 * caller's buffers dst[0..2] (each at least B x max_S int32s; the batch's [B, S] packed at their start, S in
 * *S_out; a longer batch is an error), e.g. a GPU feeder's pinned memory: no batch in ordinary memory copied
 * again. out gets the positions, labels and NSP labels as new CPU tensors (the caller's) and the other three
 * NULL. A prefetch thread is stopped at the first call (what it prepared is dropped; the position stays). */
int bl_loader_next_into(bl_loader *l, int32_t *const dst[3], int64_t max_S, int64_t *S_out, bl_loader_batch *out);
/* (epoch, pos): the batch the next call returns is step pos of epoch epoch
 * (pos == steps_per_epoch means the first step of epoch + 1). */
int bl_loader_get_state(const bl_loader *l, int64_t *epoch, int64_t *pos);
int bl_loader_set_state(bl_loader *l, int64_t epoch, int64_t pos);
int bl_loader_get_stats(const bl_loader *l, bl_loader_stats *st);
/* Instance index (into the concatenated shards) of row b of step pos of epoch
 * epoch for this loader's rank: the order, for tests and tools. */
int bl_loader_instance_at(bl_loader *l, int64_t epoch, int64_t pos, int64_t b, int64_t *index);
void bl_loader_close(bl_loader *l); /* joins the thread, unmaps the shards; NULL is fine */

/* Input pipeline to a GPU (src/data/feeder.c). Two slots, each with pinned
 * host buffers and device buffers for the largest batch ([B, max_seq] rounded
 * up to 8, [B, P], [B]), made by bl_feeder_new: no allocation per batch.
 * put copies a loader batch (CPU int32 tensors; the caller still owns them)
 * into the free slot's pinned buffers and queues its host-to-device copies
 * on the device's copy stream, then records the slot's event; get hands the
 * oldest slot out as device tensors of the batch's own shape (new headers
 * over the slot's buffers, for the caller to free) after making the compute
 * stream wait for that event. So the next batch's copy runs while the
 * current step computes, and nothing waits on the host. A slot's tensors
 * stay valid until the second put after the get that handed them out (the
 * copy into a slot waits for the compute stream to finish the step that read
 * it). put needs a free slot (at most 2 batches in flight); get one in
 * flight. drop forgets what is in flight (after the loader's position moves). */
typedef struct bl_feeder bl_feeder;
int bl_feeder_new(int device, int64_t batch_size, int32_t max_seq_length, int32_t max_predictions, bl_feeder **res);
int bl_feeder_put(bl_feeder *f, const bl_loader_batch *b);
/* put with the loader's next batch built straight into the free slot's pinned buffers (bl_loader_next_into):
 * host receives its positions, labels and NSP labels as CPU tensors (the caller's); only those small fields are
 * copied into pinned memory. */
int bl_feeder_put_next(bl_feeder *f, bl_loader *l, bl_loader_batch *host);
/* Bytes copied from ordinary memory into the pinned buffers by put and put_next so far. */
int64_t bl_feeder_staged_bytes(const bl_feeder *f);
int bl_feeder_get(bl_feeder *f, bl_loader_batch *out);
int bl_feeder_in_flight(const bl_feeder *f);
void bl_feeder_drop(bl_feeder *f);
void bl_feeder_free(bl_feeder *f);
/* Any batch to a GPU the same way (src/data/feeder.c): evaluation and prediction batches, whose fields and shapes
 * are the caller's. put copies up to BL_STAGER_FIELDS contiguous CPU tensors into the free slot's pinned buffers
 * and queues their host-to-device copies on the copy stream; get hands the oldest slot out as device tensors of
 * the same shapes and dtypes (new headers, the caller's to free) after making the compute stream wait for the
 * copies. A slot's buffers grow to the largest batch put in it (an allocation then, none while batches fit);
 * its tensors stay valid until the second put after the get that handed them out. At most 2 batches in flight. */
enum { BL_STAGER_FIELDS = 8 };
typedef struct bl_stager bl_stager;
int bl_stager_new(int device, bl_stager **res);
int bl_stager_put(bl_stager *st, int n, bl_tensor *const *fields);
int bl_stager_get(bl_stager *st, int n, bl_tensor **out);
int bl_stager_in_flight(const bl_stager *st);
void bl_stager_free(bl_stager *st);
/* BL_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif
