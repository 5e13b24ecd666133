#include "cli/run_summary.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "moe/core/arena.h"
#include "moe/train/metrics.h"

namespace moe::cli {

void print_summary(const moe::TrainSummary& s, bool bench) {
  if (s.steps.empty()) {
    std::printf("nothing to do: already at step %ld\n", static_cast<long>(s.last_step));
    return;
  }
  const moe::StepRecord& last = s.steps.back();
  if (!s.stop_reason.empty())
    std::printf("\nstopped after step %ld of the run's %ld (%s); a checkpoint of step %ld is saved: continue with "
                "--resume latest\n",
                static_cast<long>(last.step), static_cast<long>(s.planned_steps), s.stop_reason.c_str(),
                static_cast<long>(last.step));
  std::printf("\n%s after step %ld: loss %.4f (lm %.4f)\n", bench ? "bench" : "done", static_cast<long>(last.step),
              last.loss, last.lm_loss);
  if (s.eval_loss)
    std::printf("  held-out loss:   %.4f%s\n", *s.eval_loss, std::isfinite(*s.eval_loss) ? "" : " (not finite)");
  for (const auto& [name, loss] : s.eval_sets) std::printf("  eval loss on %s: %.4f\n", name.c_str(), loss);
  if (s.attainable_loss)
    std::printf("  attainable loss: %.4f (entropy rate of the synthetic corpus)\n", *s.attainable_loss);
  // Which steps the means are over, true for any count: the first (start-up work) is left out when others ran.
  const std::string timed = s.first_step_timed    ? "the only step run, its start-up work included"
                            : s.timed_steps == 1 ? "the one step after the first"
                                                 : "mean over the " + std::to_string(s.timed_steps) +
                                                       " steps after the first";
  std::printf("  throughput: %s tokens/s, MFU %.2f%% per device, %.3f s/step (%s)\n",
              moe::format_count(s.mean_tokens_per_s).c_str(), 100 * s.mean_mfu, s.mean_step_time_s, timed.c_str());
  if (bench) {
    // What was timed: on a GPU at its power limit the speed depends on the values multiplied, and
    // initial weights ran FP8 ~3% ahead of where trained ones did (bench/RESULTS.md, 2026-12-05).
    if (s.init_from.is_object() && s.init_from.contains("path") && s.init_from["path"].is_string())
      std::printf("  weights: from %s%s\n", s.init_from["path"].get<std::string>().c_str(),
                  s.init_from.contains("step") ? (" (step " + s.init_from["step"].dump() + ")").c_str() : "");
    else
      std::printf("  weights: the config's initial ones (--init-from times trained ones)\n");
  }
  if (bench && s.timed_steps > 1 && !s.first_step_timed) {
    // The spread says whether the mean is steady (a GPU at its power limit varies from step to step).
    std::vector<double> ms;
    for (size_t i = 1; i < s.steps.size(); ++i) ms.push_back(1e3 * s.steps[i].step_time_s);
    std::sort(ms.begin(), ms.end());
    const size_t n = ms.size();
    const double median = n % 2 == 1 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    std::printf("  step time over those steps: min %.1f ms, median %.1f ms, max %.1f ms\n", ms.front(), median,
                ms.back());
  }
  std::printf("  memory: arena %s, peak resident (host) %s",
              moe::format_bytes(static_cast<double>(s.arena_bytes)).c_str(),
              moe::format_bytes(static_cast<double>(s.peak_rss_bytes)).c_str());
  if (s.device == moe::Device::CUDA)
    std::printf(", GPU high-water %s (device memory in use after a step, CUDA context and library workspaces included)",
                moe::format_bytes(static_cast<double>(s.device_peak_bytes)).c_str());
  std::printf("\n");
  if (s.graph_nodes > 0) std::printf("  CUDA graph: the step replays as one graph of %zu nodes\n", s.graph_nodes);
  if (s.skipped_steps > 0)
    std::printf("  skipped steps (non-finite gradients): %ld\n", static_cast<long>(s.skipped_steps));
}

}  // namespace moe::cli
