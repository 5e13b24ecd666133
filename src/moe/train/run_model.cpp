#include "moe/train/run_model.h"

#include "moe/parallel/ddp_store.h"
#include "moe/parallel/dispatcher_factory.h"
#include "moe/parallel/fsdp_store.h"
#include "moe/parallel/pipeline_messages.h"
#include "moe/parallel/pipeline_schedule.h"

namespace moe {

int PipelinePlan::model_chunk(int layout_chunk) const {
  for (size_t k = 0; k < chunks.size(); ++k)
    if (chunks[k] == layout_chunk) return static_cast<int>(k);
  MOE_FAIL("pipeline: chunk ", layout_chunk, " does not run on this rank");
}

namespace {

// The pipeline schedule a config names, and its shape for `accum` microbatches per rank.
PipelineSchedule schedule_of(const ParallelConfig& par) {
  return par.pp_schedule == "interleaved" ? PipelineSchedule::Interleaved : PipelineSchedule::OneFOneB;
}
PipelineShape shape_of(const ParallelConfig& par, int64_t accum) {
  return PipelineShape{static_cast<int>(par.pp), static_cast<int>(par.pp_virtual), accum};
}

// The microbatches a stage keeps in flight at once: the most over its chunks under its schedule ops.
int stage_activation_sets(const std::vector<PipelineOp>& ops, const PipelineLayout& layout, int stage) {
  int sets = 0;
  for (int c : layout.chunks_of(stage)) sets = std::max(sets, in_flight(ops, c));
  return sets;
}

// This stage's chunks, schedule and in-flight count (a lease_slots override below the need was
// refused by check_run_layout, for every stage at once).
std::unique_ptr<PipelinePlan> plan_pipeline(const Config& cfg, const Mesh& mesh, int64_t accum) {
  const ParallelConfig& par = cfg.parallel;
  auto plan = std::make_unique<PipelinePlan>();
  plan->layout = plan_pipeline_layout(cfg.model, cfg.train.seq_len, static_cast<int>(par.pp),
                                      static_cast<int>(par.pp_virtual), par.pp_layers);
  plan->schedule = schedule_of(par);
  plan->shape = shape_of(par, accum);
  plan->ops = schedule_ops(plan->schedule, plan->shape, mesh.stage);
  // Over NCCL a send waits for its receiver and messages are matched by order: the groups of every
  // stage must deliver under those rules (the schedule tests check every accepted shape; this
  // checks the run's own, in milliseconds).
  const bool rendezvous = mesh.pipeline && mesh.pipeline->sends_wait_for_receivers();
  plan->messages = pipeline_message_groups(plan->schedule, plan->ops, plan->shape, mesh.stage, rendezvous);
  PipelineShape one = plan->shape;
  one.microbatches = 1;
  plan->eval_ops = forward_only_ops(one, mesh.stage);
  plan->eval_messages = pipeline_message_groups(PipelineSchedule::OneFOneB, plan->eval_ops, one, mesh.stage, false);
  if (rendezvous) {
    std::vector<std::vector<std::vector<PipelineMessage>>> all;
    for (int r = 0; r < plan->shape.stages; ++r)
      all.push_back(pipeline_message_groups(plan->schedule, schedule_ops(plan->schedule, plan->shape, r), plan->shape,
                                            r, rendezvous));
    const std::string problem = message_order_problem(all);
    MOE_CHECK(problem.empty(), "parallel.pp_schedule = \"", par.pp_schedule, "\" with parallel.pp = ", par.pp,
              ", parallel.pp_virtual = ", par.pp_virtual, " and ", accum, " microbatches: ", problem);
  }
  plan->chunks = plan->layout.chunks_of(mesh.stage);
  plan->activation_sets = std::max(plan->activation_sets, stage_activation_sets(plan->ops, plan->layout, mesh.stage));
  return plan;
}

}  // namespace

namespace {
// The experts the EP mesh shards: none when model.first_k_dense_replace makes every layer dense.
int64_t routed_experts(const ModelConfig& mc) {
  return mc.first_k_dense_replace < mc.num_hidden_layers ? mc.num_experts : 0;
}
}  // namespace

void check_run_layout(const Config& cfg, int world_size) {
  if (cfg.parallel.mode == "fsdp") return;
  const int64_t moe_experts = routed_experts(cfg.model);
  // A model without MoE layers has nothing to shard over experts: data parallelism only.
  MOE_CHECK(moe_experts > 0 || cfg.parallel.ep == 1, "parallel.ep = ", cfg.parallel.ep,
            " needs MoE layers, but model.first_k_dense_replace makes every layer dense; use parallel.ep = 1");
  check_mesh(world_size, static_cast<int>(cfg.parallel.ep), moe_experts > 0 ? moe_experts : 1,
             static_cast<int>(cfg.parallel.pp));
  // The schedule must run each rank's microbatches (the interleaved one takes them in groups of
  // pp): refused here, with the job's real data ranks, once, not by every stage as it builds its
  // schedule.
  const ParallelConfig& par = cfg.parallel;
  if (par.pp > 1 && world_size % par.pp == 0) {
    const PipelineShape shape = shape_of(par, cfg.accumulation_steps(world_size / par.pp));
    const std::string problem = schedule_problem(schedule_of(par), shape);
    MOE_CHECK(problem.empty(), problem);
    // A lease_slots override must hold the microbatches in flight on the stage that keeps the most:
    // checked here for all stages, so every rank refuses it with one message, not only the ranks
    // of the stages it is too small for as they build their models.
    if (par.lease_slots > 0) {
      const PipelineLayout layout = plan_pipeline_layout(cfg.model, cfg.train.seq_len, static_cast<int>(par.pp),
                                                         static_cast<int>(par.pp_virtual), par.pp_layers);
      int need = 0, stage_of_need = 0;
      for (int r = 0; r < shape.stages; ++r)
        if (const int sets = stage_activation_sets(schedule_ops(schedule_of(par), shape, r), layout, r); sets > need)
          need = sets, stage_of_need = r;
      MOE_CHECK(par.lease_slots >= need, "parallel.lease_slots = ", par.lease_slots, " is below the ", need,
                " microbatches the ", par.pp_schedule, " schedule keeps in flight on pipeline stage ", stage_of_need,
                "; use parallel.lease_slots >= ", need, " or 0 (sized from the schedule)");
    }
  }
}

std::unique_ptr<RunModel> build_run_model(const Config& cfg, Communicator& world, Device device,
                                          bool device_collectives, Arena& state, Arena& acts, StoreUse use) {
  auto run = std::make_unique<RunModel>();
  const ModelConfig& mc = cfg.model;
  const int64_t moe_experts = routed_experts(mc);
  if (cfg.parallel.mode == "fsdp") {
    run->reg = build_registry(mc, 0, mc.num_experts, ParamLayout::ByBlock);
    run->store = std::make_unique<FsdpStore>(mc, run->reg, world, state, cfg.optim.moment_dtype, use);
  } else {
    check_run_layout(cfg, world.size());
    const int ep = static_cast<int>(cfg.parallel.ep);
    const int64_t experts = moe_experts > 0 ? moe_experts : 1;
    const int pp = static_cast<int>(cfg.parallel.pp);
    run->mesh = std::make_unique<Mesh>(world.plans_only() ? plan_mesh(world, ep, experts, pp)
                                                          : make_mesh(world, ep, experts, pp));
    const int64_t local = mc.num_experts / run->mesh->ep;
    std::vector<bool> held;  // all blocks without pipeline
    if (pp > 1) {
      run->pipeline = plan_pipeline(cfg, *run->mesh, cfg.accumulation_steps(run->mesh->dp()));
      const PipelineLayout& layout = run->pipeline->layout;
      held.assign(mc.num_hidden_layers + 2, false);
      for (int c : run->pipeline->chunks) {
        for (int64_t l = layout.first_layer(c); l < layout.end_layer(c); ++l) held[l + 1] = true;
        if (c == 0) held[0] = true;
        if (c == layout.chunks() - 1) held[mc.num_hidden_layers + 1] = true;
      }
    }
    run->reg = build_registry(mc, run->mesh->ep_index * local, local, ParamLayout::ByReplicaGroup, held);
    run->store = std::make_unique<DdpStore>(mc, run->reg, *run->mesh, state, cfg.optim.moment_dtype,
                                            cfg.train.precision,
                                            GradReduceOptions{cfg.parallel.overlap_grad_reduce,
                                                              static_cast<size_t>(cfg.parallel.grad_bucket_bytes)},
                                            use);
  }
  run->dispatcher = make_run_dispatcher(device, device_collectives, moe_experts > 0, cfg.ep.backend,
                                        run->mesh ? run->mesh->ep_group.get() : nullptr, mc.num_experts,
                                        mc.capacity_factor, mc.dropless);
  const int64_t rows = cfg.train.micro_batch_size * cfg.train.seq_len;
  const int64_t accum = cfg.accumulation_steps(cfg.parallel.dp(world.size()));
  const int64_t L = mc.num_hidden_layers, N = mc.num_experts;
  StepBuffers& b = run->buffers;
  b.router_bias = state.reserve("router_bias", DType::F32, {L, N});
  b.expert_load = state.reserve("expert_load", DType::F32, {L, N});
  b.step_stats = state.reserve("step_stats", DType::F32, {kNumStepStats});
  b.tokens = state.reserve("batch.tokens", DType::I32, {accum * rows});
  b.targets = state.reserve("batch.targets", DType::I32, {accum * rows});
  if (use == StoreUse::Training) b.schedule = state.reserve("optimizer.schedule", DType::F32, {2});
  ModelChunks chunks;
  int lease_slots = 1;
  if (run->pipeline) {
    for (int c : run->pipeline->chunks)
      chunks.layers.emplace_back(run->pipeline->layout.first_layer(c), run->pipeline->layout.end_layer(c));
    chunks.activation_sets = run->pipeline->activation_sets;
    lease_slots = run->pipeline->activation_sets;
  }
  if (cfg.parallel.lease_slots > 0) lease_slots = static_cast<int>(cfg.parallel.lease_slots);
  run->model = std::make_unique<Transformer>(mc, cfg.train.micro_batch_size, cfg.train.seq_len, acts, *run->dispatcher,
                                             lease_slots, cfg.train.recompute, cfg.train.precision, cfg.ep.payload,
                                             chunks);
  run->model->set_block_hooks(run->store->hooks());
  run->model->set_deterministic(cfg.train.deterministic);
  if (cfg.train.precision == Precision::FP8) run->model->set_fp8_weights(run->store->fp8_weights());
  return run;
}

}  // namespace moe
