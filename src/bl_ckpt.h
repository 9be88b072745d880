/* bertlua — readers for the checkpoints users already have, no Python needed.
 *
 * TensorFlow (Google's BERT, NVIDIA's TF recipes): a TensorBundle, i.e.
 * PREFIX.index (an SSTable of BundleHeaderProto/BundleEntryProto protobufs)
 * plus PREFIX.data-NNNNN-of-MMMMM shards of raw little-endian tensors.
 * bl_ckpt_open_tf checks the whole index on open (block trailers and their
 * crc32c, key order, every entry's shard/offset/size against the shard files)
 * and bl_ckpt_read checks each tensor's crc32c as TensorFlow does.
 *
 * PyTorch (`torch.save`, transformers' pytorch_model.bin, NVIDIA's .pt): a
 * zip archive with ARCHIVE/data.pkl and one stored (uncompressed) entry per
 * storage, ARCHIVE/data/KEY. The pickle is run by a small VM that knows only
 * the opcodes a state dict needs and only these globals: the torch rebuild
 * functions (torch._utils._rebuild_tensor_v2, _rebuild_tensor,
 * _rebuild_parameter), the storage types (torch.FloatStorage, ...) and
 * collections.OrderedDict. Anything else is refused by name before anything
 * could run. Every tensor reachable from the pickled object is an entry,
 * named by its path of dict keys / list indices joined with "." (a state
 * dict gives its own names; {"model": sd} gives "model.<name>"). Storages are
 * checked against the zip entry's CRC-32 on read. The legacy format (pickles
 * followed by the raw storages, _use_new_zipfile_serialization=False) is read
 * too; it has no checksums.
 *
 * Entries whose dtype bertlua does not have (TF strings, int16, ...) are
 * listed with dtype -1 and bl_ckpt_source_dtype() naming it; reading one is
 * an error. Every error names the file and, where there is one, the tensor.
 */
#ifndef BL_CKPT_H
#define BL_CKPT_H
#include "bl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* BL_CDEF_BEGIN */
typedef struct bl_ckpt bl_ckpt;
/* prefix: the path without ".index" (as tf.train.Saver names it), or the .index path itself. */
int bl_ckpt_open_tf(const char *prefix, bl_ckpt **res);
/* path: a torch.save file: the zip archive format (torch >= 1.6), or the legacy one before it. */
int bl_ckpt_open_torch(const char *path, bl_ckpt **res);
int64_t bl_ckpt_count(const bl_ckpt *c);
/* Entry i (0-based): its name (owned by c), dtype (BL_* or -1), ndim and shape (up to 8 dims written). */
int bl_ckpt_entry(const bl_ckpt *c, int64_t i, const char **name, int *dtype, int *ndim, int64_t *shape);
/* The dtype as the file names it ("DT_FLOAT", "torch.FloatStorage"...). */
const char *bl_ckpt_source_dtype(const bl_ckpt *c, int64_t i);
/* Entry i's elements, row-major in its own dtype, into dst (exactly nbytes = numel * dtype size);
 * checks the stored checksum first. */
int bl_ckpt_read(bl_ckpt *c, int64_t i, void *dst, int64_t nbytes);
void bl_ckpt_close(bl_ckpt *c);
/* CRC-32C (Castagnoli, as TensorFlow and LevelDB use it), continuing from crc (start with 0). */
uint32_t bl_crc32c(uint32_t crc, const void *data, size_t n);
/* CRC-32 (IEEE, as zip uses it), continuing from crc (start with 0). */
uint32_t bl_crc32(uint32_t crc, const void *data, size_t n);
/* BL_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif
