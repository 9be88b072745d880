/* bertlua — device dispatch of the C entry points (internal).
 *
 * Every public entry point of src/tensor and src/ops checks its arguments,
 * finds the one device all its tensors live on (mixed devices are an error
 * naming the op and both devices), and then, for cuda:N, hands over to its
 * CUDA twin (src/device/cuda_ops.h, kernels/<family>.cu) in one line:
 *
 *     if (dev >= 0) return BL_ON_CUDA(op, dev, bl_cuda_layernorm_forward(...));
 *
 * In a CUDA build BL_ON_CUDA is the call. In a CPU-only build the call is not
 * even compiled (the bl_cuda_* symbols do not exist there) and the macro is a
 * clear error instead: a cuda tensor cannot be created in such a build
 * (bl_tensor_empty fails in bl_dev_check), but bl_tensor_wrap can label any
 * memory with a device, so the guard stays.
 * An op without a CUDA twin returns BL_NO_CUDA_TWIN(op): "<op>: not
 * implemented on cuda", never touching device memory from the CPU. */
#ifndef BL_DEVICE_DISPATCH_H
#define BL_DEVICE_DISPATCH_H
#include "bl_base.h"
#ifdef BL_HAVE_CUDA
#include "cuda_ops.h"
#define BL_ON_CUDA(op, dev, call) ((void)(op), (void)(dev), (call))
#else
#define BL_ON_CUDA(op, dev, call) \
  bl_set_error(BL_EDEVICE, "%s: cuda:%d requested, but this bertlua was built without CUDA", (op), (int)(dev))
#endif
#define BL_NO_CUDA_TWIN(op, dev) \
  bl_set_error(BL_EUNSUPPORTED, "%s: not implemented on cuda (tensor on cuda:%d)", (op), (int)(dev))
#endif
