// ranks: 2 4
// The expert-parallel dispatchers over the MPI world as the EP group: rowwise (symmetric heap)
// and alltoall (all_to_all_v) agree bit for bit, match a single-rank reference, drop exactly the
// routes the tail-drop rule says, and hand out leases as the pools allow. Every backend (local
// too) sizes its buffers by the shared capacity rule, reports the bytes it moves through
// TokenDispatcher::bytes_moved(), and refuses counts that are not its topk_idx's histogram.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "moe/comm/local_communicator.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/core/arena.h"
#include "moe/core/error.h"
#include "moe/ops/route.h"
#include "moe/parallel/dispatcher_factory.h"
#include "moe/parallel/expert_buffers.h"
#include "moe/parallel/placement.h"

namespace moe {
namespace {

constexpr int64_t kTokens = 24, kTopK = 3, kHidden = 260;  // hidden > 256 crosses a column chunk

struct Inputs {
  std::vector<float> x, weights, dout;  // [T, D], [T, K], [T, D]
  std::vector<int32_t> topk;            // [T, K]
};

// Random inputs of this rank. skew: probability that a token's first route goes to expert 0.
Inputs make_inputs(int rank, int64_t N, double skew, uint32_t seed) {
  std::mt19937 rng(seed + 7919u * static_cast<uint32_t>(rank));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), pos(0.05f, 1.0f), coin(0.0f, 1.0f);
  Inputs in;
  in.x.resize(kTokens * kHidden);
  in.dout.resize(kTokens * kHidden);
  in.weights.resize(kTokens * kTopK);
  for (float& v : in.x) v = u(rng);
  for (float& v : in.dout) v = u(rng);
  for (float& v : in.weights) v = pos(rng);
  for (int64_t t = 0; t < kTokens; ++t) {
    std::vector<int32_t> experts(N);
    std::iota(experts.begin(), experts.end(), 0);
    std::shuffle(experts.begin(), experts.end(), rng);
    if (coin(rng) < skew) std::swap(experts[0], *std::find(experts.begin(), experts.end(), 0));
    in.topk.insert(in.topk.end(), experts.begin(), experts.begin() + kTopK);
  }
  return in;
}

struct Results {
  std::vector<int32_t> route_index, offsets;
  std::vector<float> expert_in, expert_out, d_expert_out;  // kept rows only
  std::vector<float> out, dweights, dx;
  int64_t bytes = 0, remote_bytes = 0;
};

std::vector<float> kept_rows(Tensor t, int64_t kept) {
  const float* p = t.f32();
  return std::vector<float>(p, p + kept * t.dim(1));
}

// The experts: local expert e (global g) is the linear map y = x * (g + 1); its backward is
// dx = dy * (g + 1). Only the kept rows [offsets[0], offsets[E]) are touched, as the grouped GEMMs do.
void experts_forward(Tensor y, Tensor x, const std::vector<int32_t>& offsets, int64_t first_expert) {
  const int64_t D = x.dim(1);
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const auto scale = static_cast<float>(first_expert + static_cast<int64_t>(e) + 1);
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r)
      for (int64_t j = 0; j < D; ++j) y.f32()[r * D + j] = x.f32()[r * D + j] * scale;
  }
}

