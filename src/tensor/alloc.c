/* The CPU tensor allocator: a block cache in front of mmap for large tensors.
 *
 * Why: a tensor over glibc's mmap threshold (at most 32 MiB; BERT-base's FFN
 * activations at batch 32 are 48 MiB) is mapped and unmapped on every
 * allocation, and the kernel zeroes each of its pages again on first touch.
 * Shapes that change between steps (a last partial batch, evaluation
 * between training steps, a varying number of masked positions) reallocate
 * module buffers. Here a freed large block goes to a cache of free blocks per
 * size class, and the next allocation of that class takes it back without a
 * system call or a page fault.
 *
 * Size classes: the byte count rounded up to pages, then to four classes per
 * power of two (at most 25 % slack, usually untouched and so never faulted
 * in). Blocks of 8 MiB and more are multiples of 2 MiB and ask for
 * transparent huge pages (fewer faults and TLB misses in the GEMMs).
 * Bound: the free blocks held stay under a limit (BL_CPU_CACHE_MB, default
 * a quarter of physical memory up to 4 GiB; 0 = no caching); past it the
 * blocks freed longest ago are unmapped first. Free blocks are marked
 * MADV_FREE, so memory pressure reclaims their pages instead of killing. bl_cpu_cache_release() unmaps
 * every free block, and a failed mmap does so before its one retry.
 * Small tensors keep using malloc (glibc's heap serves them well). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "../base/internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
/* free blocks and the slack past a tensor's bytes are poisoned, so ASan still sees use after free and overruns */
#define POISON(p, n)   ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n)   ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define PAGE       ((size_t)4096)
#define HUGE_PAGE  ((size_t)2 << 20)
#define CACHED_MIN ((size_t)256 << 10) /* below this, malloc */
#define HUGE_MIN   ((size_t)8 << 20)
#define NCLASS     256

typedef struct block {
  void *p;
  size_t size;
  int cls;
  struct block *cprev, *cnext; /* this class's free blocks, most recently freed first */
  struct block *lprev, *lnext; /* all free blocks, most recently freed first */
} block;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static block *class_head[NCLASS];
static block *lru_head, *lru_tail;
static bl_cpu_cache_stats st;
static int limit_set;

/* The class of n bytes (n >= CACHED_MIN) and its block size. */
static int size_class(size_t n, size_t *size) {
  n = (n + PAGE - 1) & ~(PAGE - 1);
  int e = 63 - __builtin_clzll((unsigned long long)n); /* 2^e <= n < 2^(e+1) */
  size_t quarter = (size_t)1 << (e - 2);
  size_t k = (n - ((size_t)1 << e) + quarter - 1) / quarter; /* 0..4 quarters above 2^e */
  size_t s = ((size_t)1 << e) + k * quarter;
  if (s >= HUGE_MIN) s = (s + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
  *size = s;
  return e * 4 + (int)k;
}

static int64_t default_limit(void) {
  const char *e = getenv("BL_CPU_CACHE_MB");
  if (e && *e) {
    char *end;
    long long mb = strtoll(e, &end, 10);
    if (*end == 0 && mb >= 0) return (int64_t)mb << 20;
  }
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  int64_t quarter = pages > 0 && psz > 0 ? (int64_t)pages * psz / 4 : (int64_t)1 << 30;
  return quarter < ((int64_t)4 << 30) ? quarter : (int64_t)4 << 30;
}

static void lru_unlink(block *b) {
  if (b->lprev)
    b->lprev->lnext = b->lnext;
  else
    lru_head = b->lnext;
  if (b->lnext)
    b->lnext->lprev = b->lprev;
  else
    lru_tail = b->lprev;
}

static void class_unlink(block *b) {
  if (b->cprev)
    b->cprev->cnext = b->cnext;
  else
    class_head[b->cls] = b->cnext;
  if (b->cnext) b->cnext->cprev = b->cprev;
}

/* Takes b out of the cache and unmaps it. Called with the lock held. */
static void drop(block *b) {
  lru_unlink(b);
  class_unlink(b);
  st.cached_bytes -= (int64_t)b->size;
  st.mapped_bytes -= (int64_t)b->size;
  st.unmaps++;
  UNPOISON(b->p, b->size);
  munmap(b->p, b->size);
  free(b);
}

static void ensure_limit(void) {
  if (!limit_set) {
    st.limit_bytes = default_limit();
    limit_set = 1;
  }
}

void *bl_cpu_alloc(size_t nbytes) {
  if (nbytes > ((size_t)1 << 48)) return NULL; /* more than any machine maps; keeps the classes in range */
  if (nbytes < CACHED_MIN) return aligned_alloc(64, (nbytes + 63) & ~(size_t)63);
  size_t size;
  int cls = size_class(nbytes, &size);
  pthread_mutex_lock(&lock);
  ensure_limit();
  block *b = class_head[cls];
  if (b) {
    lru_unlink(b);
    class_unlink(b);
    st.cached_bytes -= (int64_t)b->size;
    st.hits++;
    pthread_mutex_unlock(&lock);
    void *p = b->p;
    free(b);
    UNPOISON(p, nbytes);
    return p;
  }
  pthread_mutex_unlock(&lock);
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) { /* the cached blocks may be what is missing: give them back once */
    bl_cpu_cache_release();
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
  }
#ifdef MADV_HUGEPAGE
  if (size >= HUGE_MIN) madvise(p, size, MADV_HUGEPAGE); /* advice only: failure is harmless */
#endif
  pthread_mutex_lock(&lock);
  st.maps++;
  st.mapped_bytes += (int64_t)size;
  pthread_mutex_unlock(&lock);
  POISON((char *)p + nbytes, size - nbytes);
  return p;
}

