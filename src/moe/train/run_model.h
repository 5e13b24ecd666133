// The objects whose buffers make up a run's memory: the EP mesh, the parameter registry and store,
// the token dispatcher, the model, and the trainer's per-step buffers, all reserved (not yet
// allocated) in the run's two arenas. The trainer builds them for a run; `moetrain plan` builds
// the same objects on a PlanCommunicator (comm/plan_communicator.h), so a plan's bytes are the
// bytes a run's arenas hold.
#pragma once

#include <cstdint>
#include <memory>

#include "moe/comm/communicator.h"
#include "moe/comm/mesh.h"
#include "moe/core/arena.h"
#include "moe/model/dispatch.h"
#include "moe/model/weights.h"
#include "moe/model/transformer.h"
#include "moe/parallel/param_store.h"
#include "moe/parallel/pipeline_messages.h"
#include "moe/parallel/pipeline_schedule.h"
#include "moe/train/config.h"
#include "moe/train/pipeline_layout.h"

namespace moe {

// The per-step statistics all-reduced over the world (one small collective per step). The first
// kNumMicrobatchStats are summed on the device by the model; the rest are known on the host.
enum StepStat {
  kLmSum = kStatLmSum,
  kLb = kStatLb,
  kZ = kStatZ,
  kReceived = kStatReceivedRows,
  kRoutes = kNumMicrobatchStats,
  kCapacity,
  kBytesMoved,
  kStopSignals,   // ranks that received a stop signal (stop_request.h)
  kStopDeadline,  // rank 0: train.max_duration is reached
  kPipelineBubble,  // parallel.pp > 1: this rank's idle share of the pipeline phase (summed: divide by ranks)
  kNumStepStats
};

// The trainer's own state buffers. tokens, targets: [accumulation steps x tokens per microbatch],
// uploaded before each step; schedule: [lr, step] read by AdamW from memory (a replayed graph sees
// each step's values); step_stats: the per-step statistics all-reduced over the world.
struct StepBuffers {
  Arena::Slot tokens, targets, router_bias, expert_load, step_stats, schedule;
};

// What a pipeline rank runs (parallel.pp > 1): the layout of all chunks, the schedule, this rank's
// op list for one step and its chunks (the model's chunk k is the layout's chunks[k]).
struct PipelinePlan {
  PipelineLayout layout;
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  PipelineShape shape;
  std::vector<PipelineOp> ops;
  std::vector<int> chunks;  // this rank's layout chunks, in the model's chunk order
  int activation_sets = 1;  // the most microbatches in flight in one of this rank's chunks
  // This rank's message groups: messages[j] before ops[j], the last after every pass
  // (parallel/pipeline_messages.h), for the pipeline communicator's kind of sends.
  std::vector<std::vector<PipelineMessage>> messages;
  // Evaluation: one microbatch's forward passes through this rank's chunks (forward_only_ops) and
  // their message groups, per pass.
  std::vector<PipelineOp> eval_ops;
  std::vector<std::vector<PipelineMessage>> eval_messages;
  int model_chunk(int layout_chunk) const;
};

struct RunModel {
  std::unique_ptr<Mesh> mesh;  // parallel.mode = "ddp" only
  std::unique_ptr<PipelinePlan> pipeline;  // parallel.pp > 1 only
  ParamRegistry reg;
  std::unique_ptr<ParamStore> store;
  std::unique_ptr<TokenDispatcher> dispatcher;
  std::unique_ptr<Transformer> model;
  StepBuffers buffers;
};

// The layout checks build_run_model makes before its first collective (EP and pipeline sizes
// against the ranks and the experts); they depend on sizes only, the same on every rank.
void check_run_layout(const Config& cfg, int world_size);

// Builds the run of `cfg` on `world` (the run's ranks, or a PlanCommunicator when planning), on
// `device`; device_collectives: a GPU run whose collectives go through NCCL. Reserves into `state`
// (parameters, gradients, optimizer, step buffers) and `acts` (activations, expert buffers);
// commits neither. Collective over `world` (the EP groups and the dispatcher's heap) unless it
// plans only. use = Evaluation (`moetrain eval`): the store reserves the weights only.
std::unique_ptr<RunModel> build_run_model(const Config& cfg, Communicator& world, Device device,
                                          bool device_collectives, Arena& state, Arena& acts,
                                          StoreUse use = StoreUse::Training);

}  // namespace moe
