/* Build-time tool of the emulated CUDA build (-DBERTLUA_CUDA_EMU=ON): copies a
 * kernel source (.cu) to a host C++ file, rewriting only what g++ cannot parse:
 *   callee<<<grid, block[, smem[, stream]]>>>(args)
 *     -> ::emu::launcher(__FILE__, __LINE__, "callee", callee, grid, block[, ...])(args)
 *   extern __shared__ T name[];  ->  T *name = (T *)::emu::dyn_smem();
 *   __shared__ T a[4], b;  ->  one copy per block slot (EMU_SHARED_0 T a__emu0[4], b__emu0; ... _3)
 *     and  auto &a = *::emu::shared_slot(&a__emu0, ..., &a__emu3); auto &b = ...;  (emu_device.h)
 * Line breaks are kept and a #line directive names the original file, so
 * compiler messages and emulator errors point at the .cu file.
 * usage: emu_rewrite IN.cu OUT.cpp */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *out;
static size_t out_len, out_cap;

static void put(const char *s, size_t n) {
  if (out_len + n + 1 > out_cap) {
    out_cap = (out_len + n + 1) * 2;
    out = realloc(out, out_cap);
    if (!out) {
      fprintf(stderr, "emu_rewrite: out of memory\n");
      exit(1);
    }
  }
  memcpy(out + out_len, s, n);
  out_len += n;
  out[out_len] = 0;
}

static void insert_at(size_t pos, const char *s) {
  size_t n = strlen(s), tail = out_len - pos;
  put(s, n); /* grow */
  memmove(out + pos + n, out + pos, tail);
  memcpy(out + pos, s, n);
}

static int is_ident(char c) { return isalnum((unsigned char)c) || c == '_' || c == ':'; }

/* Start of the launch expression that ends at out[end) (an identifier, maybe
 * qualified, maybe with template arguments). */
static size_t callee_start(size_t end) {
  size_t i = end;
  while (i > 0 && isspace((unsigned char)out[i - 1])) i--;
  if (i > 0 && out[i - 1] == '>') {
    int depth = 0;
    while (i > 0) {
      char c = out[--i];
      if (c == '>')
        depth++;
      else if (c == '<' && --depth == 0)
        break;
    }
  }
  while (i > 0 && is_ident(out[i - 1])) i--;
  return i;
}

static void fail(const char *path, const char *src, const char *at, const char *what) {
  int line = 1;
  for (const char *p = src; p < at; p++) line += *p == '\n';
  fprintf(stderr, "%s:%d: emu_rewrite: %s\n", path, line, what);
  exit(1);
}

enum { kSlots = 4 }; /* emu::kSlots in tests/emu/emu_device.h: blocks that may be in flight at once */

/* One name of a __shared__ declaration: name[0..name_len) and its array bounds dims[0..dims_len). */
struct declarator {
  const char *name, *dims;
  size_t name_len, dims_len;
};

/* Rewrites the static __shared__ declaration whose text after the keyword is d[0..n) (up to its ';'). Each
 * block slot gets its own copy (interleaved blocks must not share one); the name becomes a reference to the
 * copy of the slot running now. Returns 0, or -1 when the text is not `T name[dims]..., name[dims]...`. */
