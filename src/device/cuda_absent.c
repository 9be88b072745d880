/* Device layer of a CPU-only build (configured without nvcc or with
 * -DBERTLUA_CUDA=OFF): every request for a GPU is a clear error. */
#include "../base/internal.h"

static int no_cuda(int device, const char *op) {
  return bl_set_error(BL_EDEVICE, "%s: cuda:%d requested, but this bertlua was built without CUDA", op, device);
}

int bl_cuda_compiled(void) { return 0; }
int bl_nccl_compiled(void) { return 0; }
int bl_cuda_device_count(void) { return 0; }
int bl_cuda_device_name(int device, char *buf, int buflen) {
  if (buf && buflen > 0) buf[0] = 0;
  return no_cuda(device, "device_name");
}
int bl_cuda_synchronize(int device) { return no_cuda(device, "synchronize"); }
void bl_cuda_set_tf32(int enable) { (void)enable; }
int bl_cuda_counters(int device, bl_cuda_count *out) {
  memset(out, 0, sizeof *out);
  return no_cuda(device, "counters");
}
int bl_cuda_get_tf32(void) { return 0; }
int bl_cuda_graph_new(int device, bl_cuda_graph **out) {
  *out = NULL;
  return no_cuda(device, "cuda_graph");
}
void bl_cuda_graph_free(bl_cuda_graph *g) { (void)g; }
int bl_cuda_graph_begin(bl_cuda_graph *g) {
  (void)g;
  return no_cuda(0, "cuda_graph");
}
int bl_cuda_graph_end(bl_cuda_graph *g) { return bl_cuda_graph_begin(g); }
void bl_cuda_graph_abort(bl_cuda_graph *g) { (void)g; }
int bl_cuda_graph_launch(bl_cuda_graph *g) { return bl_cuda_graph_begin(g); }
int bl_cuda_graph_replay(bl_cuda_graph *g) { return bl_cuda_graph_begin(g); }
int bl_cuda_graph_set_inputs(bl_cuda_graph *g, bl_tensor *dst, const void *src, size_t n) {
  (void)dst;
  (void)src;
  (void)n;
  return bl_cuda_graph_begin(g);
}
int bl_cuda_graph_replayable(const bl_cuda_graph *g, int *ok) {
  (void)g;
  *ok = 0;
  return 0;
}
int bl_cuda_graph_stats_get(const bl_cuda_graph *g, bl_cuda_graph_stats *out) {
  (void)g;
  memset(out, 0, sizeof *out);
  return no_cuda(0, "cuda_graph");
}
int bl_cuda_defer_checks(int device, int enable) {
  (void)enable;
  return no_cuda(device, "defer_checks");
}
int bl_cuda_check_deferred(int device) { return no_cuda(device, "check_deferred"); }
int bl_cuda_deferred_pending(int device, bl_tensor *flag) {
  (void)flag;
  return no_cuda(device, "deferred_pending");
}
int bl_cuda_record_begin(int device) { return no_cuda(device, "record"); }
int bl_cuda_dry_run(int device, int on) {
  (void)on;
  return no_cuda(device, "dry_run");
}
int bl_cuda_record_timing(int device, int on) {
  (void)on;
  return no_cuda(device, "record");
}
int bl_cuda_record_end(int device, int64_t *count) {
  *count = 0;
  return no_cuda(device, "record");
}
int bl_cuda_record_mark(int device, int64_t *count) {
  *count = 0;
  return no_cuda(device, "record");
}
int bl_cuda_record_get(int64_t i, bl_cuda_launch_rec *out) {
  (void)out;
  return bl_set_error(BL_EINVAL, "record: launch %lld: this bertlua was built without CUDA", (long long)i);
}
int bl_dev_check(int device, const char *op) { return no_cuda(device, op); }
int bl_dev_malloc(int device, size_t n, void **p) {
  (void)n;
  *p = NULL;
  return no_cuda(device, "malloc");
}
void bl_dev_free(int device, void *p) {
  (void)device;
  (void)p;
}
int bl_dev_memcpy(int dst_device, void *dst, int src_device, const void *src, size_t n) {
  if (dst_device < 0 && src_device < 0) {
    memcpy(dst, src, n);
    return 0;
  }
  return no_cuda(dst_device >= 0 ? dst_device : src_device, "copy");
}
int bl_dev_memset(int device, void *p, int value, size_t n) {
  if (device < 0) {
    memset(p, value, n);
    return 0;
  }
  return no_cuda(device, "memset");
}
