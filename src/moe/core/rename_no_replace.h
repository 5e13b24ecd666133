// Moving a finished temporary file to a name that must be new: rename(2) replaces whatever has
// that name (a file that appeared since the caller checked, or a symbolic link, even one to
// nothing, which the check did not see), so an output that must never overwrite uses this instead.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>

namespace moe {

// Moves `from` to `to` only while nothing is named `to`. Returns false with errno set (EEXIST when
// something is) and `from` left in place on failure. renameat2(RENAME_NOREPLACE) where the file
// system has it; link + unlink where it does not (NFS, older kernels, a container's seccomp filter
// that answers EPERM for a system call it does not know).
inline bool rename_no_replace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return true;
  if (errno != EINVAL && errno != ENOSYS && errno != EPERM) return false;
  if (::link(from.c_str(), to.c_str()) != 0) return false;
  ::unlink(from.c_str());
  return true;
}

}  // namespace moe
