/* bertlua — text and data streams that lose nothing.
 *
 * bl_writer: the one way the project writes a file (JSON/JSONL/TSV outputs,
 * vocabularies, manifests, configs, shards, checkpoints). Bytes go through a
 * buffer to a fresh temporary in the destination's directory
 * ("<path>.tmp.XXXXXX", created exclusively); bl_writer_commit flushes, fsyncs,
 * closes, renames it over <path> and fsyncs the directory, so <path> is
 * either its old content or the complete new one — never a torn or empty
 * file after a full disk, a quota or a kill. Every write, flush, fsync, close
 * and rename is checked; the first failure is sticky (later writes return it)
 * and its message names <path> and the reason ("no space left on device").
 * bl_writer_abort (or a commit after a failure) removes the temporary.
 *
 * bl_lines: a byte-exact line reader. A line ends at "\n" only; its bytes are
 * returned as they are (NUL included, so nothing merges or shifts), with the
 * "\n" and, when strip_cr is set, one "\r" before it removed. A last line
 * without "\n" is still a line. Opening refuses what is not a regular file
 * (a FIFO would block, a directory gives no lines) with a message naming it.
 */
#ifndef BL_STREAM_H
#define BL_STREAM_H
#include "bl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* BL_CDEF_BEGIN */
typedef struct bl_writer bl_writer;
int bl_writer_open(const char *path, bl_writer **res);
int bl_writer_write(bl_writer *w, const void *src, int64_t n);
/* Publishes the file (see above) and frees w, whether it succeeds or not. */
int bl_writer_commit(bl_writer *w);
/* Drops the temporary and frees w; the destination is untouched. NULL is fine. */
void bl_writer_abort(bl_writer *w);
int64_t bl_writer_bytes(const bl_writer *w);
const char *bl_writer_path(const bl_writer *w);

typedef struct bl_lines bl_lines;
int bl_lines_open(const char *path, int strip_cr, bl_lines **res);
/* Next line: *line points at its *len bytes (valid until the next call),
 * *lineno is its 1-based number. Returns 1 for a line, 0 at the end, < 0 on a
 * read error (message names the file). */
int bl_lines_next(bl_lines *r, const char **line, int64_t *len, int64_t *lineno);
void bl_lines_close(bl_lines *r);
/* 0 when path names a regular file (or does not exist and may be created);
 * otherwise an error saying what it is. `what` names the role in the message. */
int bl_check_regular(const char *path, const char *what, int must_exist);
/* BL_CDEF_END */

#ifdef __cplusplus
}
#endif
#endif