static int rewrite_shared(const char *d, size_t n) {
  struct declarator v[16];
  int nv = 0;
  size_t i = 0, type_end = 0;
  for (;;) { /* the declarators, split at depth-0 commas; the first one's name ends the type */
    size_t start = i;
    int depth = 0;
    while (i < n && !(depth == 0 && (d[i] == ',' || d[i] == '['))) {
      if (d[i] == '(')
        depth++;
      else if (d[i] == ')')
        depth--;
      else if (depth == 0 && (d[i] == '=' || d[i] == '{'))
        return -1; /* __shared__ takes no initialiser */
      i++;
    }
    size_t ne = i;
    while (ne > start && isspace((unsigned char)d[ne - 1])) ne--;
    size_t nb = ne;
    while (nb > start && is_ident(d[nb - 1]) && d[nb - 1] != ':') nb--;
    if (nb == ne || nv == 16) return -1;
    if (nv == 0)
      type_end = nb;
    else {
      for (size_t k = start; k < nb; k++)
        if (!isspace((unsigned char)d[k])) return -1; /* `, *p` and the like */
    }
    size_t ds = i;
    depth = 0;
    while (i < n && !(depth == 0 && d[i] == ',')) {
      if (d[i] == '(' || d[i] == '[')
        depth++;
      else if (d[i] == ')' || d[i] == ']')
        depth--;
      else if (depth == 0 && (d[i] == '=' || d[i] == '{'))
        return -1;
      i++;
    }
    v[nv++] = (struct declarator){ d + nb, d + ds, ne - nb, i - ds };
    if (i == n) break;
    i++; /* the comma */
  }
  if (type_end == 0) return -1; /* no type */
  char buf[1024];
  for (int s = 0; s < kSlots; s++) {
    snprintf(buf, sizeof buf, "EMU_SHARED_%d ", s);
    put(buf, strlen(buf));
    for (size_t k = 0; k < type_end; k++) put(d[k] == '\n' ? " " : d + k, 1);
    for (int j = 0; j < nv; j++) {
      snprintf(buf, sizeof buf, "%s%.*s__emu%d", j ? ", " : "", (int)v[j].name_len, v[j].name, s);
      put(buf, strlen(buf));
      for (size_t k = 0; k < v[j].dims_len; k++) put(v[j].dims[k] == '\n' ? " " : v[j].dims + k, 1);
    }
    put("; ", 2);
  }
  for (int j = 0; j < nv; j++) {
    int l = (int)v[j].name_len;
    snprintf(buf, sizeof buf, "auto &%.*s = *::emu::shared_slot(", l, v[j].name);
    put(buf, strlen(buf));
    for (int s = 0; s < kSlots; s++) {
      snprintf(buf, sizeof buf, "%s&%.*s__emu%d", s ? ", " : "", l, v[j].name, s);
      put(buf, strlen(buf));
    }
    put("); ", 3);
  }
  for (size_t k = 0; k < n; k++)
    if (d[k] == '\n') put("\n", 1); /* the original line count */
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: emu_rewrite IN.cu OUT.cpp\n");
    return 2;
  }
  FILE *f = fopen(argv[1], "rb");
  if (!f) {
    fprintf(stderr, "emu_rewrite: cannot open %s\n", argv[1]);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *src = malloc((size_t)n + 1);
  if (!src || fread(src, 1, (size_t)n, f) != (size_t)n) {
    fprintf(stderr, "emu_rewrite: cannot read %s\n", argv[1]);
    return 1;
  }
  src[n] = 0;
  fclose(f);

  char head[4200];
  snprintf(head, sizeof head, "#line 1 \"%s\"\n", argv[1]);
  put(head, strlen(head));
  const char *p = src;
  int braces = 0; /* depth of { } outside comments and literals */
  while (*p) {
    if (p[0] == '/' && p[1] == '/') { /* comments and literals are copied untouched */
      const char *e = strchr(p, '\n');
      if (!e) e = p + strlen(p);
      put(p, (size_t)(e - p));
      p = e;
    } else if (p[0] == '/' && p[1] == '*') {
      const char *e = strstr(p + 2, "*/");
      if (!e) fail(argv[1], src, p, "unterminated comment");
      put(p, (size_t)(e + 2 - p));
      p = e + 2;
    } else if (*p == '"' || *p == '\'') {
      const char *e = p + 1;
      while (*e && *e != *p) e += (*e == '\\' && e[1]) ? 2 : 1;
      if (!*e) fail(argv[1], src, p, "unterminated literal");
      put(p, (size_t)(e + 1 - p));
      p = e + 1;
    } else if (strncmp(p, "<<<", 3) == 0) {
      size_t s = callee_start(out_len);
      if (s == out_len) fail(argv[1], src, p, "no kernel name before <<<");
      char name[256];
      size_t nl = out_len - s < sizeof name - 1 ? out_len - s : sizeof name - 1;
      memcpy(name, out + s, nl);
      name[nl] = 0;
      for (size_t i = 0; i < nl; i++)
        if (isspace((unsigned char)name[i]) || name[i] == '"') name[i] = ' ';
      char pre[400];
      snprintf(pre, sizeof pre, "::emu::launcher(__FILE__, __LINE__, \"%s\", ", name);
      insert_at(s, pre);
      put(", ", 2);
      const char *e = strstr(p + 3, ">>>");
      if (!e) fail(argv[1], src, p, "<<< without >>>");
      put(p + 3, (size_t)(e - p - 3));
      put(")", 1);
      p = e + 3;
    } else if (strncmp(p, "extern", 6) == 0 && (p == src || !is_ident(p[-1])) && !is_ident(p[6])) {
      const char *q = p + 6;
      while (isspace((unsigned char)*q)) q++;
      if (strncmp(q, "__shared__", 10) != 0 || is_ident(q[10])) {
        put(p, 6);
        p += 6;
        continue;
      }
      q += 10;
      const char *semi = strchr(q, ';');
      const char *br = semi ? memchr(q, '[', (size_t)(semi - q)) : NULL;
      if (!br) fail(argv[1], src, p, "extern __shared__ declaration is not `T name[];`");
      const char *ne = br;
      while (ne > q && isspace((unsigned char)ne[-1])) ne--;
      const char *nb = ne;
      while (nb > q && is_ident(nb[-1])) nb--;
      char decl[512];
      snprintf(decl, sizeof decl, "%.*s *%.*s = (%.*s *)::emu::dyn_smem();", (int)(nb - q), q, (int)(ne - nb), nb,
               (int)(nb - q), q);
      put(decl, strlen(decl));
      p = semi + 1;
    } else if (strncmp(p, "__shared__", 10) == 0 && (p == src || !is_ident(p[-1])) && !is_ident(p[10])) {
      const char *q = p + 10, *semi = strchr(q, ';');
      if (braces == 0) fail(argv[1], src, p, "__shared__ outside a function (one copy per block slot needs a scope)");
      if (!semi || rewrite_shared(q, (size_t)(semi - q)) != 0)
        fail(argv[1], src, p, "__shared__ declaration is not `T name[dims], ...;`");
      p = semi + 1;
    } else {
      braces += (*p == '{') - (*p == '}');
      put(p, 1);
      p++;
    }
  }
  FILE *o = fopen(argv[2], "wb");
  if (!o || fwrite(out, 1, out_len, o) != out_len || fclose(o) != 0) {
    fprintf(stderr, "emu_rewrite: cannot write %s\n", argv[2]);
    return 1;
  }
  return 0;
}
