// Emulated CUDA device: the GPU threads of a block are fibers run by one host
// thread. A fiber runs until it reaches a rendezvous (__syncthreads, a warp
// collective) or returns; then the scheduler resumes another, chosen at random
// from a generator seeded by BL_EMU_SEED, so that kernels that depend on the
// order of threads between barriers show it. A block barrier opens when every
// thread of the block has arrived at the same call site or exited (exited
// threads count as arrived, as on the hardware since Volta); a warp collective
// completes when every lane of its mask has arrived at the same call site. A
// barrier that cannot open is an error naming the kernel and the call sites.
//
// Blocks of a launch run one at a time in a random order, or with
// BL_EMU_BLOCKS=N up to N (<= emu::kSlots) at once, each in a slot with its
// own threads and shared memory: the scheduler then picks the next thread among
// all of them, and a global atomic or fence also lets another thread go first.
//
// The fibers switch with a small hand-written x86-64 context switch (swapcontext
// would make a sigprocmask system call per switch). In the ThreadSanitizer build
// (BL_EMU_TSAN) every GPU thread is a TSan fiber; switches carry no ordering and
// barriers are release/acquire pairs, so TSan reports the races a GPU could have
// inside a block. Blocks of one slot are ordered (a block starts after the
// slot's previous one ended, as on an SM), blocks of different slots are not:
// with BL_EMU_BLOCKS >= 2, TSan also reports races between blocks of a launch.
// This file itself is not instrumented.
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <string>
#include <vector>
#include "emu_core.h"
#include "emu_internal.h"

#if !defined(__x86_64__)
#error "the emulated CUDA device needs x86-64 (its fiber switch is x86-64 assembly)"
#endif

#ifdef BL_EMU_TSAN
extern "C" {
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
void __tsan_set_fiber_name(void *fiber, const char *name);
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
}
static const unsigned kTsanNoSync = 1;
#endif

// Saves the callee-saved registers on the current stack, stores the stack pointer in *save and resumes the
// context whose stack pointer is `to`.
asm(R"(
  .text
  .p2align 4
  .type emu_ctx_switch,@function
emu_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_ctx_switch, .-emu_ctx_switch
)");
extern "C" void emu_ctx_switch(void **save, void *to) __asm__("emu_ctx_switch");

namespace emu {
thread_pos *cur;
block_pos blk;
int slot;
bool interleave;
} // namespace emu

