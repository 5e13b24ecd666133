#include "moe/train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "moe/ckpt/durable_file.h"
#include "moe/core/bounded_json.h"
#include "moe/core/error.h"
#include "moe/core/host_name.h"

namespace moe {

namespace {

std::string read_fd(int fd) {
  std::string text;
  char buf[512];
  ssize_t n;
  ::lseek(fd, 0, SEEK_SET);
  while ((n = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  return text;
}

// "process 123 on host h since 20261201-120000", or "" when the content is not a moetrain lock.
std::string holder(const std::string& text) {
  try {
    const nlohmann::json j = parse_bounded_json(text, "the run's lock file");
    return "process " + std::to_string(j.at("pid").get<int64_t>()) + " on host " + j.at("host").get<std::string>() +
           " since " + j.at("started").get<std::string>();
  } catch (const nlohmann::json::exception&) {
    return "";
  }
}

}  // namespace

RunLock::RunLock(std::string path) : path_(std::move(path)) {
  // A probe (run_lock_holder, or wandb_sidecar.py --follow asking whether a job runs) holds a
  // shared lock for an instant; a job holds its exclusive one for its whole life. Asking again for
  // kBusyFor tells the two apart, so a probe never refuses a job's start.
  const auto busy_until = std::chrono::steady_clock::now() + kBusyFor;
  for (int attempt = 0; attempt < 8 && fd_ < 0;) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    MOE_CHECK(fd >= 0, "cannot open the lock file ", path_, ": ", errno_text());
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string who = holder(read_fd(fd));
      ::close(fd);
      MOE_CHECK(err == EWOULDBLOCK, "cannot lock ", path_, ": ", std::strerror(err));
      if (std::chrono::steady_clock::now() < busy_until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      MOE_FAIL("the run directory is in use by ", who.empty() ? "another job" : who, " (", path_,
               "); wait for it to end, or choose another run.dir");
    }
    ++attempt;
    // The previous holder removes the file before it releases the lock: if this file is no longer
    // the one at the path, another job may lock a new one there, so start again with that.
    struct stat mine {}, at_path {};
    if (::fstat(fd, &mine) != 0 || ::stat(path_.c_str(), &at_path) != 0 || mine.st_ino != at_path.st_ino ||
        mine.st_dev != at_path.st_dev) {
      ::close(fd);
      continue;
    }
    const std::string text = read_fd(fd);
    if (!text.empty()) {
      const std::string who = holder(text);
      if (who.empty()) {
        ::close(fd);
        MOE_FAIL("the lock file ", path_, " is corrupt (not the pid, host and start time moetrain writes); if no job "
                 "is using this run directory, remove it and start again");
      }
      std::fprintf(stderr, "warning: %s was left by %s, which no longer holds it; taking it over\n", path_.c_str(),
                   who.c_str());
    }
    char started[32];
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    std::strftime(started, sizeof started, "%Y%m%d-%H%M%S", &tm);
    const std::string host = host_name();
    const std::string me = nlohmann::json{{"pid", static_cast<int64_t>(::getpid())},
                                          {"host", host.empty() ? "?" : host},
                                          {"started", started}}.dump() + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()) ||
        ::fsync(fd) != 0) {
      const std::string why = errno_text();
      ::unlink(path_.c_str());  // ours while we hold it: an emptied lock file is not left behind
      ::close(fd);
      MOE_FAIL("cannot write the lock file ", path_, ": ", why);
    }
    fd_ = fd;
  }
  MOE_CHECK(fd_ >= 0, "cannot take the lock ", path_, ": other jobs keep replacing it");
}

std::string run_lock_holder(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string who;
  // A shared lock conflicts only with a holder's exclusive one (two probes do not collide); a job
  // taking its lock in the instant this one is held asks again (RunLock, kBusyFor).
  if (::flock(fd, LOCK_SH | LOCK_NB) == 0) {
    ::flock(fd, LOCK_UN);
  } else if (errno == EWOULDBLOCK) {
    who = holder(read_fd(fd));
    if (who.empty()) who = "another job";
  }
  ::close(fd);
  return who;
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());
  ::close(fd_);
}

}  // namespace moe
