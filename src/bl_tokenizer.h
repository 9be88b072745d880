/* bertlua — WordPiece tokenizer, exact to google-research/bert tokenization.py
 * (the reference NVIDIA's BERT recipes use) and to Hugging Face `tokenizers`
 * (Rust BertNormalizer + BertPreTokenizer + WordPiece), plus one addition they
 * share with transformers' slow BertTokenizer: special tokens ([PAD] [UNK]
 * [CLS] [SEP] [MASK]) are never split.
 * Where transformers' Python BertTokenizer differs: since 4.x it NFC-normalizes
 * the text before the whitespace split. That changes nothing uncased (NFD
 * follows), but cased it composes decomposed text: "a" + U+0301 gives "á"
 * there and "a ##\u0301" here, in Google's code and in `tokenizers`
 * (tests/lua/test_tokenizer.lua checks all three).
 *
 * Pipeline for a text (UTF-8 bytes, not NUL-terminated):
 *   1. special tokens found verbatim (case-sensitive) in the raw text are cut
 *      out and emitted whole; the text between them is tokenized separately;
 *   2. invalid UTF-8: every maximal invalid subpart is replaced by U+FFFD like
 *      Python's bytes.decode("utf-8", "replace") and is then removed by the
 *      cleaning step below (so it joins its neighbours, it does not split a
 *      word); the number of replaced sequences is reported;
 *   3. cleaning: NUL, U+FFFD and every category C* code point except \t \n \r
 *      are dropped; \t \n \r, space, category Zs, U+2028 and U+2029 separate words;
 *   4. CJK ideographs (the reference _is_chinese_char ranges) become words of
 *      their own;
 *   5. uncased: per-code-point lowercasing like Python's str.lower() (the
 *      slow tokenizer lowercases one character at a time, so no final-sigma
 *      rule), NFD, category Mn dropped; cased: no normalization at all;
 *   6. punctuation (ASCII 33-47, 58-64, 91-96, 123-126 and category P*) is
 *      split off as one-character tokens -> "basic tokens";
 *   7. WordPiece: greedy longest-match-first with "##" continuations; a basic
 *      token longer than 100 code points, or with any unmatchable rest, is [UNK].
 * Character properties come from libutf8proc (its Unicode version; Python's
 * unicodedata may be one version older, which only matters for code points
 * assigned in between).
 *
 * A loaded tokenizer is read-only: any number of threads may encode with it
 * concurrently. Encoding is one pass over the bytes with no per-token
 * allocation (scratch is on the stack; only a normalization run of more than
 * 256 combining code points uses the heap).
 */
#ifndef BL_TOKENIZER_H
#define BL_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* BL_CDEF_BEGIN */
typedef struct bl_tokenizer bl_tokenizer;

/* Everything one encode call can return. Each array pointer may be NULL (not
 * wanted); non-NULL arrays have room for `cap` entries. On return `n` is the
 * total number of WordPiece tokens even when it exceeds cap (then only the
 * first cap entries were written: call again with a bigger buffer). */
typedef struct bl_tok_result {
  int32_t *ids;   /* WordPiece ids */
  int32_t *word;  /* index (0-based) of the basic token each piece came from */
  int64_t *start; /* byte offset in the input where that basic token starts */
  int64_t *end;   /* byte offset just past that basic token's last input byte */
  int cap;
  int n;                /* out: WordPiece tokens */
  int n_words;          /* out: basic tokens (special tokens count as one) */
  int64_t invalid_utf8; /* out: invalid UTF-8 sequences that were replaced (and dropped) */
} bl_tok_result;

/* Loads vocab.txt (one token per line, id = 0-based line index, LF, CRLF or CR
 * line ends, UTF-8). lower_case = 1 for uncased models. Fails with BL_EIO
 * (cannot read), BL_EFORMAT (empty, invalid UTF-8, NUL byte, or missing one of
 * [PAD] [UNK] [CLS] [SEP] [MASK]), each message naming the file. */
int bl_tokenizer_load(const char *vocab_path, int lower_case, bl_tokenizer **out);
void bl_tokenizer_free(bl_tokenizer *tok);

int bl_tokenizer_vocab_size(const bl_tokenizer *tok);
int bl_tokenizer_lower_case(const bl_tokenizer *tok);
/* id of a token string (exact match), or -1 when it is not in the vocab */
int bl_tokenizer_id(const bl_tokenizer *tok, const char *token);
int bl_tokenizer_id_n(const bl_tokenizer *tok, const char *token, size_t len);
/* token string of an id (NUL-terminated, owned by tok), NULL when out of range */
const char *bl_tokenizer_token(const bl_tokenizer *tok, int id);
/* ids of the special tokens: which = 0 [PAD], 1 [UNK], 2 [CLS], 3 [SEP], 4 [MASK] */
int bl_tokenizer_special_id(const bl_tokenizer *tok, int which);

/* text -> WordPiece ids (no [CLS]/[SEP] added). *n = number of ids, which may
 * exceed cap (only cap written). len must be < 2^31. */
int bl_tokenizer_encode(const bl_tokenizer *tok, const char *text, size_t len, int32_t *ids, int cap, int *n);
/* the same with basic-token indices and byte offsets (see bl_tok_result) */
int bl_tokenizer_encode_full(const bl_tokenizer *tok, const char *text, size_t len, bl_tok_result *res);
/* WordPiece alone on one already-normalized word (no cleaning, no splitting):
 * its pieces' ids, or the [UNK] id. */
int bl_tokenizer_wordpiece(const bl_tokenizer *tok, const char *word, size_t len, int32_t *ids, int cap, int *n);

/* Text output, one line per input line ('\n'-separated; a last line without
 * '\n' still gets one): mode 0 = WordPiece tokens, 1 = ids, 2 = basic tokens,
 * separated by single spaces, each line ended by '\n'. Writes at most cap
 * bytes to out; *need = bytes the whole output takes (if > cap, nothing
 * useful was written: grow and call again). invalid_utf8 may be NULL. */
int bl_tokenizer_format(const bl_tokenizer *tok, const char *text, size_t len, int mode, char *out, size_t cap,
                        size_t *need, int64_t *invalid_utf8);
/* BL_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif
