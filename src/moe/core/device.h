// Which devices this process can use.
#pragma once

#include <string>

namespace moe {

// True when this binary has the CUDA backend and a CUDA device is usable; otherwise false with
// the reason in *why (no CUDA in this build, no driver, no device).
bool cuda_available(std::string* why = nullptr);

}  // namespace moe
