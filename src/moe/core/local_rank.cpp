#include "moe/core/local_rank.h"

#include <cstdlib>
#include <initializer_list>

namespace moe {

int local_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}

}  // namespace moe
