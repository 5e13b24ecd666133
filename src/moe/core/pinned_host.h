// Page-locking host memory for the current GPU's copies. A device-to-host copy into pageable
// memory goes through the driver's staging buffer; into registered memory it runs by DMA at the
// link's rate. Used for memory that is copied into many times (train.async_save's kept snapshot),
// where the one-time cost of registering is paid back.
#pragma once

#include <cstddef>

namespace moe {

// cudaHostRegister of [host, host + bytes). False, with nothing done, in a build without CUDA, with
// no usable GPU, or where the registration is refused (a host limiting locked memory): copies
// then go through the staging buffer as before.
bool pin_host_memory(void* host, size_t bytes);
// Undoes a pin_host_memory that returned true.
void unpin_host_memory(void* host);

}  // namespace moe
