// This machine's host name (gethostname), or "" when it cannot be read.
#pragma once

#include <string>

namespace moe {

std::string host_name();

}  // namespace moe