// One MoE layer forward and backward through `backend`.
Results run_layer(const std::string& backend, Communicator& comm, int64_t N, double cf, bool dropless,
                  const Inputs& in) {
  const int64_t T = kTokens, K = kTopK, D = kHidden;
  auto disp = make_dispatcher(backend, comm, N, cf, dropless);
  const int64_t E = disp->local_experts();
  Arena arena("dispatch_test." + backend);
  disp->reserve_buffers(DispatchShape{T, K, D, 1, 1}, arena);
  arena.commit();

  Inputs io = in;  // the ops take non-const views
  Results r;
  r.route_index.assign(T * K, -7);
  r.offsets.assign(E + 1, -7);
  std::vector<int32_t> counts(N);
  r.out.assign(T * D, 0.0f);
  r.dweights.assign(T * K, -7.0f);
  r.dx.assign(T * D, -7.0f);
  const Tensor x = f32_tensor(io.x.data(), {T, D}), w = f32_tensor(io.weights.data(), {T, K});
  const Tensor dout = f32_tensor(io.dout.data(), {T, D}), topk = i32_tensor(io.topk.data(), {T, K});
  const RoutePlan plan{i32_tensor(r.route_index.data(), {T * K}), i32_tensor(r.offsets.data(), {E + 1})};

  Lease lease = disp->acquire(0);
  route_counts(i32_tensor(counts.data(), {N}), topk);
  disp->place_routes(0, plan, topk, i32_tensor(counts.data(), {N}), {});
  disp->dispatch(lease.buffers.expert_in, x, plan, static_cast<int>(K), {});
  experts_forward(lease.buffers.expert_out, lease.buffers.expert_in, r.offsets, disp->first_expert());
  disp->combine(f32_tensor(r.out.data(), {T, D}), lease.buffers.expert_out, w, plan, static_cast<int>(K), {});

  const ExpertBuffers grad = disp->grad_buffers();
  disp->combine_backward(grad.expert_out, f32_tensor(r.dweights.data(), {T, K}), dout, lease.buffers.expert_out, w,
                         plan, static_cast<int>(K), {});
  experts_forward(grad.expert_in, grad.expert_out, r.offsets, disp->first_expert());  // linear: dx = dy * (g + 1)
  disp->dispatch_backward(f32_tensor(r.dx.data(), {T, D}), grad.expert_in, plan, static_cast<int>(K), {});

  const int64_t kept = r.offsets[E];
  r.expert_in = kept_rows(lease.buffers.expert_in, kept);
  r.expert_out = kept_rows(lease.buffers.expert_out, kept);
  r.d_expert_out = kept_rows(grad.expert_out, kept);
  disp->release(lease);
  r.bytes = disp->bytes_moved();
  r.remote_bytes = disp->remote_bytes_moved();
  return r;
}

// Every rank's inputs, gathered (index = rank).
std::vector<Inputs> gather_inputs(Communicator& comm, Inputs mine) {
  const int P = comm.size();
  std::vector<float> x(P * mine.x.size()), w(P * mine.weights.size()), g(P * mine.dout.size());
  std::vector<int32_t> topk(P * mine.topk.size());
  auto f = [](std::vector<float>& v) { return f32_tensor(v.data(), {static_cast<int64_t>(v.size())}); };
  auto i = [](std::vector<int32_t>& v) { return i32_tensor(v.data(), {static_cast<int64_t>(v.size())}); };
  comm.all_gather(f(x), f(mine.x));
  comm.all_gather(f(w), f(mine.weights));
  comm.all_gather(f(g), f(mine.dout));
  comm.all_gather(i(topk), i(mine.topk));
  std::vector<Inputs> all(P);
  for (int s = 0; s < P; ++s) {
    auto slice = [s](const auto& v, size_t n) { return std::vector(v.begin() + s * n, v.begin() + (s + 1) * n); };
    all[s] = {slice(x, mine.x.size()), slice(w, mine.weights.size()), slice(g, mine.dout.size()),
              slice(topk, mine.topk.size())};
  }
  return all;
}

// The tail-drop rule spelled out over all ranks' routes: at each destination, local expert, then
// source rank, then (t, k) order; the n-th row is kept while n < rows. Returns [rank][t*K + k].
std::vector<std::vector<int32_t>> naive_route_index(const std::vector<Inputs>& all, int64_t N, int64_t rows) {
  const int P = static_cast<int>(all.size());
  const int64_t E = N / P;
  std::vector<std::vector<int32_t>> index(P, std::vector<int32_t>(kTokens * kTopK, -2));
  for (int d = 0; d < P; ++d) {
    int64_t n = 0;
    for (int64_t e = 0; e < E; ++e)
      for (int s = 0; s < P; ++s)
        for (int64_t i = 0; i < kTokens * kTopK; ++i)
          if (all[s].topk[i] == d * E + e) {
            index[s][i] = n < rows ? static_cast<int32_t>(d * rows + n) : -1;
            ++n;
          }
  }
  return index;
}

