#include "moe/data/prepare_outputs.h"

#include <sys/types.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>

#include "moe/data/token_folder.h"

namespace moe {

namespace fs = std::filesystem;

long leftover_temp_pid(const std::string& name) {
  const auto strip_tmp = [](std::string& n) -> long {  // removes one ".tmp-<digits>" ending
    const size_t tag = n.rfind(".tmp-");
    if (tag == std::string::npos || tag + 5 == n.size() || n.size() - tag - 5 > 9 ||
        n.find_first_not_of("0123456789", tag + 5) != std::string::npos)
      return 0;
    const long pid = std::strtol(n.c_str() + tag + 5, nullptr, 10);
    n.resize(tag);
    return pid;
  };
  if (name.size() < 2 || name[0] != '.') return 0;
  std::string target = name.substr(1);
  const long pid = strip_tmp(target);
  if (pid <= 0) return 0;
  if (target.ends_with(".npy.tmp-" + std::to_string(pid))) strip_tmp(target);
  if (target != "dataset.json" && target != "write-check" && (target.size() <= 4 || !target.ends_with(".npy")))
    return 0;
  return pid;
}

void refuse_leftover_temps(const fs::path& out, const std::vector<std::string>& entries, bool has_dataset,
                           bool append) {
  std::vector<std::string> leftovers;
  std::vector<long> running;
  for (const std::string& name : entries)
    if (const long pid = leftover_temp_pid(name); pid > 0) {
      leftovers.push_back(printable((out / name).string()));
      if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) running.push_back(pid);
    }
  if (leftovers.empty()) return;
  const bool one = leftovers.size() == 1;
  std::string whose = "the process that wrote " + std::string(one ? "it is" : "them are") + " gone, so " +
                      (one ? "it is" : "they are") + " safe to delete";
  if (!running.empty())
    whose = "a process with the id in " + std::string(one ? "its" : "a") + " name (" + std::to_string(running[0]) +
            ") is running: if it is a prepare or tokenize_hf.py writing into this folder, wait for it to end; "
            "otherwise " + (one ? "it is" : "they are") + " safe to delete";
  MOE_FAIL("prepare", append ? " --append" : "", ": output folder ", printable(out.string()), " holds ",
           one ? "a temporary file" : "temporary files", " left by an interrupted prepare or tokenize_hf.py (",
           file_name_list(leftovers), "), never part of the dataset; ", whose, ". Delete ", one ? "it" : "them",
           " and run again", has_dataset && !append ? " (with --append to add to the dataset there)" : "",
           "; nothing was written");
}

}  // namespace moe
