// TEST DOUBLE of the emulated device's internal interface (emu_internal.h),
// for the self-tests of the emulated libraries only: enqueued work runs at
// once, and "device memory" is whatever host blocks the test registers.
#pragma once
#include <stddef.h>
void emu_double_register(const void *p, size_t bytes);
void emu_double_unregister(const void *p);
