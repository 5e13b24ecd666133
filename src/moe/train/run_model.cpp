#include "moe/train/run_model.h"

#include "moe/parallel/ddp_store.h"
#include "moe/parallel/dispatcher_factory.h"
#include "moe/parallel/fsdp_store.h"

namespace moe {

std::unique_ptr<RunModel> build_run_model(const Config& cfg, Communicator& world, Device device,
                                          bool device_collectives, Arena& state, Arena& acts) {
  auto run = std::make_unique<RunModel>();
  const ModelConfig& mc = cfg.model;
  const int64_t moe_experts = mc.first_k_dense_replace < mc.num_hidden_layers ? mc.num_experts : 0;
  if (cfg.parallel.mode == "fsdp") {
    run->reg = build_registry(mc, 0, mc.num_experts, ParamLayout::ByBlock);
    run->store = std::make_unique<FsdpStore>(mc, run->reg, world, state, cfg.optim.moment_dtype);
  } else {
    // A model without MoE layers has nothing to shard over experts: data parallelism only.
    MOE_CHECK(moe_experts > 0 || cfg.parallel.ep == 1, "parallel.ep = ", cfg.parallel.ep,
              " needs MoE layers, but model.first_k_dense_replace makes every layer dense; use parallel.ep = 1");
    const int ep = static_cast<int>(cfg.parallel.ep);
    const int64_t experts = moe_experts > 0 ? moe_experts : 1;
    run->mesh = std::make_unique<Mesh>(world.plans_only() ? plan_mesh(world, ep, experts)
                                                          : make_mesh(world, ep, experts));
    const int64_t local = mc.num_experts / run->mesh->ep;
    run->reg = build_registry(mc, run->mesh->ep_index * local, local, ParamLayout::ByReplicaGroup);
    run->store = std::make_unique<DdpStore>(mc, run->reg, *run->mesh, state, cfg.optim.moment_dtype,
                                            cfg.train.precision,
                                            GradReduceOptions{cfg.parallel.overlap_grad_reduce,
                                                              static_cast<size_t>(cfg.parallel.grad_bucket_bytes)});
  }
  run->dispatcher = make_run_dispatcher(device, device_collectives, moe_experts > 0, cfg.ep.backend,
                                        run->mesh ? run->mesh->ep_group.get() : nullptr, mc.num_experts,
                                        mc.capacity_factor, mc.dropless);
  const int64_t rows = cfg.train.micro_batch_size * cfg.train.seq_len;
  const int64_t accum = cfg.accumulation_steps(world.size());
  const int64_t L = mc.num_hidden_layers, N = mc.num_experts;
  StepBuffers& b = run->buffers;
  b.router_bias = state.reserve("router_bias", DType::F32, {L, N});
  b.expert_load = state.reserve("expert_load", DType::F32, {L, N});
  b.step_stats = state.reserve("step_stats", DType::F32, {kNumStepStats});
  b.tokens = state.reserve("batch.tokens", DType::I32, {accum * rows});
  b.targets = state.reserve("batch.targets", DType::I32, {accum * rows});
  b.schedule = state.reserve("optimizer.schedule", DType::F32, {2});
  run->model = std::make_unique<Transformer>(mc, cfg.train.micro_batch_size, cfg.train.seq_len, acts, *run->dispatcher,
                                             static_cast<int>(cfg.parallel.lease_slots), cfg.train.recompute,
                                             cfg.train.precision);
  run->model->set_block_hooks(run->store->hooks());
  if (cfg.train.precision == Precision::FP8) run->model->set_fp8_weights(run->store->fp8_weights());
  return run;
}

}  // namespace moe
