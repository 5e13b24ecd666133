#include "moe/ckpt/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "moe/core/error.h"
#include "moe/core/rename_no_replace.h"
#include "moe/core/wall_clock.h"

namespace moe {

namespace fs = std::filesystem;

std::string errno_text() { return std::strerror(errno); }

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  MOE_CHECK(fd >= 0, "cannot open directory ", dir, " to fsync it: ", errno_text());
  int rc = ::fsync(fd);
  int saved = errno;
  ::close(fd);
  errno = saved;
  MOE_CHECK(rc == 0, "cannot fsync directory ", dir, ": ", errno_text());
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

namespace {

// Writes and fsyncs `bytes` as "<path>.tmp-<pid>" and returns that name; on failure it is removed.
std::string write_synced_temp(const std::string& path, std::string_view bytes) {
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MOE_CHECK(fd >= 0, "cannot create ", tmp, ": ", errno_text());
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string why = errno_text();
      ::close(fd);
      ::unlink(tmp.c_str());
      MOE_FAIL("cannot write ", tmp, ": ", why);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    std::string why = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    MOE_FAIL("cannot fsync ", tmp, ": ", why);
  }
  ::close(fd);
  return tmp;
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = write_synced_temp(path, bytes);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = errno_text();
    ::unlink(tmp.c_str());
    MOE_FAIL("cannot rename ", tmp, " to ", path, ": ", why);
  }
  fsync_dir(parent_dir(path));
}

void rewrite_file_atomic(const std::string& path, std::string_view bytes) {
  std::error_code ec;
  if (!fs::is_symlink(path, ec)) return write_file_atomic(path, bytes);
  const fs::path target = fs::weakly_canonical(path, ec);
  MOE_CHECK(!ec, "cannot resolve the link ", path, ": ", ec.message());
  write_file_atomic(target.string(), bytes);
}

namespace {

// Whether `p` (absolute, normalized) lies inside `dir` (the same).
bool lexically_inside(const fs::path& p, const fs::path& dir) {
  const fs::path rel = p.lexically_relative(dir);
  return !rel.empty() && *rel.begin() != "..";
}

// Replaces the relative link `link` by one that names the same by absolute path: the folder the
// link lies in, resolved, less one level per leading ".." of the link's text, then the rest of
// that text as written (the kernel resolves it from there as it did before). What the link names
// is never looked at, so a link to something missing or unreadable moves as well as any. A
// temporary link renamed over the old one: the name never vanishes, and a crash leaves the old
// link or the new.
void make_link_absolute(const fs::path& link, const fs::path& target) {
  std::error_code ec;
  const fs::path folder = fs::canonical(fs::absolute(link, ec).parent_path(), ec);
  MOE_CHECK(!ec, "cannot resolve the folder of the link ", link.string(), ": ", ec.message());
  fs::path base = folder, rest;
  for (const fs::path& part : target) {
    if (rest.empty() && part == "..")
      base = base.parent_path();
    else if (!(rest.empty() && part == "."))
      rest /= part;
  }
  const std::string tmp = link.string() + ".tmp-link-" + std::to_string(::getpid());
  ::unlink(tmp.c_str());  // one a crashed move left
  fs::create_symlink(base / rest, tmp, ec);
  MOE_CHECK(!ec, "cannot create the link ", tmp, ": ", ec.message());
  if (std::rename(tmp.c_str(), link.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    MOE_FAIL("cannot replace the link ", link.string(), ": ", why);
  }
  fsync_dir(folder.string());
}

// The relative links among `entries` (absolute, normalized; one that is a link, or any inside one
// that is a folder: links to folders are not followed) that would name something else once the
// entries move together into another folder: those whose target lies outside all of them. A link
// to something that moves with it keeps naming it.
std::vector<std::pair<fs::path, fs::path>> links_that_a_move_breaks(const std::vector<fs::path>& entries) {
  std::vector<std::pair<fs::path, fs::path>> links;
  const auto consider = [&](const fs::path& link) {
    std::error_code ec;
    const fs::path target = fs::read_symlink(link, ec);
    if (ec || target.is_absolute()) return;
    const fs::path named = (link.parent_path() / target).lexically_normal();
    for (const fs::path& entry : entries)
      if (named == entry || lexically_inside(named, entry)) return;
    links.emplace_back(link, target);
  };
  for (const fs::path& entry : entries) {
    std::error_code ec;
    if (fs::is_symlink(entry, ec)) {
      consider(entry);
    } else if (fs::is_directory(entry, ec)) {
      for (auto it = fs::recursive_directory_iterator(entry, ec); !ec && it != fs::recursive_directory_iterator();
           it.increment(ec))
        if (it->is_symlink(ec)) consider(it->path());
      MOE_CHECK(!ec, "cannot list ", entry.string(), " to move it: ", ec.message());
    }
  }
  return links;
}

}  // namespace

void move_entries(const std::string& from_dir, const std::vector<std::string>& names, const std::string& to_dir) {
  std::error_code ec;
  const fs::path from = fs::absolute(from_dir, ec).lexically_normal();
  std::vector<fs::path> entries, dests;
  for (const std::string& name : names) {
    entries.push_back(from / name);
    dests.push_back(fs::path(to_dir) / name);
    MOE_CHECK(!fs::exists(fs::symlink_status(dests.back(), ec)), "cannot move ", entries.back().string(), " to ",
              dests.back().string(), ": that name exists (nothing was moved)");
  }
  for (const auto& [link, target] : links_that_a_move_breaks(entries)) make_link_absolute(link, target);
  for (size_t i = 0; i < entries.size(); ++i)
    MOE_CHECK(std::rename(entries[i].c_str(), dests[i].c_str()) == 0, "cannot move ", entries[i].string(), " to ",
              dests[i].string(), ": ", errno_text());
}

void write_new_file_atomic(const std::string& path, std::string_view bytes, const char* what) {
  const std::string tmp = write_synced_temp(path, bytes);
  if (!rename_no_replace(tmp, path)) {
    const bool exists = errno == EEXIST;
    std::string why = errno_text();
    ::unlink(tmp.c_str());
    MOE_CHECK(!exists, what, " ", path, " exists (it appeared while this command ran, or is a symbolic link); "
              "choose a new file name (nothing is overwritten)");
    MOE_FAIL("cannot rename ", tmp, " to ", path, ": ", why);
  }
  fsync_dir(parent_dir(path));
}

std::string read_whole_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "cannot read ", what, " '", path, "': ", errno_text());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void append_whole(int fd, std::string_view bytes, const char* what, const std::string& path) {
  const off_t before = ::lseek(fd, 0, SEEK_END);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n == 0 ? "no bytes written" : errno_text();
      if (before >= 0) (void)::ftruncate(fd, before);
      MOE_FAIL("cannot write ", what, " '", path, "': ", why);
    }
    done += static_cast<size_t>(n);
  }
}

std::string unused_timestamped_name(const std::string& parent, const std::string& suffix) {
  std::string name = utc_time("%Y%m%d-%H%M%S") + suffix;
  std::error_code ec;
  for (int n = 2; std::filesystem::exists(parent + "/" + name, ec); ++n)
    name = utc_time("%Y%m%d-%H%M%S") + suffix + "-" + std::to_string(n);
  return name;
}

}  // namespace moe
