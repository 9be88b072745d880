/* bertlua — reading weight files and other binary artefacts.
 *
 * Reading: bl_file_open_read + bl_file_read_at do bounds-checked positional
 * reads straight into caller memory (a tensor's storage), so a hostile or
 * truncated file can never make us read past its end: a range beyond the
 * file is an error naming the file, the offset and the size.
 * Files are written by the checked atomic writer, bl_writer (bl_stream.h).
 */
#ifndef BL_IO_H
#define BL_IO_H
#include "bl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* BL_CDEF_BEGIN */
typedef struct bl_file bl_file;
int bl_file_open_read(const char *path, bl_file **res);
int bl_file_size(const bl_file *f, int64_t *size);
/* Reads exactly n bytes at offset into dst; error (nothing promised in dst) if
 * [offset, offset+n) is not inside the file or the read fails. */
int bl_file_read_at(bl_file *f, int64_t offset, void *dst, int64_t n);
/* Closes and frees f. NULL is fine. */
void bl_file_close(bl_file *f);
const char *bl_file_path(const bl_file *f);

/* File-system helpers (LuaJIT has no directory API). bl_fs_list_dir: sorted
 * names of the entries of `dir` that are regular files (what & BL_FS_FILES)
 * or directories (what & BL_FS_DIRS); names starting with '.' only with
 * BL_FS_HIDDEN ("." and ".." never). '\n'-separated, allocated (release with
 * bl_fs_free). */
enum { BL_FS_FILES = 1, BL_FS_DIRS = 2, BL_FS_HIDDEN = 4 };
int bl_fs_list_dir(const char *dir, int what, char **out, size_t *out_len);
void bl_fs_free(void *p);
int bl_fs_mkdir_p(const char *path);
int bl_fs_is_dir(const char *path);        /* 1 dir, 0 not (or missing) */
int64_t bl_fs_file_size(const char *path); /* -1 when missing */
/* BL_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif
