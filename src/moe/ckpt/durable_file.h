// Durable file-system steps shared by the safetensors writer and checkpoints: write to a temp
// name, fsync, rename, fsync the directory. After a crash a file either has its old content
// or its complete new content, never a prefix.
#pragma once

#include <string>
#include <string_view>

namespace moe {

// strerror(errno) as a string, for "cannot X: <reason>" messages.
std::string errno_text();

// Flushes a directory entry table (after a create, rename or unlink inside `dir`).
void fsync_dir(const std::string& dir);

// Parent directory of `path` ("." when there is none).
std::string parent_dir(const std::string& path);

// Writes `bytes` to "<path>.tmp-<pid>", fsyncs it and renames it to `path`, then fsyncs the
// parent directory. On failure the temp file is removed and moe::Error names the path.
void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace moe
