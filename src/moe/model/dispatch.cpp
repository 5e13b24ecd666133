#include "moe/model/dispatch.h"

#include "moe/core/error.h"

namespace moe {

void LeasePools::init(int num_layers, int slots_per_layer) {
  MOE_CHECK(slots_per_layer >= 1, "lease pools need at least one slot per layer (parallel.lease_slots)");
  slots_ = slots_per_layer;
  busy_.assign(static_cast<size_t>(num_layers), std::vector<bool>(static_cast<size_t>(slots_per_layer), false));
}

int LeasePools::take(int layer) {
  MOE_CHECK(layer >= 0 && layer < static_cast<int>(busy_.size()), "no lease pool for layer ", layer);
  auto& pool = busy_[static_cast<size_t>(layer)];
  for (size_t s = 0; s < pool.size(); ++s)
    if (!pool[s]) {
      pool[s] = true;
      return static_cast<int>(s);
    }
  MOE_FAIL("lease pool 'layer ", layer, " expert buffers' is exhausted: all ", slots_,
           " slot(s) are held by microbatches whose backward has not run; raise parallel.lease_slots "
           "(microbatches in flight at once)");
}

void LeasePools::give_back(int layer, int slot) {
  MOE_CHECK(layer >= 0 && layer < static_cast<int>(busy_.size()) && slot >= 0 && slot < slots_ &&
                busy_[static_cast<size_t>(layer)][static_cast<size_t>(slot)],
            "release of a lease (layer ", layer, ", slot ", slot, ") that is not held");
  busy_[static_cast<size_t>(layer)][static_cast<size_t>(slot)] = false;
}

}  // namespace moe