// Reference on one rank from (all-gathered) inputs: out, dweights, dx of rank s's tokens, in
// double, with the routes `index` keeps. Also per-element magnitudes for the relative tolerance.
struct Reference {
  std::vector<double> out, out_scale, dweights, dweights_scale, dx, dx_scale;
};
Reference reference(const Inputs& in, const std::vector<int32_t>& index) {
  const int64_t T = kTokens, K = kTopK, D = kHidden;
  Reference ref;
  ref.out.assign(T * D, 0.0);
  ref.out_scale.assign(T * D, 0.0);
  ref.dx = ref.out, ref.dx_scale = ref.out;
  ref.dweights.assign(T * K, 0.0);
  ref.dweights_scale.assign(T * K, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      if (index[t * K + k] < 0) continue;
      const double scale = in.topk[t * K + k] + 1.0, wk = in.weights[t * K + k];
      for (int64_t j = 0; j < D; ++j) {
        const double y = in.x[t * D + j] * scale, g = in.dout[t * D + j];
        ref.out[t * D + j] += wk * y;
        ref.out_scale[t * D + j] += std::abs(wk * y);
        ref.dweights[t * K + k] += g * y;
        ref.dweights_scale[t * K + k] += std::abs(g * y);
        ref.dx[t * D + j] += wk * g * scale;
        ref.dx_scale[t * D + j] += std::abs(wk * g * scale);
      }
    }
  return ref;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& scale,
                  double rel, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::abs(got[i] - want[i]), rel * std::max(scale[i], 1e-30)) << what << "[" << i << "]";
}

template <typename T>
void expect_bit_identical(const std::vector<T>& a, const std::vector<T>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)), 0) << what << " differs between backends";
}

void expect_backends_identical(const Results& a, const Results& b) {
  expect_bit_identical(a.route_index, b.route_index, "route_index");
  expect_bit_identical(a.offsets, b.offsets, "expert_offsets");
  expect_bit_identical(a.expert_in, b.expert_in, "expert_in (kept rows)");
  expect_bit_identical(a.expert_out, b.expert_out, "expert_out (kept rows)");
  expect_bit_identical(a.out, b.out, "combine output");
  expect_bit_identical(a.dweights, b.dweights, "dweights");
  expect_bit_identical(a.d_expert_out, b.d_expert_out, "d_expert_out (kept rows)");
  expect_bit_identical(a.dx, b.dx, "dx");
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(a.remote_bytes, b.remote_bytes);
}

// The kept rows of this rank's expert_in hold exactly the inputs the tail-drop rule puts there.
void expect_expert_rows(const Results& r, const std::vector<Inputs>& all, int me, int64_t N, int64_t rows) {
  const auto naive = naive_route_index(all, N, rows);
  int64_t filled = 0;
  for (size_t s = 0; s < all.size(); ++s)
    for (int64_t i = 0; i < kTokens * kTopK; ++i) {
      const int32_t v = naive[s][i];
      if (v < 0 || v / rows != me) continue;
      const int64_t row = v % rows, t = i / kTopK;
      ++filled;
      ASSERT_EQ(std::memcmp(r.expert_in.data() + row * kHidden, all[s].x.data() + t * kHidden, kHidden * sizeof(float)),
                0)
          << "expert_in row " << row << " is not token " << t << " of rank " << s;
    }
  EXPECT_EQ(filled, r.offsets.back());
}

int64_t num_experts_for(int P) { return 2 * P; }

TEST(Dispatch, rowwise_matches_alltoall_bitwise_and_reference_dropless) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t N = num_experts_for(comm.size());
  const Inputs in = make_inputs(comm.rank(), N, 0.0, 11);
  const Results rowwise = run_layer("rowwise", comm, N, 1.25, /*dropless=*/true, in);
  const Results alltoall = run_layer("alltoall", comm, N, 1.25, /*dropless=*/true, in);
  expect_backends_identical(rowwise, alltoall);
  for (int32_t v : rowwise.route_index) ASSERT_GE(v, 0) << "dropless dropped a route";
  EXPECT_EQ(rowwise.bytes, 2 * kTokens * kTopK * kHidden * static_cast<int64_t>(sizeof(float)));

  const std::vector<Inputs> all = gather_inputs(comm, in);
  const Reference ref = reference(all[comm.rank()], rowwise.route_index);
  expect_close(rowwise.out, ref.out, ref.out_scale, 1e-6, "combine output");
  expect_close(rowwise.dweights, ref.dweights, ref.dweights_scale, 1e-6, "dweights");
  expect_close(rowwise.dx, ref.dx, ref.dx_scale, 1e-6, "dx");
  expect_expert_rows(rowwise, all, comm.rank(), N, rank_capacity(kTokens, kTopK, comm.size(), 1.25, true));
}

TEST(Dispatch, forced_overflow_drops_exactly_the_tail) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int P = comm.size();
  const int64_t N = num_experts_for(P);
  const double cf = 0.25;
  const int64_t rows = rank_capacity(kTokens, kTopK, P, cf, false);
  const Inputs in = make_inputs(comm.rank(), N, 0.9, 23);  // most tokens route to expert 0
  const Results rowwise = run_layer("rowwise", comm, N, cf, false, in);
  const Results alltoall = run_layer("alltoall", comm, N, cf, false, in);
  expect_backends_identical(rowwise, alltoall);

  const std::vector<Inputs> all = gather_inputs(comm, in);
  const auto naive = naive_route_index(all, N, rows);
  EXPECT_EQ(rowwise.route_index, naive[comm.rank()]) << "kept routes differ from the tail-drop rule";
  int64_t naive_dropped = 0;
  for (const auto& routes : naive) naive_dropped += std::count(routes.begin(), routes.end(), -1);
  int64_t dropped = std::count(rowwise.route_index.begin(), rowwise.route_index.end(), -1), total = 0;
  MPI_Allreduce(&dropped, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(total, naive_dropped);
  EXPECT_GT(total, 0) << "the test routing did not overflow";
  // Dropped routes contribute zero to out and dx and get dweights 0: the reference uses only kept routes.
  const Reference ref = reference(all[comm.rank()], naive[comm.rank()]);
  expect_close(rowwise.out, ref.out, ref.out_scale, 1e-6, "combine output");
  expect_close(rowwise.dweights, ref.dweights, ref.dweights_scale, 1e-6, "dweights");
  expect_close(rowwise.dx, ref.dx, ref.dx_scale, 1e-6, "dx");
  for (size_t i = 0; i < rowwise.route_index.size(); ++i)
    if (rowwise.route_index[i] < 0) {
      EXPECT_EQ(rowwise.dweights[i], 0.0f);
    }
  expect_expert_rows(rowwise, all, comm.rank(), N, rows);
}

