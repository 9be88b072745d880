/* Dynamic masked-LM masking of one sequence, step for step the algorithm of
 * pretraining_data.mask in Lua (which follows google-research/bert), drawing
 * the same random numbers in the same order, so both give the same masks. */
#include <stdlib.h>

#include "data_internal.h"

int bl_mask_scratch_init(bl_mask_scratch *s, int64_t max_len) {
  memset(s, 0, sizeof *s);
  size_t n = (size_t)(max_len > 0 ? max_len : 1) + 1;
  s->idx = malloc(n * sizeof *s->idx);
  s->gstart = malloc(n * sizeof *s->gstart);
  s->gorder = malloc(n * sizeof *s->gorder);
  s->covered = malloc(n);
  s->cap = (int64_t)n - 1;
  if (!s->idx || !s->gstart || !s->gorder || !s->covered) {
    bl_mask_scratch_free(s);
    return bl_set_error(BL_ENOMEM, "loader: out of memory for the masking scratch");
  }
  return 0;
}

void bl_mask_scratch_free(bl_mask_scratch *s) {
  free(s->idx);
  free(s->gstart);
  free(s->gorder);
  free(s->covered);
  memset(s, 0, sizeof *s);
}

int32_t bl_mask_sequence(const bl_mask_params *p, bl_mask_scratch *s, bl_xrng *r, const int32_t *tokens, int32_t L,
                         int32_t *out, int32_t *pos, int32_t *lab, int32_t P) {
  /* candidate groups: single tokens, or a word and its "##" pieces */
  int32_t nidx = 0, ng = 0;
  for (int32_t i = 0; i < L; i++) {
    int32_t id = tokens[i];
    if (id == p->cls_id || id == p->sep_id) continue;
    int cont = p->is_continuation && ng > 0 && id >= 0 && id < p->vocab_size && p->is_continuation[id];
    if (!cont) s->gstart[ng++] = nidx;
    s->idx[nidx++] = i;
  }
  s->gstart[ng] = nidx;
  for (int32_t g = 0; g < ng; g++) s->gorder[g] = g;
  for (int32_t i = ng - 1; i >= 1; i--) {
    int32_t j = (int32_t)bl_xrng_int1(r, i + 1) - 1;
    int32_t t = s->gorder[i];
    s->gorder[i] = s->gorder[j];
    s->gorder[j] = t;
  }
  memcpy(out, tokens, (size_t)L * sizeof *out);
  memset(s->covered, 0, (size_t)L);
  int64_t want = (int64_t)floor(bl_mul_add((double)L, p->masked_lm_prob, 0.5));
  if (want < 1) want = 1;
  if (want > p->max_predictions) want = p->max_predictions;
  int64_t nlms = 0;
  for (int32_t k = 0; k < ng && nlms < want; k++) {
    int32_t g = s->gorder[k];
    int32_t a = s->gstart[g], b = s->gstart[g + 1];
    if (nlms + (b - a) > want) continue;
    int hit = 0;
    for (int32_t t = a; t < b; t++) hit |= s->covered[s->idx[t]];
    if (hit) continue;
    for (int32_t t = a; t < b; t++) {
      int32_t i = s->idx[t];
      s->covered[i] = 1;
      int32_t m;
      if (bl_xrng_unit(r) < 0.8)
        m = p->mask_id;
      else if (bl_xrng_unit(r) < 0.5)
        m = tokens[i];
      else
        m = (int32_t)(bl_xrng_int1(r, p->vocab_size) - 1);
      out[i] = m;
      nlms++;
    }
  }
  /* the masked positions in increasing order, as the reference sorts them */
  int32_t n = 0;
  for (int32_t i = 0; i < L; i++) {
    if (!s->covered[i]) continue;
    if (n < P) {
      pos[n] = i;
      lab[n] = tokens[i];
    }
    n++;
  }
  return n;
}
