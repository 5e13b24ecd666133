// Stream: the execution queue an op runs on. On the CPU it carries nothing; on CUDA it wraps
// a cudaStream_t. Every op takes one so the call sites do not change when the device does.
#pragma once

namespace moe {

struct Stream {
  void* handle = nullptr;  // cudaStream_t on CUDA, unused on the CPU
};

}  // namespace moe
