#include "moe/comm/plan_communicator.h"

#include "moe/core/error.h"

namespace moe {

PlanCommunicator::PlanCommunicator(int rank, int size) : rank_(rank), size_(size) {
  MOE_CHECK(size >= 1 && rank >= 0 && rank < size, "PlanCommunicator: rank ", rank, " of ", size);
}

void PlanCommunicator::refuse(const char* what) {
  MOE_FAIL("memory planning does not communicate, but ", what, " was called");
}

}  // namespace moe