void bl_cpu_free(void *p, size_t nbytes) {
  if (!p) return;
  if (nbytes < CACHED_MIN) {
    free(p);
    return;
  }
  size_t size;
  int cls = size_class(nbytes, &size);
  block *b = malloc(sizeof *b);
#ifdef MADV_FREE
  /* the kernel may take the pages back under memory pressure (a later touch then faults in zeroes); until it
   * does, reuse costs nothing, so the cache never pushes the machine into the out-of-memory killer. Done
   * before the block is visible in the cache, where another thread may take it and write to it at once. */
  madvise(p, size, MADV_FREE);
#endif
  POISON(p, size);
  pthread_mutex_lock(&lock);
  ensure_limit();
  if (!b || (int64_t)size > st.limit_bytes) { /* not cacheable: unmap now */
    st.unmaps++;
    st.mapped_bytes -= (int64_t)size;
    pthread_mutex_unlock(&lock);
    free(b);
    UNPOISON(p, size);
    munmap(p, size);
    return;
  }
  while (lru_tail && st.cached_bytes + (int64_t)size > st.limit_bytes) drop(lru_tail);
  *b = (block){ .p = p, .size = size, .cls = cls, .cnext = class_head[cls], .lnext = lru_head };
  if (b->cnext) b->cnext->cprev = b;
  class_head[cls] = b;
  if (lru_head)
    lru_head->lprev = b;
  else
    lru_tail = b;
  lru_head = b;
  st.cached_bytes += (int64_t)size;
  pthread_mutex_unlock(&lock);
}

int64_t bl_cpu_cache_release(void) {
  pthread_mutex_lock(&lock);
  int64_t before = st.cached_bytes;
  while (lru_tail) drop(lru_tail);
  pthread_mutex_unlock(&lock);
  return before;
}

int bl_cpu_cache_set_limit(int64_t bytes) {
  if (bytes < 0) return bl_set_error(BL_EINVAL, "cpu_cache_set_limit: negative limit %lld", (long long)bytes);
  pthread_mutex_lock(&lock);
  st.limit_bytes = bytes;
  limit_set = 1;
  while (lru_tail && st.cached_bytes > st.limit_bytes) drop(lru_tail);
  pthread_mutex_unlock(&lock);
  return 0;
}

void bl_cpu_cache_get_stats(bl_cpu_cache_stats *out) {
  pthread_mutex_lock(&lock);
  ensure_limit();
  *out = st;
  pthread_mutex_unlock(&lock);
}
