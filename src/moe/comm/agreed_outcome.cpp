#include "moe/comm/agreed_outcome.h"

#include <new>

#include "moe/core/interrupt_guard.h"

namespace moe::detail {

void settle_outcome(Communicator& world, const std::string& what, const std::exception_ptr& error) {
  // "-" and the message for a rank that failed (the message may be empty), "" for one that did not.
  std::string mine;
  if (error) {
    mine.assign(1, '-');
    mine.append(what);
  }
  const StringAgreement a = agree_on_string(world, mine);
  if (a.differing_rank < 0) {
    if (!error) return;
    try {
      std::rethrow_exception(error);
    } catch (const Interrupted&) {
      throw;  // a signal keeps its own exit
    } catch (const std::bad_alloc&) {
      throw;  // main's out-of-memory message
    } catch (const AgreedError&) {
      throw;
    } catch (const std::exception&) {
      throw AgreedError(what);
    }
  }
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const Interrupted&) {
      throw;  // a signal keeps its own exit; the other ranks' agreed error below ends them
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception&) {
    }
  }
  // Not every rank alike: the lowest failing rank's error, named, agreed on every rank (printed
  // once by rank 0, no MPI_Abort). Another rank's different error shows once this one is fixed.
  const bool leader_failed = !a.leader.empty();
  throw AgreedError("rank " + std::to_string(a.lowest_failing_rank(leader_failed)) + ": " +
                    a.lowest_failure(leader_failed).substr(1));
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
    } catch (const Interrupted&) {
      throw;  // a signal or out of memory keeps its own report; the job ends by MPI_Abort
    } catch (const std::bad_alloc&) {
      throw;
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
