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

}  // namespace moe
