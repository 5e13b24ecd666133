// Files read through a memory map (token files, checkpoint and safetensors files) and what the
// process says when one of them is truncated or replaced while mapped: a read of a page past the
// file's new end raises SIGBUS, whose default action kills the process with no word (and, for a
// checkpoint being resumed, with nothing to say which file). The handler installed with the first
// watched mapping names the file, says what to do, and ends the process with status 1; a SIGBUS
// at any other address goes to the handler that was there before (MPI's, or the default).
#pragma once

#include <cstddef>
#include <string>

namespace moe {

// Watches [p, p + bytes), the mapping of `path`; `advice` ends the message ("restore it and ...").
// Thread-safe; slots of unwatched mappings are reused. Past 4096 live mappings a fault in a new
// one is still reported, without the file's name. Call unwatch_mapping once per watched mapping.
void watch_mapping(const void* p, size_t bytes, const std::string& path, const char* advice);
// Before the mapping at p is unmapped.
void unwatch_mapping(const void* p);

}  // namespace moe