// A second microbatch's forward runs while the first still holds its lease (slots_per_layer = 2),
// then both backwards run in reverse order: results equal those of one microbatch at a time.
TEST(Dispatch, two_microbatches_in_flight_match_one_at_a_time) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t N = num_experts_for(comm.size()), T = kTokens, K = kTopK, D = kHidden;
  for (const std::string backend : {"rowwise", "alltoall"}) {
    const Inputs in[2] = {make_inputs(comm.rank(), N, 0.5, 31), make_inputs(comm.rank(), N, 0.5, 37)};
    const Results alone[2] = {run_layer(backend, comm, N, 1.0, false, in[0]), run_layer(backend, comm, N, 1.0, false, in[1])};
    auto disp = make_dispatcher(backend, comm, N, 1.0, false);
    const int64_t E = disp->local_experts();
    Arena arena("dispatch_test.in_flight");
    disp->reserve_buffers(DispatchShape{T, K, D, 1, 2}, arena);
    arena.commit();
    Inputs io[2] = {in[0], in[1]};
    Results r[2];
    Lease lease[2];
    std::vector<int32_t> counts(N);
    RoutePlan plan[2];
    for (int m = 0; m < 2; ++m) {
      r[m].route_index.assign(T * K, -7);
      r[m].offsets.assign(E + 1, -7);
      r[m].out.assign(T * D, 0.0f);
      r[m].dweights.assign(T * K, 0.0f);
      r[m].dx.assign(T * D, 0.0f);
      plan[m] = {i32_tensor(r[m].route_index.data(), {T * K}), i32_tensor(r[m].offsets.data(), {E + 1})};
      const Tensor topk = i32_tensor(io[m].topk.data(), {T, K});
      lease[m] = disp->acquire(0);
      route_counts(i32_tensor(counts.data(), {N}), topk);
      disp->place_routes(0, plan[m], topk, i32_tensor(counts.data(), {N}), {});
      disp->dispatch(lease[m].buffers.expert_in, f32_tensor(io[m].x.data(), {T, D}), plan[m], K, {});
      experts_forward(lease[m].buffers.expert_out, lease[m].buffers.expert_in, r[m].offsets, disp->first_expert());
      disp->combine(f32_tensor(r[m].out.data(), {T, D}), lease[m].buffers.expert_out,
                    f32_tensor(io[m].weights.data(), {T, K}), plan[m], K, {});
    }
    EXPECT_NE(lease[0].buffers.expert_in.data, lease[1].buffers.expert_in.data);
    for (int m = 1; m >= 0; --m) {
      const ExpertBuffers grad = disp->grad_buffers();
      disp->combine_backward(grad.expert_out, f32_tensor(r[m].dweights.data(), {T, K}),
                             f32_tensor(io[m].dout.data(), {T, D}), lease[m].buffers.expert_out,
                             f32_tensor(io[m].weights.data(), {T, K}), plan[m], K, {});
      experts_forward(grad.expert_in, grad.expert_out, r[m].offsets, disp->first_expert());
      disp->dispatch_backward(f32_tensor(r[m].dx.data(), {T, D}), grad.expert_in, plan[m], K, {});
      disp->release(lease[m]);
    }
    for (int m = 0; m < 2; ++m) {
      SCOPED_TRACE(backend + " microbatch " + std::to_string(m));
      expect_bit_identical(r[m].route_index, alone[m].route_index, "route_index");
      expect_bit_identical(r[m].out, alone[m].out, "combine output");
      expect_bit_identical(r[m].dweights, alone[m].dweights, "dweights");
      expect_bit_identical(r[m].dx, alone[m].dx, "dx");
    }
  }
}

TEST(Dispatch, exhausted_lease_pool_is_an_error_and_release_reuses_buffers) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t N = num_experts_for(comm.size());
  for (const std::string backend : {"rowwise", "alltoall"}) {
    SCOPED_TRACE(backend);
    auto disp = make_dispatcher(backend, comm, N, 1.25, false);
    Arena arena("dispatch_test.leases");
    disp->reserve_buffers(DispatchShape{kTokens, kTopK, kHidden, 2, 1}, arena);
    arena.commit();
    const Lease first = disp->acquire(0);
    const Lease other_layer = disp->acquire(1);  // another layer's pool is independent
    EXPECT_NE(first.buffers.expert_in.data, other_layer.buffers.expert_in.data);
    try {
      disp->acquire(0);
      ADD_FAILURE() << "a second lease of layer 0 with one slot was granted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("layer 0"), std::string::npos) << msg;
      EXPECT_NE(msg.find("parallel.lease_slots"), std::string::npos) << msg;
    }
    disp->release(first);
    const Lease again = disp->acquire(0);
    EXPECT_EQ(again.slot, first.slot);
    EXPECT_EQ(again.buffers.expert_in.data, first.buffers.expert_in.data);
    EXPECT_EQ(again.buffers.expert_out.data, first.buffers.expert_out.data);
    disp->release(again);
    EXPECT_THROW(disp->release(again), Error);  // not held any more
    disp->release(other_layer);
  }
}