namespace {
const size_t kStack = 256 << 10, kGuard = 4096;

enum state { NEW, READY, YIELD, BAR, WARP, DONE };
struct gthread : emu::thread_pos {
  void *sp = nullptr;
  char *stack = nullptr;
  int lane = 0, warp = 0;
  state st = NEW;
  const char *what = nullptr, *file = nullptr; // the rendezvous it waits at
  int line = 0;
  unsigned mask = 0;
  const void *mine = nullptr;
  void *all = nullptr;
  size_t bytes = 0;
  int pred = 0, count = 0; // __syncthreads_count
#ifdef BL_EMU_TSAN
  void *fiber = nullptr;
#endif
};
struct warp_op {
  unsigned arrived = 0, mask = 0;
  const char *what = nullptr, *file = nullptr;
  int line = 0;
  size_t bytes = 0;
#ifdef BL_EMU_TSAN
  char sync[2] = { 0, 0 }; // syncwarp release/acquire objects, by generation parity
  int gen = 0;
#endif
};

// A block in flight: its threads, warps and dynamic shared memory (static __shared__ variables have a copy per
// slot, emu_device.h).
struct slot_run {
  int index = 0;
  bool active = false;
  uint3 idx = { 0, 0, 0 };
  std::vector<gthread> th;
  std::vector<warp_op> warps;
  // Runnable threads by warp. The scheduler mostly stays with the warp it ran last, so that one warp often
  // races ahead of the others (through its shuffles, say) and a missing block barrier shows.
  std::vector<std::vector<int>> wq;
  std::vector<int> live_warps; // warps whose queue may be nonempty (stale entries are dropped when met)
  int nrun = 0, last_warp = -1;
  std::vector<char> dsmem;
  int done = 0, at_bar = 0, gen = 0;
  uint64_t blocks = 0; // blocks this slot has started
#ifdef BL_EMU_TSAN
  // bar_sync: barrier release/acquire objects by generation parity; end_sync: what a block's threads release when
  // they exit, acquired by the threads of the slot's next block (by block parity, so that a late thread of a block
  // is not ordered after its own block's exited ones).
  char bar_sync[2] = { 0, 0 }, end_sync[2] = { 0, 0 };
#endif
};

struct grid_run {
  const emu::launch_cfg *cfg = nullptr;
  const std::function<void()> *body = nullptr;
  std::vector<slot_run> slots;
  int n = 0; // threads per block
  bool failed = false;
  uint64_t rng = 0;
#ifdef BL_EMU_TSAN
  char grid_start = 0, grid_end = 0;
#endif
};

grid_run *G; // the grid being run (one at a time: the runtime holds its lock)
slot_run *S; // the slot of the GPU thread running now (or that ran last)
gthread *T;  // the GPU thread running now, or null on the host context
void *host_sp;
std::vector<char *> stack_pool;
std::vector<std::pair<char *, char *>> stack_ranges;
// The emu_sharedN sections of the loaded modules, by slot (a function-local static: modules register from their
// static constructors, in any order).
std::vector<std::pair<char *, char *>> &shared_sections(int slot) {
  static std::vector<std::pair<char *, char *>> v[emu::kSlots];
  return v[slot];
}
#ifdef BL_EMU_TSAN
void *host_fiber;
#endif

uint64_t next_rand() { // splitmix64
  uint64_t z = (G->rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void push_run(slot_run &s, int i) {
  std::vector<int> &q = s.wq[(size_t)(i >> 5)];
  if (q.empty()) s.live_warps.push_back(i >> 5);
  q.push_back(i);
  s.nrun++;
}

// A random runnable thread of the slot: of the warp that ran last with probability 3/4, else of a random warp.
int pop_run(slot_run &s) {
  int w = s.last_warp;
  if (w < 0 || s.wq[(size_t)w].empty() || next_rand() % 4 == 0) {
    for (;;) {
      size_t k = (size_t)(next_rand() % s.live_warps.size());
      w = s.live_warps[k];
      if (!s.wq[(size_t)w].empty()) break;
      s.live_warps[k] = s.live_warps.back();
      s.live_warps.pop_back();
    }
  }
  std::vector<int> &q = s.wq[(size_t)w];
  size_t k = (size_t)(next_rand() % q.size());
  int i = q[k];
  q[k] = q.back();
  q.pop_back();
  s.nrun--;
  s.last_warp = w;
  return i;
}

char *get_stack() {
  if (!stack_pool.empty()) {
    char *s = stack_pool.back();
    stack_pool.pop_back();
    return s;
  }
  char *m = (char *)mmap(nullptr, kStack + kGuard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                         -1, 0);
  if (m == MAP_FAILED) {
    fprintf(stderr, "bertlua emulated CUDA: cannot map a GPU-thread stack\n");
    abort();
  }
  mprotect(m, kGuard, PROT_NONE); // overflow faults instead of corrupting a neighbour
  stack_ranges.push_back({ m, m + kGuard });
  return m + kGuard;
}

// Copies between GPU threads' buffers done by the scheduler. Not memcpy: TSan intercepts memcpy even here and would
// see the host context write into a fiber's stack.
void quiet_copy(void *dst, const void *src, size_t n) {
  asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

// The scheduler's refill of shared memory, for the same reason.
void quiet_fill(void *dst, unsigned char byte, size_t n) {
  asm volatile("rep stosb" : "+D"(dst), "+c"(n) : "a"(byte) : "memory");
}

#ifdef BL_EMU_TSAN
// Under TSan each thread of each slot keeps its own stack: a stack passed from one fiber to an unordered other would
// look like a race on its frames.
std::vector<char *> slot_stacks[emu::kSlots];
#endif

[[noreturn]] void to_host() {
  gthread *t = T;
#ifdef BL_EMU_TSAN
  __tsan_switch_to_fiber(host_fiber, kTsanNoSync);
#endif
  emu_ctx_switch(&t->sp, host_sp);
  __builtin_unreachable();
}

// Blocks the calling GPU thread until the scheduler resumes it.
void wait_here() {
  gthread *t = T;
#ifdef BL_EMU_TSAN
  __tsan_switch_to_fiber(host_fiber, kTsanNoSync);
#endif
  emu_ctx_switch(&t->sp, host_sp);
  emu::cur = T = t;
}

void fiber_main() {
#ifdef BL_EMU_TSAN
  slot_run *s = S;
  const int parity = (int)(s->blocks & 1);
  __tsan_acquire(&G->grid_start);           // what the host did before the launch
  __tsan_acquire(&s->end_sync[parity ^ 1]); // the slot's previous block
#endif
  (*G->body)();
#ifdef BL_EMU_TSAN
  __tsan_release(&s->end_sync[parity]);
  __tsan_release(&G->grid_end);
#endif
  T->st = DONE;
  to_host();
}

void start(slot_run &s, gthread *t) {
#ifdef BL_EMU_TSAN
  size_t i = (size_t)(t - s.th.data());
  std::vector<char *> &stacks = slot_stacks[s.index];
  while (stacks.size() <= i) stacks.push_back(get_stack());
  t->stack = stacks[i];
#else
  (void)s;
  t->stack = get_stack();
#endif
  uintptr_t top = ((uintptr_t)t->stack + kStack) & ~(uintptr_t)15;
  void **sp = (void **)top;
  *--sp = nullptr;                             // fake return address of fiber_main: keeps the ABI's stack alignment
  *--sp = (void *)&fiber_main;                 // where emu_ctx_switch's ret goes
  for (int i = 0; i < 6; i++) *--sp = nullptr; // rbp rbx r12..r15
  t->sp = sp;
}

std::string where(const gthread &t) {
  char b[400];
  if (t.st == DONE)
    snprintf(b, sizeof b, "thread (%u,%u,%u) exited", t.tid.x, t.tid.y, t.tid.z);
  else
    snprintf(b, sizeof b, "thread (%u,%u,%u) at %s %s:%d", t.tid.x, t.tid.y, t.tid.z, t.what, t.file, t.line);
  return b;
}

void fail(const slot_run &s, const std::string &msg) {
  if (G->failed) return;
  G->failed = true;
  const emu::launch_cfg &c = *G->cfg;
  emu_fault("kernel %s (launched at %s:%d), block (%u,%u,%u): %s", c.name, c.file, c.line, s.idx.x, s.idx.y, s.idx.z,
            msg.c_str());
}

unsigned warp_lanes(int w) {
  int n = G->n - 32 * w;
  return n >= 32 ? 0xffffffffu : (1u << n) - 1u;
}

// A warp collective that names a lane which has exited can never complete. Checked both when a lane
// arrives and when a lane exits, so the report does not depend on the order the scheduler ran them in.
bool fail_if_lane_exited(slot_run &s, int warp) {
  const warp_op &op = s.warps[(size_t)warp];
  if (op.arrived == 0) return false;
  const gthread *w0 = &s.th[(size_t)warp * 32];
  for (int j = 0; j < 32; j++)
    if (((op.mask >> j) & 1u) && w0[j].st == DONE) {
      char b[512];
      snprintf(b, sizeof b, "%s at %s:%d with mask 0x%08x: lane %d has exited", op.what, op.file, op.line, op.mask, j);
      fail(s, b);
      return true;
    }
  return false;
}

// A lane arrived at a warp collective (host context).
void warp_arrive(slot_run &s, gthread *t) {
  warp_op &op = s.warps[(size_t)t->warp];
  gthread *w0 = &s.th[(size_t)t->warp * 32];
  char b[512];
  if (!((t->mask >> t->lane) & 1u)) {
    snprintf(b, sizeof b, "%s at %s:%d: calling lane %d is not in its mask 0x%08x", t->what, t->file, t->line, t->lane,
             t->mask);
    return fail(s, b);
  }
  if (t->mask & ~warp_lanes(t->warp)) {
    snprintf(b, sizeof b, "%s at %s:%d: mask 0x%08x names lanes that do not exist (warp %d has lanes 0x%08x)", t->what,
             t->file, t->line, t->mask, t->warp, warp_lanes(t->warp));
    return fail(s, b);
  }
  if (op.arrived == 0) {
    op.mask = t->mask;
    op.what = t->what;
    op.file = t->file;
    op.line = t->line;
    op.bytes = t->bytes;
  } else if (op.mask != t->mask || op.file != t->file || op.line != t->line || op.bytes != t->bytes) {
    snprintf(b, sizeof b,
             "divergent warp collective in warp %d: lane %d at %s %s:%d (mask 0x%08x), lane %d at %s "
             "%s:%d (mask 0x%08x)",
             t->warp, __builtin_ctz(op.arrived), op.what, op.file, op.line, op.mask, t->lane, t->what, t->file, t->line,
             t->mask);
    return fail(s, b);
  }
  op.arrived |= 1u << t->lane;
  if (fail_if_lane_exited(s, t->warp)) return;
  if (op.arrived != op.mask) return;
  for (int i = 0; i < 32; i++) {
    if (!((op.mask >> i) & 1u)) continue;
    gthread &ti = w0[i];
    if (ti.all)
      for (int j = 0; j < 32; j++)
        if ((op.mask >> j) & 1u) quiet_copy((char *)ti.all + (size_t)j * op.bytes, w0[j].mine, op.bytes);
    ti.st = READY;
    push_run(s, (int)(&ti - s.th.data()));
  }
  op.arrived = 0;
}

void open_barrier(slot_run &s) {
  const gthread *first = nullptr;
  int count = 0;
  for (gthread &t : s.th) {
    if (t.st != BAR) continue;
    if (!first)
      first = &t;
    else if (t.file != first->file || t.line != first->line)
      return fail(s, "divergent __syncthreads: " + where(*first) + ", " + where(t));
    count += t.pred;
  }
  for (gthread &t : s.th)
    if (t.st == BAR) {
      t.st = READY;
      t.count = count;
      push_run(s, (int)(&t - s.th.data()));
    }
  s.at_bar = 0;
  s.gen++;
}

void deadlock(slot_run &s) {
  std::string msg = "a rendezvous can never complete:";
  int shown = 0;
  for (gthread &t : s.th)
    if (t.st == WARP || t.st == BAR || (t.st == DONE && shown < 4)) {
      if (++shown > 8) {
        msg += " ...";
        break;
      }
      msg += " " + where(t) + ";";
    }
  fail(s, msg);
}

void release_stack(gthread *t) {
#ifndef BL_EMU_TSAN
  if (t->stack) stack_pool.push_back(t->stack);
#endif
  t->stack = nullptr;
}

// Block b (linear index) starts in slot s: fresh shared memory (NaN bytes) and every thread runnable.
void start_block(slot_run &s, uint64_t b) {
  const emu::launch_cfg &c = *G->cfg;
  s.idx = { (unsigned)(b % c.grid.x), (unsigned)(b / c.grid.x % c.grid.y),
            (unsigned)(b / ((uint64_t)c.grid.x * c.grid.y)) };
  for (auto &r : shared_sections(s.index)) quiet_fill(r.first, 0xff, (size_t)(r.second - r.first));
  if (!s.dsmem.empty()) quiet_fill(s.dsmem.data(), 0xff, s.dsmem.size());
  s.wq.assign(s.warps.size(), {});
  s.live_warps.clear();
  s.nrun = 0;
  s.last_warp = -1;
  for (gthread &t : s.th) {
    t.st = NEW;
    push_run(s, (int)(&t - s.th.data()));
  }
  for (warp_op &w : s.warps) w.arrived = 0;
  s.done = s.at_bar = 0;
  s.blocks++;
  s.active = true;
}

// Runs one thread of slot s until it yields, waits at a rendezvous or exits; then, when none of the slot's threads
// can run, opens its barrier or ends its block.
void step(slot_run &s) {
  gthread *t = &s.th[(size_t)pop_run(s)];
  if (t->st == NEW) start(s, t);
  t->st = READY;
  S = &s;
  emu::slot = s.index;
  emu::blk.idx = s.idx;
  emu::cur = T = t;
#ifdef BL_EMU_TSAN
  __tsan_switch_to_fiber(t->fiber, kTsanNoSync);
#endif
  emu_ctx_switch(&host_sp, t->sp);
  T = nullptr;
  if (G->failed) return;
  if (t->st == DONE) {
    s.done++;
    release_stack(t);
    fail_if_lane_exited(s, t->warp);
  } else if (t->st == BAR)
    s.at_bar++;
  else if (t->st == WARP)
    warp_arrive(s, t);
  else if (t->st == YIELD)
    push_run(s, (int)(t - s.th.data()));
  if (G->failed || s.nrun > 0) return;
  if (s.done == G->n)
    s.active = false;
  else if (s.at_bar > 0 && s.at_bar + s.done == G->n)
    open_barrier(s);
  else
    deadlock(s);
}

} // namespace

uint64_t emu_seed() {
  static uint64_t seed = [] {
    const char *s = getenv("BL_EMU_SEED");
    return s && *s ? strtoull(s, nullptr, 0) : 1ull;
  }();
  return seed;
}

int emu_blocks_in_flight() {
  static int n = [] {
    const char *e = getenv("BL_EMU_BLOCKS");
    if (!e || !*e) return 1;
    char *end = nullptr;
    long v = strtol(e, &end, 10);
    if (*end || v < 1 || v > emu::kSlots) {
      fprintf(stderr, "bertlua emulated CUDA: BL_EMU_BLOCKS=%s: expected a number of blocks from 1 to %d\n", e,
              emu::kSlots);
      exit(2);
    }
    return (int)v;
  }();
  return n;
}

bool emu_in_gpu_thread() { return T != nullptr; }

bool emu_is_stack_guard(const void *addr) {
  for (auto &r : stack_ranges)
    if ((const char *)addr >= r.first && (const char *)addr < r.second) return true;
  return false;
}

[[noreturn]] void emu_abandon_thread() {
  if (G) G->failed = true;
  to_host();
}

void emu_run_grid(const emu::launch_cfg &c, const std::function<void()> &body, uint64_t launch_no) {
  grid_run g;
  g.cfg = &c;
  g.body = &body;
  g.n = (int)(c.block.x * c.block.y * c.block.z);
  g.rng = emu_seed() * 0x2545F4914F6CDD1Dull + launch_no;
  const uint64_t nb = (uint64_t)c.grid.x * c.grid.y * c.grid.z;
  g.slots.resize((size_t)std::min<uint64_t>(nb, (uint64_t)emu_blocks_in_flight()));
#ifdef BL_EMU_TSAN
  if (!host_fiber) host_fiber = __tsan_get_current_fiber();
  static std::vector<void *> fibers[emu::kSlots]; // TSan fibers are reused across grids (creating one is costly)
#endif
  for (size_t k = 0; k < g.slots.size(); k++) {
    slot_run &s = g.slots[k];
    s.index = (int)k;
    s.th.resize((size_t)g.n);
    s.warps.resize((size_t)(g.n + 31) / 32);
    s.dsmem.resize(c.smem);
    for (int i = 0; i < g.n; i++) {
      gthread &t = s.th[(size_t)i];
      t.tid = { (unsigned)i % c.block.x, (unsigned)(i / c.block.x) % c.block.y,
                (unsigned)(i / (c.block.x * c.block.y)) };
      t.lane = i & 31;
      t.warp = i >> 5;
#ifdef BL_EMU_TSAN
      while (fibers[k].size() <= (size_t)i) fibers[k].push_back(__tsan_create_fiber(kTsanNoSync));
      t.fiber = fibers[k][(size_t)i];
#endif
    }
  }
  grid_run *saved = G; // not nested in practice; kept correct anyway
  slot_run *saved_s = S;
  G = &g;
  emu::blk.dim = c.block;
  emu::blk.grid = c.grid;
  std::vector<uint32_t> order;
  if (nb <= (1u << 22)) { // blocks in a random order too (they are independent on a GPU)
    order.resize(nb);
    for (uint64_t i = 0; i < nb; i++) order[i] = (uint32_t)i;
    for (uint64_t i = nb; i > 1; i--) std::swap(order[i - 1], order[next_rand() % i]);
  }
  emu::interleave = g.slots.size() > 1;
#ifdef BL_EMU_TSAN
  __tsan_release(&g.grid_start);
#endif
  uint64_t next = 0;
  std::vector<slot_run *> runnable;
  while (!g.failed) {
    runnable.clear();
    for (slot_run &s : g.slots) {
      if (!s.active && next < nb) {
        start_block(s, order.empty() ? next : order[next]);
        next++;
      }
      if (s.active) runnable.push_back(&s);
    }
    if (runnable.empty()) break;
    step(runnable.size() == 1 ? *runnable[0] : *runnable[(size_t)(next_rand() % runnable.size())]);
  }
  emu::interleave = false;
#ifdef BL_EMU_TSAN
  __tsan_acquire(&g.grid_end);
#endif
  if (g.failed) // abandoned fibers: their stacks go back to the pool
    for (slot_run &s : g.slots)
      for (gthread &t : s.th) release_stack(&t);
  emu::slot = 0;
  G = saved;
  S = saved_s;
}

// ---------------------------------------------------------------- device-side entry points (emu_device.h)
namespace emu {
void syncthreads(const char *file, int line) { syncthreads_count(file, line, 0); }

int syncthreads_count(const char *file, int line, int pred) {
  if (!T) trap("__syncthreads outside a kernel", file, line);
  gthread *t = T;
  t->st = BAR;
  t->what = "__syncthreads";
  t->file = file;
  t->line = line;
  t->pred = pred != 0;
#ifdef BL_EMU_TSAN
  char *obj = &S->bar_sync[S->gen & 1];
  __tsan_release(obj);
  wait_here();
  __tsan_acquire(obj);
#else
  wait_here();
#endif
  return t->count;
}

static void warp_wait(unsigned mask, const void *mine, void *all, size_t bytes, const char *what, const char *file,
                      int line) {
  if (!T) trap("warp collective outside a kernel", file, line);
  gthread *t = T;
  t->st = WARP;
  t->what = what;
  t->file = file;
  t->line = line;
  t->mask = mask;
  t->mine = mine;
  t->all = all;
  t->bytes = bytes;
  wait_here();
}

void warp_gather(unsigned mask, const void *mine, void *all, size_t bytes, const char *what, const char *file,
                 int line) {
  warp_wait(mask, mine, all, bytes, what, file, line); // shuffles and votes order no memory accesses
}

void syncwarp(unsigned mask, const char *file, int line) {
#ifdef BL_EMU_TSAN
  warp_op &op = S->warps[(size_t)T->warp];
  char *obj = &op.sync[op.gen & 1];
  __tsan_release(obj);
  warp_wait(mask, nullptr, nullptr, 0, "__syncwarp", file, line);
  __tsan_acquire(obj);
  if (T->lane == __builtin_ctz(mask)) op.gen++;
#else
  warp_wait(mask, nullptr, nullptr, 0, "__syncwarp", file, line);
#endif
}

int lane() { return T ? T->lane : 0; }

void register_shared(int slot, char *begin, char *end) {
  if (begin == end) return;
  for (auto &r : shared_sections(slot))
    if (r.first == begin) return;
  shared_sections(slot).push_back({ begin, end });
}

void *dyn_smem() { return T ? S->dsmem.data() : nullptr; }

void yield() {
  if (!T) return;
  T->st = YIELD;
  wait_here();
}

[[noreturn]] void trap(const char *what, const char *file, int line) {
  emu_fault("%s at %s:%d", what, file, line);
  if (T) emu_abandon_thread();
  abort(); // a device entry point called from host code: nothing sensible to go on with
}
} // namespace emu

void emu_warp_gather(const void *mine, void *all, size_t bytes, const char *where) {
  emu::warp_gather(0xffffffffu, mine, all, bytes, "emu_warp_gather", where, 0);
}

int emu_lane_id() { return emu::lane(); }
