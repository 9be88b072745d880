/* libFuzzer target for the torch.save reader (src/io/torch_checkpoint.c): the
 * zip archive and the pickle VM. Input: the whole file. Seed:
 * tests/fuzz/corpus/torch_checkpoint (written by torch.save). Build with
 * -DBERTLUA_FUZZ=ON (clang), run:
 *   build-fuzz/fuzz_torch_checkpoint tests/fuzz/corpus/torch_checkpoint -max_total_time=600
 */
#include "fuzz_ckpt_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static char path[64];
  if (!path[0]) snprintf(path, sizeof path, "/tmp/fuzz_torch_%d.pt", (int)getpid());
  write_file(path, data, size);
  bl_ckpt *c = NULL;
  int rc = bl_ckpt_open_torch(path, &c);
  check_ckpt(rc, c, path);
  return 0;
}
