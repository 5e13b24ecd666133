#include "moe/comm/agreed_outcome.h"

#include "moe/core/interrupt_guard.h"

namespace moe::detail {

void settle_outcome(Communicator& world, const std::string& mine, const std::exception_ptr& error) {
  const StringAgreement a = agree_on_string(world, mine);
  if (a.differing_rank < 0) {
    if (mine.empty()) return;
    try {
      std::rethrow_exception(error);
    } catch (const Interrupted&) {
      throw;  // a signal keeps its own exit
    } catch (const AgreedError&) {
      throw;
    } catch (const std::exception&) {
      throw AgreedError(mine);
    }
  }
  if (error) std::rethrow_exception(error);
  const bool leader_failed = !a.leader.empty();
  MOE_FAIL("stopped at start-up: rank ", leader_failed ? 0 : a.differing_rank,
           " failed: ", leader_failed ? a.leader : a.differing);
}

}  // namespace moe::detail

namespace moe {

std::string leader_decides(Communicator& world, const std::function<std::string()>& work) {
  std::string outcome;  // "+" and the value, or "-" and the error
  if (world.rank() == 0) {
    try {
      const std::string value = work();
      outcome.reserve(value.size() + 1);
      outcome.push_back('+');
      outcome.append(value);
    } catch (const std::exception& e) {
      outcome.assign(1, '-');
      outcome.append(e.what());
    }
  }
  outcome = broadcast_string(world, outcome, 0);
  if (outcome[0] == '-') throw AgreedError(outcome.substr(1));
  return outcome.substr(1);
}

}  // namespace moe
