/* Internal to src/text: the loaded vocabulary and its hash tables, shared by
 * vocab.c (loading, lookups) and wordpiece.c (encoding). */
#ifndef BL_TEXT_INTERNAL_H
#define BL_TEXT_INTERNAL_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define BL_TOK_MAX_WORD_CHARS 100 /* the reference max_input_chars_per_word */
#define BL_TOK_NUM_SPECIAL    5   /* [PAD] [UNK] [CLS] [SEP] [MASK] */

/* Open addressing, linear probing; a slot holds the full 32-bit hash next to
 * the id so that a probe rarely touches the token bytes. id < 0 = empty. */
typedef struct bl_tok_slot {
  uint32_t hash;
  int32_t id;
} bl_tok_slot;

typedef struct bl_tok_table {
  bl_tok_slot *slots;
  uint32_t mask;
  int max_len; /* longest key in bytes: bounds the greedy search */
} bl_tok_table;

struct bl_tokenizer {
  char *blob;    /* all tokens, each NUL-terminated */
  uint32_t *off; /* token id -> offset in blob */
  uint32_t *len; /* token id -> length in bytes */
  int size;
  int lower;
  bl_tok_table full; /* whole token -> id (last duplicate wins, like HF) */
  bl_tok_table cont; /* "##rest" tokens keyed by rest */
  int special[BL_TOK_NUM_SPECIAL];
  char path[256];
};

extern const char *const bl_tok_special_names[BL_TOK_NUM_SPECIAL];

static inline uint32_t bl_tok_hash(const char *s, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, s, 8);
    h = (h ^ v) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
    s += 8;
    n -= 8;
  }
  uint64_t v = 0;
  memcpy(&v, s, n);
  h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 29;
  h *= 0x94d049bb133111ebull;
  return (uint32_t)(h >> 32);
}

/* keys of `cont` are stored in the blob 2 bytes after the token's start */
static inline int bl_tok_lookup(const struct bl_tokenizer *t, const bl_tok_table *tab, int skip, const char *s,
                                size_t n) {
  uint32_t h = bl_tok_hash(s, n);
  for (uint32_t i = h & tab->mask;; i = (i + 1) & tab->mask) {
    const bl_tok_slot *sl = &tab->slots[i];
    if (sl->id < 0) return -1;
    if (sl->hash == h && t->len[sl->id] - (uint32_t)skip == n && memcmp(t->blob + t->off[sl->id] + skip, s, n) == 0)
      return sl->id;
  }
}
#endif
