/* bertlua — the whole public C API. Include this one header.
 * The Lua bindings are generated from the headers below, in this order
 * (cmake/gen_cdef.c follows these #include lines). */
#ifndef BERTLUA_H
#define BERTLUA_H
#include "bl_base.h"
#include "bl_tensor.h"
#include "bl_dist.h"
#include "bl_corpus.h"
#include "bl_ops.h"
#include "bl_io.h"
#include "bl_ckpt.h"
#include "bl_stream.h"
#include "bl_tokenizer.h"
#include "bl_optim.h"
#include "bl_loader.h"
#endif
