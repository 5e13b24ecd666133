// Text through host collectives (the Communicator moves F32/I32 tensors): the small variable-
// length messages of start-up and checkpoint protocols, such as chunk records or a config.
// `comm` must hold host buffers (MPI or the one-process communicator), not NCCL.
#pragma once

#include <string>
#include <vector>

#include "moe/comm/communicator.h"

namespace moe {

// Every rank's string, in rank order, on every rank (collective).
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine);
// Rank root's string on every rank (collective; `text` is read on root only).
std::string broadcast_string(Communicator& comm, const std::string& text, int root);

// Whether every rank holds the same string: one small reduction of a hash when they do; when
// they do not, the strings are gathered and the result names the first rank that differs from
// rank 0 (the same on every rank). Collective.
struct StringAgreement {
  int differing_rank = -1;        // -1: every rank agrees
  std::string leader, differing;  // rank 0's string and that rank's
  // For outcomes that are not unanimous (ranks' successes alike, failures named): the lowest failing
  // rank and its string, rank 0's when rank 0 failed, else the first rank that differs from its
  // success. Every rank gets the same answer.
  int lowest_failing_rank(bool leader_failed) const { return leader_failed ? 0 : differing_rank; }
  const std::string& lowest_failure(bool leader_failed) const { return leader_failed ? leader : differing; }
};
StringAgreement agree_on_string(Communicator& comm, const std::string& text);

}  // namespace moe
