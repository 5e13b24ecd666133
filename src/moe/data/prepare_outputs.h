// What one `moetrain prepare` call writes before its dataset is complete, and how it is undone:
// the temporary token files and the output folders it creates, removed when the call fails or is
// interrupted (PrepareOutputs); and the temporaries an earlier, killed call left behind, which are
// named, never deleted (refuse_leftover_temps). Used by data/prepare.cpp only.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

#include "moe/core/error.h"
#include "moe/core/interrupt_guard.h"
#include "moe/core/printable.h"
#include "moe/core/signal_safe_write.h"

namespace moe {

// What this call creates and must remove when it fails or is interrupted: the temporary files
// and the output folders it creates. Every path is fixed when this is constructed; the counts say
// how many of them this process has claimed (a temporary file) or created (a folder) so far, so
// nothing it did not create is ever removed.
//
// NOTES: SIGINT, SIGTERM and SIGHUP (Ctrl-C, a scheduler, a closed terminal) are handled by
// removing those files and folders inside the handler, with unlink/rmdir/write only (all
// async-signal-safe), then dying of the same signal, so a calling shell or script sees the
// interruption as such (exit status 128 + signal). A flag checked in the write loop was the
// alternative: it would wait for the current input to be read, tokenized and written, which
// for one large input is the whole run. The handler reads only the fixed path arrays and atomic
// counts. While the temporary files are renamed to their final names, a signal is held back and
// raised once they all are, so an interruption leaves either the old dataset or the complete
// new one. A signal that was ignored when the call began (nohup, a background job of a shell)
// stays ignored.
class PrepareOutputs {
 public:
  PrepareOutputs(std::vector<std::string> temps, std::vector<std::string> dirs, const std::string& out_dir)
      : temps_(std::move(temps)), dirs_(std::move(dirs)), out_dir_(printable(out_dir)) {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;  // a signal held back while renaming must not fail a system call
    sigemptyset(&sa.sa_mask);
    for (int sig : kSignals) sigaddset(&sa.sa_mask, sig);  // one handler at a time
    g_active.store(this);
    for (size_t i = 0; i < std::size(kSignals); ++i) {
      struct sigaction old {};
      sigaction(kSignals[i], nullptr, &old);
      installed_[i] = old.sa_handler != SIG_IGN;
      if (installed_[i]) sigaction(kSignals[i], &sa, &previous_[i]);
    }
  }
  ~PrepareOutputs() {
    if (armed_) {
      std::error_code ec;
      for (size_t i = 0; i < temps_claimed_.load(); ++i) std::filesystem::remove(temps_[i], ec);
      for (size_t i = dirs_created_.load(); i-- > 0;) std::filesystem::remove(dirs_[i], ec);
    }
    restore_handlers();
  }
  PrepareOutputs(const PrepareOutputs&) = delete;
  PrepareOutputs& operator=(const PrepareOutputs&) = delete;

