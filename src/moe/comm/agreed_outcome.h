// Start-up work whose errors every rank usually meets alike: the data files, the evaluation sets,
// the checkpoint to resume from, the config against the world size. Run bare, each rank that
// fails ends the job by MPI_Abort, so a mistyped data.path under mpirun printed one line per rank
// under Open MPI's abort banner. Here every rank runs the work, then the ranks compare outcomes
// (one collective): the same error on every rank is rethrown as a moe::AgreedError, which the job
// prints once (apps/cli/job.h); an error only some ranks meet (a file one node cannot read, a
// checkpoint range one rank reads) becomes one AgreedError on every rank too, the lowest failing
// rank's, named ("rank 1: ..."). A signal or out-of-memory keeps its own exit on the rank that met
// it. None is left waiting in a collective.
#pragma once

#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "moe/comm/host_strings.h"
#include "moe/core/error.h"

namespace moe {

namespace detail {
// After the comparison: throws when any rank failed (see above). `error` is null when this rank
// did not fail; `what` is its message then.
void settle_outcome(Communicator& world, const std::string& what, const std::exception_ptr& error);
}  // namespace detail

// Collective over `world`, which must be the whole job's (host buffers: MPI or the one-process
// communicator): an error agreed over part of the job would be printed by none of its ranks but
// one, and the others would wait for it. Every rank calls it at the same point. Returns what
// `work` returns when no rank failed.
template <typename Work>
auto agree_on_outcome(Communicator& world, Work&& work) -> std::invoke_result_t<Work&> {
  using Result = std::invoke_result_t<Work&>;
  if constexpr (std::is_void_v<Result>) {
    agree_on_outcome(world, [&] { return work(), true; });
  } else {
    std::optional<Result> result;
    std::string what;
    std::exception_ptr error;
    try {
      result.emplace(work());
    } catch (const std::exception& e) {
      what = e.what(), error = std::current_exception();
    }
    detail::settle_outcome(world, what, error);  // throws unless every rank has its result
    return std::move(*result);
  }
}

// Work only rank 0 does, because every rank must use its one answer (the newest checkpoint of a
// run that may save another meanwhile): its string on every rank, or its error, as an
// AgreedError, on every rank. Collective.
std::string leader_decides(Communicator& world, const std::function<std::string()>& work);

}  // namespace moe
