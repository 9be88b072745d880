/* bertlua — the one way the C core opens a file to read it.
 *
 * bl_open_regular opens path read-only (O_CLOEXEC) with O_NONBLOCK, so that a
 * FIFO without a writer cannot block the open, then fstats the descriptor and
 * refuses anything but a regular file ("WHAT: PATH is a FIFO, not a regular
 * file"), and clears O_NONBLOCK again. Returns the descriptor (and the file's
 * size in *size when size is not NULL), or -1 with the error set; `what` names
 * the role in messages ("vocab file", "shard", "read"). */
#ifndef BL_OPEN_H
#define BL_OPEN_H
#include <stdint.h>

int bl_open_regular(const char *path, const char *what, int64_t *size);
/* "a directory", "a FIFO", ... for a st_mode that is not a regular file's (messages) */
const char *bl_file_kind(unsigned mode);

#endif
