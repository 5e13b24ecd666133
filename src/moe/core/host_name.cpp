#include "moe/core/host_name.h"

#include <unistd.h>

namespace moe {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "";
  return buf;
}

}  // namespace moe
