// Start-up check that every rank of a job runs the same resolved config. Ranks given different
// files, --set overrides or flags would otherwise disagree on buffer sizes and step counts and
// crash in a collective or wait forever; one small collective finds it first.
#pragma once

#include "moe/comm/communicator.h"
#include "moe/train/config.h"

namespace moe {

// Collective over `host` (host buffers: MPI or the one-process communicator). Every rank hashes
// its config; when the hashes differ, the configs are gathered and every rank throws the same
// error naming the first differing key and the ranks' values.
void check_config_agrees(const Config& cfg, Communicator& host);

}  // namespace moe