  // Claims the next temporary name (in construction order) after checking that it is free.
  const std::string& claim_temp() {
    const size_t i = temps_claimed_.load();
    std::error_code ec;
    MOE_CHECK(!std::filesystem::exists(std::filesystem::symlink_status(temps_[i], ec)), "prepare: ",
              printable(temps_[i]),
              " is in the way of a temporary file (left by an interrupted prepare whose process id this one "
              "reuses); delete it and run again");
    temps_claimed_.store(i + 1);
    return temps_[i];
  }
  // Creates the next folder (in construction order); it is removed again if the call fails.
  void create_next_dir() {
    const size_t i = dirs_created_.load();
    std::error_code ec;
    const bool created = std::filesystem::create_directory(dirs_[i], ec) && !ec;
    std::error_code link_ec;
    if (!created && std::filesystem::is_symlink(std::filesystem::symlink_status(dirs_[i], link_ec)) &&
        !std::filesystem::exists(dirs_[i], link_ec))
      MOE_FAIL("prepare: cannot create output folder ", printable(dirs_[i]),
               ": it is a symbolic link to nothing (to a missing ",
               printable(std::filesystem::read_symlink(dirs_[i], ec).string()),
               "); create what it names, or remove the link");
    MOE_CHECK(created, "prepare: cannot create output folder ", printable(dirs_[i]), ": ", ec.message());
    dirs_created_.store(i + 1);
  }
  size_t dirs() const { return dirs_.size(); }
  // Runs `renames` with the signals held back (one that comes meanwhile is raised afterwards, when
  // the previous handlers are back), then keeps everything: the call has succeeded.
  template <typename Fn>
  void commit(const Fn& renames) {
    committing_.store(true);
    try {
      renames();
    } catch (...) {
      committing_.store(false);
      if (const int sig = deferred_.exchange(0)) on_signal(sig);  // the failure's cleanup is the handler's
      throw;
    }
    armed_.store(false);
    restore_handlers();
    committing_.store(false);
    if (const int sig = deferred_.exchange(0)) raise(sig);  // the previous handler's turn (by default: dies)
  }

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

  void restore_handlers() {
    if (g_active.load() != this) return;
    for (size_t i = 0; i < std::size(kSignals); ++i)
      if (installed_[i]) sigaction(kSignals[i], &previous_[i], nullptr);
    g_active.store(nullptr);
  }

  // Only async-signal-safe calls (unlink, rmdir, write, sigaction, sigprocmask, raise).
  static void on_signal(int sig) {
    PrepareOutputs* self = g_active.load();
    if (self != nullptr && self->committing_.load()) {  // renaming: the dataset is completed first
      self->deferred_.store(sig);
      return;
    }
    if (self != nullptr && self->armed_) {
      for (size_t i = 0; i < self->temps_claimed_.load(); ++i) ::unlink(self->temps_[i].c_str());
      for (size_t i = self->dirs_created_.load(); i-- > 0;) ::rmdir(self->dirs_[i].c_str());
      write_stderr_signal_safe("error: prepare was interrupted (");
      write_stderr_signal_safe(sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP");
      write_stderr_signal_safe("); it removed its temporary files and the folders it created, so ");
      write_stderr_signal_safe(self->out_dir_.c_str());
      write_stderr_signal_safe(" is as it was before\n");
    }
    die_of_signal(sig);  // as if it had not been caught (async-signal-safe calls only)
  }

  static inline std::atomic<PrepareOutputs*> g_active{nullptr};

  const std::vector<std::string> temps_;
  const std::vector<std::string> dirs_;  // outermost first
  const std::string out_dir_;
  std::atomic<size_t> temps_claimed_{0};
  std::atomic<size_t> dirs_created_{0};
  std::atomic<bool> armed_{true};
  std::atomic<bool> committing_{false};
  std::atomic<int> deferred_{0};  // a signal that came while committing_
  bool installed_[std::size(kSignals)] = {};
  struct sigaction previous_[std::size(kSignals)] = {};
};

// The writer's process id of a temporary file that a prepare (or tokenize_hf.py, which names them
// alike) writes in the output folder and renames at the end: ".<name>.npy.tmp-<pid>" or
// ".dataset.json.tmp-<pid>" (and ".<name>.npy.tmp-<pid>.tmp-<pid>", the name earlier versions wrote
// the tokens under), or creates and removes first, ".write-check.tmp-<pid>"; 0 for any other name.
long leftover_temp_pid(const std::string& name);

// Refuses a folder that holds temporaries of an earlier prepare, naming them: they were never
// part of the dataset. They are not deleted here: this process did not create them.
// `has_dataset`: the folder holds a dataset.json (what --append adds to); `append`: the call is an --append.
void refuse_leftover_temps(const std::filesystem::path& out, const std::vector<std::string>& entries,
                           bool has_dataset, bool append);

}  // namespace moe