// The capacity rule has one home (rank_capacity); every backend's expert_rows and its buffers follow it.
TEST(Dispatch, every_backend_sizes_its_buffers_by_the_shared_capacity_rule) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  LocalCommunicator alone;
  const int64_t N = num_experts_for(comm.size());
  struct Case {
    int64_t tokens, top_k;
    double capacity_factor;
    bool dropless;
  };
  const Case cases[] = {{kTokens, kTopK, 1.25, false}, {kTokens, kTopK, 0.25, false}, {kTokens, kTopK, 100.0, false},
                        {kTokens, kTopK, 1.25, true}, {7, 2, 1.0, false}};
  for (const std::string backend : {"local", "rowwise", "alltoall"}) {
    Communicator& group = backend == "local" ? static_cast<Communicator&>(alone) : comm;
    for (const Case& c : cases) {
      SCOPED_TRACE(backend + " tokens " + std::to_string(c.tokens) + " capacity_factor " +
                   std::to_string(c.capacity_factor) + (c.dropless ? " dropless" : ""));
      auto disp = make_dispatcher(backend, group, N, c.capacity_factor, c.dropless);
      const int64_t rows = rank_capacity(c.tokens, c.top_k, group.size(), c.capacity_factor, c.dropless);
      EXPECT_EQ(disp->expert_rows(c.tokens, c.top_k), rows);
      Arena arena("dispatch_test.capacity");
      disp->reserve_buffers(DispatchShape{c.tokens, c.top_k, kHidden, 1, 1}, arena);
      arena.commit();
      const Lease lease = disp->acquire(0);
      EXPECT_EQ(lease.buffers.expert_in.dim(0), rows);
      EXPECT_EQ(lease.buffers.expert_out.dim(0), rows);
      EXPECT_EQ(disp->grad_buffers().expert_in.dim(0), rows);
      disp->release(lease);
    }
  }
}

// bytes_moved() through the TokenDispatcher interface: every kept route's row once in dispatch and
// once in combine (what RowwiseDispatcher::bytes_moved and AllToAllDispatcher::bytes_moved counted),
// the remote part those whose owner is another rank; 0 for local.
TEST(Dispatch, bytes_moved_counts_each_kept_row_in_dispatch_and_combine) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int P = comm.size(), me = comm.rank();
  const int64_t N = num_experts_for(P);
  const double cf = 0.5;  // drops: dropped routes move nothing
  const int64_t rows = rank_capacity(kTokens, kTopK, P, cf, false);
  const Inputs in = make_inputs(me, N, 0.7, 41);
  const auto naive = naive_route_index(gather_inputs(comm, in), N, rows);
  int64_t kept = 0, remote = 0;
  for (int32_t v : naive[me]) {
    kept += v >= 0;
    remote += v >= 0 && v / rows != me;
  }
  ASSERT_LT(kept, kTokens * kTopK) << "the test routing should drop routes";
  ASSERT_GT(remote, 0) << "the test routing should send rows to another rank";
  const int64_t row_bytes = kHidden * static_cast<int64_t>(sizeof(float));
  for (const std::string backend : {"rowwise", "alltoall"}) {
    SCOPED_TRACE(backend);
    const Results r = run_layer(backend, comm, N, cf, false, in);
    EXPECT_EQ(r.bytes, 2 * kept * row_bytes);
    EXPECT_EQ(r.remote_bytes, 2 * remote * row_bytes);
  }
  LocalCommunicator alone;
  const Results local = run_layer("local", alone, N, cf, false, in);
  EXPECT_EQ(local.bytes, 0);
  EXPECT_EQ(local.remote_bytes, 0);
}

// place_routes of MoE layer `layer` with `counts` in place of this rank's histogram of its topk_idx.
void place_with_counts(TokenDispatcher& disp, Inputs& in, std::vector<int32_t> counts, int layer) {
  const int64_t T = kTokens, K = kTopK, E = disp.local_experts();
  std::vector<int32_t> route_index(T * K), offsets(E + 1);
  const RoutePlan plan{i32_tensor(route_index.data(), {T * K}), i32_tensor(offsets.data(), {E + 1})};
  disp.place_routes(layer, plan, i32_tensor(in.topk.data(), {T, K}),
                    i32_tensor(counts.data(), {static_cast<int64_t>(counts.size())}), {});
}

