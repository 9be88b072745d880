/* libFuzzer target for the TensorFlow checkpoint reader (src/io/tf_checkpoint.c).
 * Input: 4-byte little-endian length N, N bytes of PREFIX.index, the rest is
 * PREFIX.data-00000-of-00001. Seed: tests/fuzz/corpus/tf_checkpoint (written
 * by tf.compat.v1.train.Saver). Build with -DBERTLUA_FUZZ=ON (clang), run:
 *   build-fuzz/fuzz_tf_checkpoint tests/fuzz/corpus/tf_checkpoint -max_total_time=600
 */
#include "fuzz_ckpt_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static char prefix[64], index[80], shard[96];
  if (!prefix[0]) {
    snprintf(prefix, sizeof prefix, "/tmp/fuzz_tf_%d", (int)getpid());
    snprintf(index, sizeof index, "%s.index", prefix);
    snprintf(shard, sizeof shard, "%s.data-00000-of-00001", prefix);
  }
  if (size < 4) return 0;
  uint32_t n = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
  if (n > size - 4) n = (uint32_t)(size - 4);
  write_file(index, data + 4, n);
  write_file(shard, data + 4 + n, size - 4 - n);
  bl_ckpt *c = NULL;
  int rc = bl_ckpt_open_tf(prefix, &c);
  check_ckpt(rc, c, prefix); /* the index or the shard */
  return 0;
}
