/* torch.save reader: zip archive (torch_zip.c) or the legacy stream + a pickle VM that can only build state dicts.
 *
 * The pickle (ARCHIVE/data.pkl) runs on a VM with
 * no code execution at all: values are plain data (None, bool, int, float,
 * str, bytes, tuple, list, dict) plus storages and tensors, and the only
 * globals it resolves are those torch writes for tensors and state dicts;
 * any other global is refused by name when the pickle mentions it. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "torch_zip.h"

#define WHAT             TZIP_WHAT
#define MAX_PICKLE_BYTES (256ll << 20)
#define MAX_VALUES       (4 << 20)
#define MAX_MEMO         (4 << 20)
#define MAX_NAME         1024
#define MAX_DEPTH        200

/* ------------------------------------------------------------------ pickle values */
enum { V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_BYTES, V_TUPLE, V_LIST, V_DICT, V_GLOBAL, V_STORAGE, V_TENSOR, V_MARK };
enum { G_ORDERED_DICT, G_REBUILD_V2, G_REBUILD, G_REBUILD_PARAM, G_STORAGE };

typedef struct val val;
struct val {
  int type;
  int seen; /* containers, while collecting tensors */
  val *next_alloc;
  int64_t i; /* int, bool; global id; storage: numel */
  double f;
  char *s; /* str/bytes (NUL-terminated copy) */
  size_t slen;
  val **items; /* tuple/list items; dict keys and values interleaved */
  size_t n, cap;
  /* global storage type / storage / tensor */
  int dtype, esize;
  const char *dtname;
  int64_t data_off, data_len; /* storage: its zip entry's bytes */
  uint32_t crc;
  val *storage; /* tensor */
  int64_t off;
  int ndim;
  int64_t shape[BL_MAX_DIMS], stride[BL_MAX_DIMS];
};

typedef struct {
  zip_reader *z;
  const uint8_t *p, *end, *start;
  val **stack;
  size_t sn, scap;
  size_t *marks;
  size_t mn, mcap;
  val **memo;
  size_t memo_cap; /* slots allocated */
  size_t memo_len; /* entries stored: where MEMOIZE stores next, as Python's len(memo) */
  val *all;
  int64_t nvals;
  char where[80]; /* "archive/data.pkl", or "pickle" in the legacy format */
  int legacy;
  val **storages; /* legacy: storages by first reference, bound to the file after the key list */
  size_t ns, nscap;
  char name[MAX_NAME];
} vm;

