// Trainer's evaluations: the held-out tail of the training data, the named validation sets,
// `moetrain eval` over token files or the synthetic corpus, and `bench --check`'s one-batch loss.
// All of them run forward passes only, on every rank (expert parallelism makes them collective).
#include <chrono>

#include "moe/comm/agreed_outcome.h"
#include "moe/core/device.h"
#include "moe/data/eval_windows.h"
#include "moe/data/npy.h"
#include "moe/ops/elementwise.h"
#include "moe/train/data_agreement.h"
#include "moe/train/pipeline_executor.h"
#include "moe/train/trainer.h"

namespace moe {

double Trainer::forward_loss_sum(Tensor tokens, Tensor targets, uint64_t seed, const RoutingState& rs, Tensor logits) {
  if (!run_->pipeline) {
    run_->model->forward_loss(run_->store->weights(), tokens, targets, seed, rs);
    return run_->model->losses().lm_loss_sum;
  }
  // Through the stages; the last one holds the loss (the others return 0, the caller sums over the job).
  const Tensor stats = state_.get(run_->buffers.step_stats);
  fill_zero(stats);
  PipelineStepInput in;
  in.tokens = tokens;
  in.targets = targets;
  in.routing_seed = [seed](int64_t) { return seed; };
  in.routing = rs;
  in.stats = stats;
  in.logits = logits;
  run_pipeline_forward(*run_->pipeline, *run_->mesh->pipeline, pipeline_messages_, *run_->model, *run_->store, in);
  float sum = 0;
  copy_from_tensor(&sum, stats.rows(kStatLmSum, kStatLmSum + 1));
  return sum;
}

EvalReport Trainer::evaluate_windows(int64_t count, const WindowFn& window, int64_t max_microbatches,
                                     const std::string& logits_npy) {
  const int64_t dp = data_ranks(), rank = data_rank();
  const int64_t B = cfg_.train.micro_batch_size, T = cfg_.train.seq_len, V = cfg_.model.vocab_size;
  int64_t per_rank = count / (B * dp);  // whole microbatches on every rank
  // max_microbatches (train.eval_batches) counts over all data ranks, rounded up to whole rounds:
  // the same windows, with the same routing seeds, on any topology whose data ranks divide it.
  if (max_microbatches > 0) per_rank = std::min(per_rank, (max_microbatches + dp - 1) / dp);
  EvalReport r;
  r.windows_skipped = count - per_rank * dp * B;
  if (per_rank <= 0) return r;
  const Tensor tokens = state_.get(run_->buffers.tokens).rows(0, B * T),
               targets = state_.get(run_->buffers.targets).rows(0, B * T);
  const RoutingState rs{state_.get(run_->buffers.router_bias), Tensor()};
  double local = 0;  // summed in double; one rounding to FP32 before the all-reduce
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < per_rank; ++i) {
    for (int64_t j = 0; j < B; ++j)
      window((i * dp + rank) * B + j, host_tokens_.data() + j * T, host_targets_.data() + j * T);
    copy_to_tensor(tokens, host_tokens_.data());
    copy_to_tensor(targets, host_targets_.data());
    const uint64_t seed = routing_seed(cfg_.train.seed, -1, i * dp + rank);
    if (i > 0 || logits_npy.empty()) {
      local += forward_loss_sum(tokens, targets, seed, rs);
      continue;
    }
    const DeviceAllocation buf(static_cast<size_t>(B * T * V) * sizeof(float), dev_);
    const Tensor logits(buf.data(), DType::F32, {B * T, V}, dev_);
    local += forward_loss_sum(tokens, targets, seed, rs, run_->pipeline ? logits : Tensor());
    write_first_logits(logits_npy, logits, tokens, seed, rs);
  }
  std::vector<float> sum{static_cast<float>(local)};
  all_reduce_host(sum);
  run_->dispatcher->check_after_step();  // eval's routes are checked and counted here, not in the next step
  r.tokens = per_rank * dp * B * T;
  r.mean_loss = sum[0] / static_cast<double>(r.tokens);
  r.tokens_per_s =
      static_cast<double>(r.tokens) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

void Trainer::write_first_logits(const std::string& path, Tensor logits, Tensor tokens, uint64_t seed,
                                 const RoutingState& rs) {
  std::vector<float> host(static_cast<size_t>(logits.numel()));
  const std::vector<int64_t> shape = {logits.shape[0], logits.shape[1]};
  if (!run_->pipeline) {
    run_->model->forward_logits(run_->store->weights(), tokens, logits, seed, rs);
    copy_from_tensor(host.data(), logits);
    if (leader()) write_npy_f32(path, host, shape);
    return;
  }
  // The holder: the rank of the last stage (the one with the LM head) that evaluated data rank 0's
  // rows. Every rank learns its job rank: the one non-zero term of a sum (exact in FP32).
  bool head = false;
  for (int c = 0; c < run_->model->chunks(); ++c) head = head || run_->model->has_head(c);
  const bool holder = head && data_rank() == 0;
  std::vector<float> holder_rank{holder ? static_cast<float>(host_world_.rank()) : 0.0f};
  all_reduce_host(holder_rank);
  const int from = static_cast<int>(holder_rank[0]);
  const Tensor message(host.data(), DType::F32, logits.shape, Device::CPU);
  constexpr int kLogitsTag = 1;
  if (holder) copy_from_tensor(host.data(), logits);
  if (holder && !leader()) host_world_.send(message, 0, kLogitsTag);
  if (leader() && !holder) host_world_.recv(message, from, kLogitsTag);
  if (holder && !leader()) host_world_.wait_sends();
  if (leader()) write_npy_f32(path, host, shape);
}

std::optional<double> Trainer::evaluate(int64_t batches) {
  const int64_t T = cfg_.train.seq_len;
  const EvalReport r = evaluate_windows(
      data_.eval_num_sequences(T), [&](int64_t i, int32_t* in, int32_t* tg) { data_.eval_batch(i, 1, T, in, tg); },
      batches, "");
  if (r.tokens == 0) return std::nullopt;
  return r.mean_loss;
}

std::vector<std::pair<std::string, double>> Trainer::evaluate_sets(int64_t batches) {
  std::vector<std::pair<std::string, double>> out;
  for (size_t k = 0; k < eval_sets_.size(); ++k) {
    const EvalWindows& w = *eval_sets_[k];
    const EvalReport r = evaluate_windows(
        w.size(), [&](int64_t i, int32_t* in, int32_t* tg) { w.copy(i, in, tg); }, batches, "");
    out.emplace_back(cfg_.eval.sets[k].name, r.mean_loss);
  }
  return out;
}

EvalReport Trainer::evaluate_data(const std::string& path, int64_t max_tokens, const std::string& logits_npy) {
  MOE_CHECK(max_tokens >= 0, "eval: the number of tokens must be >= 0 (0 = all), got ", max_tokens);
  const int64_t B = cfg_.train.micro_batch_size, T = cfg_.train.seq_len, V = cfg_.model.vocab_size;
  const int64_t dp = data_ranks();
  EvalReport r;
  int64_t windows = 0;
  if (path == "synthetic") {
    // The built-in corpus of the checkpoint's config: its held-out stream, in windows of seq_len + 1.
    MOE_CHECK(data_.attainable_loss().has_value(),
              "eval --data synthetic: this run's data is not the synthetic corpus");
    windows = data_.eval_num_sequences(T);
    if (max_tokens > 0) windows = std::min(windows, max_tokens / T);  // whole windows within max_tokens
    r = evaluate_windows(
        windows, [&](int64_t i, int32_t* in, int32_t* tg) { data_.eval_batch(i, 1, T, in, tg); }, 0, logits_npy);
  } else {
    const EvalWindows w = agree_on_outcome(host_world_, [&] {
      return EvalWindows::open(path, cfg_.data.format, token_dtype_from_name(cfg_.data.dtype), T, V, max_tokens,
                               "--data");
    });
    agree_on_outcome(host_world_, [&] { check_same_token_data(host_world_, token_data_summary(w), "--data files"); });
    windows = w.size();
    r = evaluate_windows(
        windows, [&](int64_t i, int32_t* in, int32_t* tg) { w.copy(i, in, tg); }, 0, logits_npy);
  }
  MOE_CHECK(r.tokens > 0, "eval: ", windows, " windows of ", T + 1, " tokens in ", path,
            " do not fill one microbatch of ", B, " sequences per rank (", dp, " ranks)");
  return r;
}

double Trainer::microbatch_loss(int64_t step) {
  const int64_t rows = cfg_.train.micro_batch_size * cfg_.train.seq_len;
  upload_batch(step);
  const RoutingState rs{state_.get(run_->buffers.router_bias), Tensor()};
  std::vector<float> sum{static_cast<float>(forward_loss_sum(state_.get(run_->buffers.tokens).rows(0, rows),
                                                             state_.get(run_->buffers.targets).rows(0, rows),
                                                             routing_seed(cfg_.train.seed, step, data_rank()), rs))};
  all_reduce_host(sum);
  return sum[0] / static_cast<double>(rows * data_ranks());
}

}  // namespace moe
