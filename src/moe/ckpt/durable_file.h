// Durable file-system steps shared by the safetensors writer, checkpoints and the run's records:
// write to a temp name, fsync, rename, fsync the directory (after a crash a file either has its
// old content or its complete new content, never a prefix); append a whole record or nothing;
// name a new folder so that nothing existing is overwritten.
#pragma once

#include <string>
#include <string_view>
#include <vector>

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

// The same for a file that may be a symbolic link (metrics.jsonl -> a file on another disk): the
// file it names gets the new content and the link stays. A plain file is write_file_atomic's.
void rewrite_file_atomic(const std::string& path, std::string_view bytes);

// Moves the entries `names` of folder `from_dir` into folder `to_dir` under the same names (one
// rename each), refusing, before anything moves, a name that exists there. Relative links that
// the move would break (an entry that is one, or one inside an entry that is a folder, whose
// target lies outside everything moved) are first made to name the same by absolute path, in
// place: renamed into another folder they would name nothing. Links between the moved entries
// stay as they are. What a link names is never moved or looked at. A crash leaves the entries not
// yet renamed whole, with some of their links absolute.
void move_entries(const std::string& from_dir, const std::vector<std::string>& names, const std::string& to_dir);

// The same for an output that must be new (`what`, e.g. "bench --json", starts the error): the
// finished file is moved to `path` only while nothing has that name, so a file that appeared
// there meanwhile, or a symbolic link, is never replaced; then the temp file is removed and
// moe::Error says "<what> <path> exists; ...".
void write_new_file_atomic(const std::string& path, std::string_view bytes, const char* what);

// The whole content of the file at `path`; moe::Error "cannot read <what> '<path>': <reason>"
// when it cannot be opened.
std::string read_whole_file(const std::string& path, const char* what);

// Appends all of `bytes` to the end of the open file `fd` (retrying interrupted writes). On failure
// the file is cut back to its old length, so a reader never finds part of a record, and moe::Error
// says "cannot write <what> '<path>': <reason>".
void append_whole(int fd, std::string_view bytes, const char* what, const std::string& path);

// A name "<UTC time yyyymmdd-hhmmss><suffix>" that does not exist yet in `parent`, with "-2", "-3",
// ... appended while it does: a new folder for files set aside, never one already there.
std::string unused_timestamped_name(const std::string& parent, const std::string& suffix);

}  // namespace moe