static int perr(vm *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(vm *m, const char *fmt, ...) {
  char path[600]; /* the pickle and the position in it name the place */
  snprintf(path, sizeof path, "%s: %s at byte %lld", m->z->c->path, m->where, (long long)(m->p - m->start));
  va_list ap;
  va_start(ap, fmt);
  int rc = bl_ckpt_vfail_(WHAT, path, fmt, ap);
  va_end(ap);
  return rc;
}

static val *new_val(vm *m, int type) {
  if (m->nvals >= MAX_VALUES) {
    perr(m, "more than %d objects: not a state dict", MAX_VALUES);
    return NULL;
  }
  val *v = calloc(1, sizeof *v);
  if (!v) {
    bl_set_error(BL_ENOMEM, WHAT ": out of memory");
    return NULL;
  }
  v->type = type;
  v->next_alloc = m->all;
  m->all = v;
  m->nvals++;
  return v;
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap * 2 : 16;
  while (nc < need) nc *= 2;
  void *a = realloc(*arr, nc * elem);
  if (!a) return bl_set_error(BL_ENOMEM, WHAT ": out of memory");
  *arr = a;
  *cap = nc;
  return 0;
}

static int push(vm *m, val *v) {
  if (!v) return BL_EFORMAT;
  BL_CHECK(grow((void **)&m->stack, &m->scap, m->sn + 1, sizeof *m->stack));
  m->stack[m->sn++] = v;
  return 0;
}

static val *pop(vm *m) {
  if (m->sn == 0 || (m->mn && m->sn <= m->marks[m->mn - 1]) || m->stack[m->sn - 1]->type == V_MARK) {
    perr(m, "stack underflow");
    return NULL;
  }
  return m->stack[--m->sn];
}

static int append(val *c, val *v) {
  BL_CHECK(grow((void **)&c->items, &c->cap, c->n + 1, sizeof *c->items));
  c->items[c->n++] = v;
  return 0;
}

/* items above the newest mark into a new container of type t; pops the mark */
static val *pop_mark(vm *m, int t) {
  if (m->mn == 0) {
    perr(m, "no MARK on the stack");
    return NULL;
  }
  size_t from = m->marks[--m->mn];
  val *c = new_val(m, t);
  if (!c) return NULL;
  for (size_t k = from; k < m->sn; k++)
    if (append(c, m->stack[k])) return NULL;
  m->sn = from;
  return c;
}

static int take(vm *m, size_t n, const uint8_t **out) {
  if ((size_t)(m->end - m->p) < n) return perr(m, "truncated pickle");
  *out = m->p;
  m->p += n;
  return 0;
}

static val *str_val(vm *m, int type, size_t n) {
  const uint8_t *b = NULL;
  if (take(m, n, &b)) return NULL;
  val *v = new_val(m, type);
  if (!v || !(v->s = malloc(n + 1))) {
    if (v) bl_set_error(BL_ENOMEM, WHAT ": out of memory");
    return NULL;
  }
  memcpy(v->s, b, n);
  v->s[n] = 0;
  v->slen = n;
  return v;
}

static val *int_val(vm *m, int64_t x) {
  val *v = new_val(m, V_INT);
  if (v) v->i = x;
  return v;
}

static const struct {
  const char *name;
  int dtype, esize;
} STORAGES[] = {
  { "FloatStorage", BL_F32, 4 },     { "DoubleStorage", BL_F64, 8 },   { "HalfStorage", BL_F16, 2 },
  { "BFloat16Storage", BL_BF16, 2 }, { "LongStorage", BL_I64, 8 },     { "IntStorage", BL_I32, 4 },
  { "ByteStorage", BL_U8, 1 },       { "BoolStorage", BL_BOOL, 1 },    { "ShortStorage", -1, 2 },
  { "CharStorage", -1, 1 },          { "ComplexFloatStorage", -1, 8 }, { "ComplexDoubleStorage", -1, 16 },
};

/* The allowed globals; anything else is refused here, before it could be called. */
static val *global(vm *m, const char *mod, size_t ml, const char *name, size_t nl) {
  val *g = new_val(m, V_GLOBAL);
  if (!g) return NULL;
#define IS(a, b) (ml == strlen(a) && memcmp(mod, a, ml) == 0 && nl == strlen(b) && memcmp(name, b, nl) == 0)
  if (IS("collections", "OrderedDict"))
    g->i = G_ORDERED_DICT;
  else if (IS("torch._utils", "_rebuild_tensor_v2"))
    g->i = G_REBUILD_V2;
  else if (IS("torch._utils", "_rebuild_tensor"))
    g->i = G_REBUILD;
  else if (IS("torch._utils", "_rebuild_parameter"))
    g->i = G_REBUILD_PARAM;
  else {
    for (size_t k = 0; k < sizeof STORAGES / sizeof STORAGES[0]; k++)
      if (IS("torch", STORAGES[k].name)) {
        g->i = G_STORAGE;
        g->dtype = STORAGES[k].dtype;
        g->esize = STORAGES[k].esize;
        g->dtname = STORAGES[k].name;
        return g;
      }
    perr(m,
         "refusing global %.*s.%.*s: a state dict needs only torch's tensor rebuild functions, storage types "
         "and collections.OrderedDict (nothing was executed)",
         (int)(ml > 200 ? 200 : ml), mod, (int)(nl > 200 ? 200 : nl), name);
    return NULL;
  }
#undef IS
  return g;
}

static int line(vm *m, const char **s, size_t *n) {
  const uint8_t *nl = memchr(m->p, '\n', (size_t)(m->end - m->p));
  if (!nl) return perr(m, "truncated GLOBAL");
  *s = (const char *)m->p;
  *n = (size_t)(nl - m->p);
  m->p = nl + 1;
  return 0;
}

/* legacy format: ('storage', StorageType, key, location, numel, view_metadata); the bytes come after
 * the pickles, bound in legacy_bind. One storage per key however often it is referenced. */
static val *legacy_storage(vm *m, val *pid) {
  if (pid->n != 6 || pid->items[5]->type != V_NONE) {
    perr(m, "storage views (old torch.save) are not supported; re-save with a current torch");
    return NULL;
  }
  for (size_t k = 0; k < m->ns; k++)
    if (strcmp(m->storages[k]->s, pid->items[2]->s) == 0) return m->storages[k];
  val *g = pid->items[1], *s = new_val(m, V_STORAGE);
  if (!s || grow((void **)&m->storages, &m->nscap, m->ns + 1, sizeof *m->storages)) return NULL;
  if (!(s->s = strdup(pid->items[2]->s))) {
    bl_set_error(BL_ENOMEM, WHAT ": out of memory");
    return NULL;
  }
  s->dtype = g->dtype;
  s->esize = g->esize;
  s->dtname = g->dtname;
  s->i = pid->items[4]->i;
  s->data_off = -1;
  m->storages[m->ns++] = s;
  return s;
}

/* ('storage', StorageType, key, location, numel) -> a storage bound to ARCHIVE/data/key */
static val *persistent(vm *m, val *pid) {
  if (pid->type != V_TUPLE || pid->n < 5 || pid->items[0]->type != V_STR || strcmp(pid->items[0]->s, "storage") ||
      pid->items[1]->type != V_GLOBAL || pid->items[1]->i != G_STORAGE || pid->items[2]->type != V_STR ||
      pid->items[4]->type != V_INT) {
    perr(m, "persistent id is not a torch storage reference");
    return NULL;
  }
  val *g = pid->items[1];
  const char *key = pid->items[2]->s;
  int64_t numel = pid->items[4]->i;
  char rest[300];
  if (strlen(key) > 200 || numel < 0) {
    perr(m, "bad storage key or size");
    return NULL;
  }
  if (m->legacy) return legacy_storage(m, pid);
  snprintf(rest, sizeof rest, "data/%s", key);
  zip_entry *e = tzip_find(m->z, m->z->prefix, rest);
  if (!e) {
    perr(m, "storage '%s' has no entry %s/%s in the archive", key, m->z->prefix, rest);
    return NULL;
  }
  val *s = new_val(m, V_STORAGE);
  if (!s || tzip_data(m->z, e, &s->data_off)) return NULL;
  s->dtype = g->dtype;
  s->esize = g->esize;
  s->dtname = g->dtname;
  s->i = numel;
  s->data_len = (int64_t)e->usize;
  s->crc = e->crc;
  int64_t nb;
  if (__builtin_mul_overflow(numel, (int64_t)g->esize, &nb) || nb != s->data_len) {
    perr(m, "storage '%s' should hold %lld x %d bytes but its zip entry has %lld", key, (long long)numel, g->esize,
         (long long)s->data_len);
    return NULL;
  }
  return s;
}

static int int_tuple(val *t, int64_t *out, int *n) {
  if (t->type != V_TUPLE || t->n > BL_MAX_DIMS) return -1;
  for (size_t k = 0; k < t->n; k++) {
    if (t->items[k]->type != V_INT || t->items[k]->i < 0) return -1;
    out[k] = t->items[k]->i;
  }
  *n = (int)t->n;
  return 0;
}

static val *rebuild_tensor(vm *m, val *args) {
  if (args->n < 4 || args->items[0]->type != V_STORAGE || args->items[1]->type != V_INT) {
    perr(m, "_rebuild_tensor called with unexpected arguments");
    return NULL;
  }
  val *t = new_val(m, V_TENSOR);
  if (!t) return NULL;
  t->storage = args->items[0];
  t->off = args->items[1]->i;
  int nd2;
  if (int_tuple(args->items[2], t->shape, &t->ndim) || int_tuple(args->items[3], t->stride, &nd2) || nd2 != t->ndim) {
    perr(m, "tensor size/stride must be tuples of at most 8 non-negative ints of the same length");
    return NULL;
  }
  if (t->off < 0) {
    perr(m, "negative storage offset");
    return NULL;
  }
  return t;
}

static val *reduce(vm *m, val *fn, val *args) {
  if (fn->type != V_GLOBAL || args->type != V_TUPLE) {
    perr(m, "REDUCE of something not callable");
    return NULL;
  }
  switch (fn->i) {
    case G_ORDERED_DICT:
      if (args->n != 0) {
        perr(m, "OrderedDict with arguments");
        return NULL;
      }
      return new_val(m, V_DICT);
    case G_REBUILD_V2:
    case G_REBUILD: return rebuild_tensor(m, args);
    case G_REBUILD_PARAM:
      if (args->n < 1 || args->items[0]->type != V_TENSOR) {
        perr(m, "_rebuild_parameter without a tensor");
        return NULL;
      }
      return args->items[0];
    default: perr(m, "storage types cannot be called"); return NULL;
  }
}

static int set_items(vm *m, val *d, val **kv, size_t n) {
  if (d->type != V_DICT) return perr(m, "SETITEM(S) on something that is not a dict");
  for (size_t k = 0; k < n; k++) BL_CHECK(append(d, kv[k]));
  return 0;
}

static int memo_put(vm *m, uint64_t idx) {
  if (m->sn == 0) return perr(m, "memo store with an empty stack");
  if (idx >= MAX_MEMO) return perr(m, "memo index %llu is absurd", (unsigned long long)idx);
  if (idx >= m->memo_cap) {
    size_t cap = m->memo_cap;
    BL_CHECK(grow((void **)&m->memo, &cap, idx + 1, sizeof *m->memo));
    memset(m->memo + m->memo_cap, 0, (cap - m->memo_cap) * sizeof *m->memo);
    m->memo_cap = cap;
  }
  if (!m->memo[idx]) m->memo_len++;
  m->memo[idx] = m->stack[m->sn - 1];
  return 0;
}

static int memo_get(vm *m, uint64_t idx) {
  if (idx >= m->memo_cap || !m->memo[idx]) return perr(m, "memo index %llu was never stored", (unsigned long long)idx);
  return push(m, m->memo[idx]);
}

/* Runs the pickle; *out is the object STOP returns. */
static int run(vm *m, val **out) {
  const uint8_t *b = NULL;
  val *a, *k, *v;
  for (;;) {
    if (m->p >= m->end) return perr(m, "pickle ends without STOP");
    uint8_t op = *m->p++;
    switch (op) {
      case 0x80:
        BL_CHECK(take(m, 1, &b));
        if (b[0] > 5) return perr(m, "pickle protocol %d", b[0]);
        break;
      case 0x95: BL_CHECK(take(m, 8, &b)); break; /* FRAME: a hint only */
      case '.':
        if (!(*out = pop(m))) return BL_EFORMAT;
        return 0;
      case '(':
        BL_CHECK(grow((void **)&m->marks, &m->mcap, m->mn + 1, sizeof *m->marks));
        m->marks[m->mn++] = m->sn;
        break;
      case '}': BL_CHECK(push(m, new_val(m, V_DICT))); break;
      case ']': BL_CHECK(push(m, new_val(m, V_LIST))); break;
      case ')': BL_CHECK(push(m, new_val(m, V_TUPLE))); break;
      case 'N': BL_CHECK(push(m, new_val(m, V_NONE))); break;
      case 0x88:
      case 0x89:
        if (!(a = new_val(m, V_BOOL))) return BL_EFORMAT;
        a->i = op == 0x88;
        BL_CHECK(push(m, a));
        break;
      case 'J':
        BL_CHECK(take(m, 4, &b));
        BL_CHECK(push(m, int_val(m, (int32_t)le32(b))));
        break;
      case 'K':
        BL_CHECK(take(m, 1, &b));
        BL_CHECK(push(m, int_val(m, b[0])));
        break;
      case 'M':
        BL_CHECK(take(m, 2, &b));
        BL_CHECK(push(m, int_val(m, le16(b))));
        break;
      case 0x8a: { /* LONG1: little-endian two's complement */
        BL_CHECK(take(m, 1, &b));
        int n = b[0];
        if (n > 8) return perr(m, "integer of %d bytes does not fit in 64 bits", n);
        BL_CHECK(take(m, (size_t)n, &b));
        uint64_t x = 0;
        for (int i = 0; i < n; i++) x |= (uint64_t)b[i] << (8 * i);
        if (n > 0 && n < 8 && (b[n - 1] & 0x80)) x |= ~0ull << (8 * n);
        BL_CHECK(push(m, int_val(m, (int64_t)x)));
        break;
      }
      case 'G': {
        BL_CHECK(take(m, 8, &b));
        uint64_t x = 0;
        for (int i = 0; i < 8; i++) x = x << 8 | b[i];
        if (!(a = new_val(m, V_FLOAT))) return BL_EFORMAT;
        memcpy(&a->f, &x, 8);
        BL_CHECK(push(m, a));
        break;
      }
      case 'X':
      case 'T':
      case 'B':
        BL_CHECK(take(m, 4, &b));
        BL_CHECK(push(m, str_val(m, op == 'B' ? V_BYTES : V_STR, le32(b))));
        break;
      case 0x8c:
      case 'U':
      case 'C':
        BL_CHECK(take(m, 1, &b));
        BL_CHECK(push(m, str_val(m, op == 'C' ? V_BYTES : V_STR, b[0])));
        break;
      case 0x8d:
      case 0x8e:
        BL_CHECK(take(m, 8, &b));
        if (le64(b) > (uint64_t)(m->end - m->p)) return perr(m, "truncated pickle");
        BL_CHECK(push(m, str_val(m, op == 0x8e ? V_BYTES : V_STR, (size_t)le64(b))));
        break;
      case 't': BL_CHECK(push(m, pop_mark(m, V_TUPLE))); break;
      case 'l': BL_CHECK(push(m, pop_mark(m, V_LIST))); break;
      case 'd': {
        if (!(a = pop_mark(m, V_DICT))) return BL_EFORMAT;
        if (a->n % 2) return perr(m, "DICT with an odd number of items");
        BL_CHECK(push(m, a));
        break;
      }
      case 0x85:
      case 0x86:
      case 0x87: {
        int n = op - 0x84;
        if (!(a = new_val(m, V_TUPLE))) return BL_EFORMAT;
        BL_CHECK(grow((void **)&a->items, &a->cap, (size_t)n, sizeof *a->items));
        for (int i = n - 1; i >= 0; i--)
          if (!(a->items[i] = pop(m))) return BL_EFORMAT;
        a->n = (size_t)n;
        BL_CHECK(push(m, a));
        break;
      }
      case 'a':
        if (!(v = pop(m)) || !(a = pop(m))) return BL_EFORMAT;
        if (a->type != V_LIST) return perr(m, "APPEND to something that is not a list");
        BL_CHECK(append(a, v));
        BL_CHECK(push(m, a));
        break;
      case 'e':
      case 'u': {
        if (!(v = pop_mark(m, V_TUPLE)) || !(a = pop(m))) return BL_EFORMAT;
        if (op == 'e') {
          if (a->type != V_LIST) return perr(m, "APPENDS to something that is not a list");
          for (size_t i = 0; i < v->n; i++) BL_CHECK(append(a, v->items[i]));
        } else {
          if (v->n % 2) return perr(m, "SETITEMS with an odd number of items");
          BL_CHECK(set_items(m, a, v->items, v->n));
        }
        BL_CHECK(push(m, a));
        break;
      }
      case 's': {
        val *kv[2];
        if (!(kv[1] = pop(m)) || !(kv[0] = pop(m)) || !(a = pop(m))) return BL_EFORMAT;
        BL_CHECK(set_items(m, a, kv, 2));
        BL_CHECK(push(m, a));
        break;
      }
      case 'q':
        BL_CHECK(take(m, 1, &b));
        BL_CHECK(memo_put(m, b[0]));
        break;
      case 'r':
        BL_CHECK(take(m, 4, &b));
        BL_CHECK(memo_put(m, le32(b)));
        break;
      case 0x94: BL_CHECK(memo_put(m, m->memo_len)); break;
      case 'h':
        BL_CHECK(take(m, 1, &b));
        BL_CHECK(memo_get(m, b[0]));
        break;
      case 'j':
        BL_CHECK(take(m, 4, &b));
        BL_CHECK(memo_get(m, le32(b)));
        break;
      case 'c': {
        const char *mod = NULL, *name = NULL;
        size_t ml = 0, nl = 0;
        BL_CHECK(line(m, &mod, &ml));
        BL_CHECK(line(m, &name, &nl));
        BL_CHECK(push(m, global(m, mod, ml, name, nl)));
        break;
      }
      case 0x93:
        if (!(v = pop(m)) || !(k = pop(m))) return BL_EFORMAT;
        if (v->type != V_STR || k->type != V_STR) return perr(m, "STACK_GLOBAL needs two strings");
        BL_CHECK(push(m, global(m, k->s, k->slen, v->s, v->slen)));
        break;
      case 'R':
      case 0x81: /* REDUCE, NEWOBJ: only the allowed globals can be on the stack */
        if (!(a = pop(m)) || !(k = pop(m))) return BL_EFORMAT;
        if (op == 0x81 && (k->type != V_GLOBAL || k->i != G_ORDERED_DICT)) return perr(m, "NEWOBJ of a non-dict");
        BL_CHECK(push(m, reduce(m, k, a)));
        break;
      case 'b': /* BUILD: a state dict's _metadata or a tensor's python state; neither matters here */
        if (!(v = pop(m)) || m->sn == 0) return BL_EFORMAT;
        a = m->stack[m->sn - 1];
        if (a->type != V_DICT && a->type != V_TENSOR) return perr(m, "BUILD on an object that is not a dict or tensor");
        break;
      case 'Q':
        if (!(a = pop(m))) return BL_EFORMAT;
        BL_CHECK(push(m, persistent(m, a)));
        break;
      case '0':
        if (!pop(m)) return BL_EFORMAT;
        break;
      case '1':
        if (m->mn == 0) return perr(m, "POP_MARK without a MARK");
        m->sn = m->marks[--m->mn];
        break;
      case '2':
        if (!(a = pop(m))) return BL_EFORMAT;
        BL_CHECK(push(m, a));
        BL_CHECK(push(m, a));
        break;
      default: m->p--; return perr(m, "pickle opcode 0x%02x is not one a state dict uses", op);
    }
  }
}

/* ------------------------------------------------------------------ tensors out of the object */
static int add_tensor(vm *m, val *t) {
  bl_ckpt *c = m->z->c;
  /* the largest element index must lie inside the storage */
  int64_t last = t->off, numel = bl_ckpt_numel_(t->ndim, t->shape);
  if (numel < 0) return tzip_err(m->z, "tensor '%s': its size overflows 64 bits", m->name);
  for (int d = 0; d < t->ndim && numel > 0; d++) {
    int64_t span;
    if (__builtin_mul_overflow(t->shape[d] - 1, t->stride[d], &span) || __builtin_add_overflow(last, span, &last))
      return tzip_err(m->z, "tensor '%s': its strides overflow 64 bits", m->name);
  }
  if (numel > 0 && last >= t->storage->i)
    return tzip_err(m->z, "tensor '%s' (offset %lld, last element %lld) reaches past its storage (%lld elements)",
                    m->name, (long long)t->off, (long long)last, (long long)t->storage->i);
  bl_ckpt_item *it = bl_ckpt_add_(c, m->name, strlen(m->name));
  if (!it) return BL_ENOMEM;
  val *s = t->storage;
  it->dtype = s->dtype;
  snprintf(it->src_dtype, sizeof it->src_dtype, "torch.%s", s->dtname);
  it->ndim = t->ndim;
  memcpy(it->shape, t->shape, sizeof it->shape);
  memcpy(it->stride, t->stride, sizeof it->stride);
  it->file = 0;
  it->region_off = s->data_off;
  it->region_len = s->data_len;
  it->elem_off = t->off;
  it->crc_kind = m->legacy ? BL_CRC_NONE : BL_CRC_ZIP; /* the legacy format has no checksums */
  it->crc = s->crc;
  return 0;
}

/* Every tensor under v, named by its path; each container is visited once (shared or cyclic objects). */
static int collect(vm *m, val *v, size_t len, int depth) {
  if (v->type == V_TENSOR) return add_tensor(m, v);
  if (v->type != V_DICT && v->type != V_LIST && v->type != V_TUPLE) return 0;
  if (v->seen) return 0;
  if (depth > MAX_DEPTH) return perr(m, "objects nested deeper than %d levels: not a state dict", MAX_DEPTH);
  v->seen = 1;
  int dict = v->type == V_DICT;
  for (size_t i = 0; i < v->n; i += dict ? 2 : 1) {
    char part[64];
    const char *key = part;
    if (!dict)
      snprintf(part, sizeof part, "%zu", i);
    else if (v->items[i]->type == V_STR)
      key = v->items[i]->s;
    else if (v->items[i]->type == V_INT)
      snprintf(part, sizeof part, "%lld", (long long)v->items[i]->i);
    else
      snprintf(part, sizeof part, "<key %zu>", i / 2);
    size_t kl = strlen(key);
    if (len + kl + 2 > MAX_NAME) return perr(m, "a tensor name is longer than %d bytes", MAX_NAME);
    size_t nl = len;
    if (len) m->name[nl++] = '.';
    memcpy(m->name + nl, key, kl + 1);
    BL_CHECK(collect(m, v->items[i + dict], nl + kl, depth + 1));
    m->name[len] = 0;
  }
  return 0;
}

static void vm_free(vm *m) {
  for (val *v = m->all, *nx; v; v = nx) {
    nx = v->next_alloc;
    free(v->s);
    free(v->items);
    free(v);
  }
  free(m->stack);
  free(m->marks);
  free(m->memo);
  free(m->storages);
}

/* ------------------------------------------------------------------ the legacy (pre-1.6) format */
/* pickles of: the magic number, the protocol version (1001), sys_info, the object, the sorted storage
 * keys; then per key an int64 element count and the raw bytes */
static const uint8_t LEGACY_MAGIC[15] = { 0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46,
                                          0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e };

/* the next pickle of the stream: fresh stack and memo */
static int run_next(vm *m, val **out) {
  m->sn = m->mn = 0;
  if (m->memo_cap) memset(m->memo, 0, m->memo_cap * sizeof *m->memo);
  m->memo_len = 0;
  return run(m, out);
}

static val *dict_get(val *d, const char *key) {
  for (size_t i = 0; d->type == V_DICT && i + 1 < d->n; i += 2)
    if (d->items[i]->type == V_STR && strcmp(d->items[i]->s, key) == 0) return d->items[i + 1];
  return NULL;
}

static int legacy_bind(vm *m, val *keys, int64_t off) {
  zip_reader *z = m->z;
  if (keys->type != V_LIST) return perr(m, "the storage key list is not a list");
  for (size_t k = 0; k < keys->n; k++) {
    val *key = keys->items[k], *s = NULL;
    if (key->type != V_STR) return perr(m, "a storage key is not a string");
    for (size_t j = 0; j < m->ns && !s; j++)
      if (strcmp(m->storages[j]->s, key->s) == 0) s = m->storages[j];
    if (!s || s->data_off >= 0) return tzip_err(z, "storage '%s' is listed but not used once by the pickle", key->s);
    uint8_t h[8];
    if (off > z->fsize - 8 || bl_file_read_at(z->f, off, h, 8))
      return tzip_err(z, "storage '%s': the file ends at %lld, before its data: truncated?", key->s,
                      (long long)z->fsize);
    int64_t numel = (int64_t)le64(h), nb;
    if (numel != s->i)
      return tzip_err(z, "storage '%s': the file says %lld elements, the pickle %lld", key->s, (long long)numel,
                      (long long)s->i);
    if (__builtin_mul_overflow(numel, (int64_t)s->esize, &nb) || nb > z->fsize - off - 8)
      return tzip_err(z, "storage '%s' (%lld x %d bytes at %lld) runs past the end of the file: truncated?", key->s,
                      (long long)numel, s->esize, (long long)off + 8);
    s->data_off = off + 8;
    s->data_len = nb;
    off += 8 + nb;
  }
  for (size_t j = 0; j < m->ns; j++)
    if (m->storages[j]->data_off < 0) return tzip_err(z, "storage '%s' is missing from the file", m->storages[j]->s);
  return 0;
}

static int open_legacy(bl_ckpt *c, zip_reader *z) {
  int64_t n = z->fsize < MAX_PICKLE_BYTES ? z->fsize : MAX_PICKLE_BYTES;
  uint8_t *buf = malloc((size_t)n);
  if (!buf) return bl_set_error(BL_ENOMEM, WHAT ": out of memory");
  int rc = bl_file_read_at(z->f, 0, buf, n);
  vm m = { .z = z, .p = buf + sizeof LEGACY_MAGIC, .end = buf + n, .start = buf, .legacy = 1 };
  snprintf(m.where, sizeof m.where, "the legacy torch.save pickle");
  val *ver = NULL, *info = NULL, *root = NULL, *keys = NULL, *le;
  if (rc == 0) rc = run_next(&m, &ver);
  if (rc == 0 && (ver->type != V_INT || ver->i != 1001))
    rc = perr(&m, "protocol version is not 1001: not a torch.save file this reader knows");
  if (rc == 0) rc = run_next(&m, &info);
  if (rc == 0 && (le = dict_get(info, "little_endian")) && le->type == V_BOOL && !le->i)
    rc = tzip_err(z, "the tensors are stored big-endian; only little-endian is read");
  if (rc == 0) rc = run_next(&m, &root);
  if (rc == 0) rc = run_next(&m, &keys);
  if (rc == 0) rc = legacy_bind(&m, keys, (int64_t)(m.p - m.start));
  if (rc == 0) rc = collect(&m, root, 0, 0);
  if (rc == 0 && c->n == 0) rc = tzip_err(z, "the pickled object holds no tensors");
  vm_free(&m);
  free(buf);
  return rc;
}

static int open_torch(bl_ckpt *c, zip_reader *z) {
  BL_CHECK(bl_ckpt_add_file_(c, c->path));
  z->f = c->files[0];
  uint8_t magic[sizeof LEGACY_MAGIC] = { 0 };
  BL_CHECK(bl_file_size(z->f, &z->fsize));
  if (z->fsize >= (int64_t)sizeof magic) BL_CHECK(bl_file_read_at(z->f, 0, magic, sizeof magic));
  if (memcmp(magic, LEGACY_MAGIC, sizeof magic) == 0) return open_legacy(c, z);
  if (le32(magic) != 0x04034b50) return tzip_err(z, "not a zip archive: not a torch.save file, or truncated");
  BL_CHECK(tzip_open(z));
  zip_entry *pk = NULL;
  for (int64_t i = 0; i < z->nents && !pk; i++) {
    const char *n = z->ents[i].name, *sl = strchr(n, '/');
    if (sl && strcmp(sl, "/data.pkl") == 0) pk = &z->ents[i];
  }
  if (!pk) return tzip_err(z, "no ARCHIVE/data.pkl entry: not a torch.save archive");
  size_t pl = (size_t)(strchr(pk->name, '/') - pk->name);
  if (!(z->prefix = strndup(pk->name, pl))) return bl_set_error(BL_ENOMEM, WHAT ": out of memory");
  zip_entry *bo = tzip_find(z, z->prefix, "byteorder");
  if (bo) {
    char buf[8] = { 0 };
    int64_t off;
    BL_CHECK(tzip_data(z, bo, &off));
    if (bo->usize > 7 || bl_file_read_at(z->f, off, buf, (int64_t)bo->usize) || strcmp(buf, "little"))
      return tzip_err(z, "the tensors are stored big-endian (byteorder '%s'); only little-endian is read", buf);
  }
  int64_t off;
  BL_CHECK(tzip_data(z, pk, &off));
  if (pk->usize > MAX_PICKLE_BYTES)
    return tzip_err(z, "data.pkl is %llu bytes: too large for a state dict", (unsigned long long)pk->usize);
  uint8_t *pkl = malloc(pk->usize ? pk->usize : 1);
  if (!pkl) return bl_set_error(BL_ENOMEM, WHAT ": out of memory");
  int rc = bl_file_read_at(z->f, off, pkl, (int64_t)pk->usize);
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION /* the fuzz targets skip it to reach the pickle VM */
  if (rc == 0 && bl_crc32(0, pkl, pk->usize) != pk->crc)
    rc = tzip_err(z, "%s fails its zip CRC-32 check: corrupt file", pk->name);
#endif
  vm m = { .z = z, .p = pkl, .end = pkl + pk->usize, .start = pkl };
  snprintf(m.where, sizeof m.where, "%s/data.pkl", z->prefix);
  val *root = NULL;
  if (rc == 0) rc = run(&m, &root);
  if (rc == 0) rc = collect(&m, root, 0, 0);
  if (rc == 0 && c->n == 0) rc = tzip_err(z, "the pickled object holds no tensors");
  vm_free(&m);
  free(pkl);
  return rc;
}

int bl_ckpt_open_torch(const char *path, bl_ckpt **res) {
  if (!path || !res) return bl_set_error(BL_EINVAL, WHAT ": NULL argument");
  *res = NULL;
  bl_ckpt *c = bl_ckpt_new_(path, WHAT);
  if (!c) return BL_ENOMEM;
  zip_reader z = { .c = c };
  int rc = open_torch(c, &z);
  tzip_free(&z);
  if (rc) {
    bl_ckpt_close(c);
    return rc;
  }
  *res = c;
  return 0;
}