void expect_error_naming(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "wrong counts were accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

// Every rank moves one route of its counts from one expert to another (the total stays T*K): each
// rank's check against its own topk_idx fails, naming the layer and the expert.
TEST(Dispatch, counts_that_are_not_the_topk_histogram_fail_naming_the_layer) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  LocalCommunicator alone;
  const int64_t N = num_experts_for(comm.size());
  for (const std::string backend : {"local", "rowwise", "alltoall"}) {
    SCOPED_TRACE(backend);
    Communicator& group = backend == "local" ? static_cast<Communicator&>(alone) : comm;
    auto disp = make_dispatcher(backend, group, N, 1.25, false);
    Arena arena("dispatch_test.counts");
    disp->reserve_buffers(DispatchShape{kTokens, kTopK, kHidden, 4, 1, 3}, arena);  // MoE layer 3 only
    arena.commit();
    EXPECT_THROW(disp->acquire(2), Error) << "a dense layer has no expert buffers";
    Inputs in = make_inputs(comm.rank(), N, 0.0, 53);
    std::vector<int32_t> counts(N);
    route_counts(i32_tensor(counts.data(), {N}), i32_tensor(in.topk.data(), {kTokens, kTopK}));
    place_with_counts(*disp, in, counts, 3);  // the true counts pass
    const auto from = std::max_element(counts.begin(), counts.end()) - counts.begin();
    const int64_t to = (from + 1) % N;
    --counts[from], ++counts[to];
    expect_error_naming([&] { place_with_counts(*disp, in, counts, 3); }, {"MoE layer 3", "expert_counts["});
  }
}

// Rank 0 reports one route too many: the agreed counts are inconsistent, and every rank (not only
// rank 0) fails in the same call, naming the layer and the rank, so no rank is left waiting.
TEST(Dispatch, inconsistent_agreed_counts_fail_on_every_rank) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t N = num_experts_for(comm.size());
  for (const std::string backend : {"rowwise", "alltoall"}) {
    SCOPED_TRACE(backend);
    auto disp = make_dispatcher(backend, comm, N, 1.25, false);
    Arena arena("dispatch_test.agreed_counts");
    disp->reserve_buffers(DispatchShape{kTokens, kTopK, kHidden, 3, 1}, arena);
    arena.commit();
    Inputs in = make_inputs(comm.rank(), N, 0.0, 59);
    std::vector<int32_t> counts(N);
    route_counts(i32_tensor(counts.data(), {N}), i32_tensor(in.topk.data(), {kTokens, kTopK}));
    if (comm.rank() == 0) ++counts[0];
    expect_error_naming([&] { place_with_counts(*disp, in, counts, 2); },
                        {"MoE layer 2", "rank 0's expert_counts add up to " + std::to_string(kTokens * kTopK + 1)});
  }
}

TEST(Dispatch, factory_names_the_backends) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  try {
    make_dispatcher("nccl-magic", comm, num_experts_for(comm.size()), 1.25, false);
    ADD_FAILURE() << "unknown backend accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* name : {"local", "rowwise", "alltoall"}) EXPECT_NE(msg.find(name), std::string::npos) << msg;
  }
  // local holds every expert on one rank: refused for an EP group of several ranks.
  EXPECT_THROW(make_dispatcher("local", comm, num_experts_for(comm.size()), 1.25, false), Error);
  EXPECT_STREQ(make_dispatcher("alltoall", comm, num_experts_for(comm.size()), 1.25, false)->name(), "alltoall");
  EXPECT_STREQ(make_dispatcher("rowwise", comm, num_experts_for(comm.size()), 1.25, false)->name(), "rowwise");
}

}  // namespace
}  // namespace moe
