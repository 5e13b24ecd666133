// ranks: 2 4
// MpiCommunicator collectives with inputs chosen so the exact result is known on every rank
// (FP32 values are small integers, so sums are exact), their argument checks, and
// LocalCommunicator's one-rank semantics.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "moe/comm/local_communicator.h"
#include "moe/comm/launcher.h"
#include "moe/comm/mpi_communicator.h"

namespace moe {
namespace {

MpiCommunicator& world() {
  static MpiCommunicator comm(MPI_COMM_WORLD);
  return comm;
}

Tensor f32(std::vector<float>& v) {
  return f32_tensor(v.data(), {static_cast<int64_t>(v.size())});
}
Tensor i32(std::vector<int32_t>& v) {
  return i32_tensor(v.data(), {static_cast<int64_t>(v.size())});
}
Tensor i64(std::vector<int64_t>& v) {
  return Tensor(v.data(), DType::I64, {static_cast<int64_t>(v.size())});
}

// Runs fn, which must throw moe::Error whose message contains `expected`.
template <typename Fn>
void expect_error(Fn fn, const std::string& expected) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one containing: " << expected;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << expected;
  }
}

TEST(MpiCommunicator, rank_and_size_match_mpi) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(world().rank(), rank);
  EXPECT_EQ(world().size(), size);
  EXPECT_EQ(detect_launcher().kind, Launcher::Mpi);
  world().barrier();
}

TEST(MpiRuntime, leaves_mpi_initialized_by_someone_else_running) {
  {
    // The test main already called MPI_Init, so this runtime must neither re-initialize nor
    // finalize.
    MpiRuntime runtime(nullptr, nullptr);
    EXPECT_EQ(runtime.world().size(), world().size());
    EXPECT_EQ(runtime.world().rank(), world().rank());
  }
  int finalized = 1;
  MPI_Finalized(&finalized);
  EXPECT_EQ(finalized, 0);
  world().barrier();
}

TEST(MpiCommunicator, all_reduce_sum_f32_is_exact) {
  const int r = world().rank(), p = world().size();
  std::vector<float> buf(7);
  for (int i = 0; i < 7; ++i) buf[i] = static_cast<float>((r + 1) * (i + 1));
  world().all_reduce(f32(buf), ReduceOp::Sum);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(buf[i], static_cast<float>((i + 1) * p * (p + 1) / 2)) << i;
}

TEST(MpiCommunicator, all_reduce_max_i32_with_negatives) {
  const int r = world().rank(), p = world().size();
  std::vector<int32_t> buf(9);
  // Odd positions grow with the rank, even positions shrink: the max comes from the last rank
  // for odd i and from rank 0 for even i.
  for (int i = 0; i < 9; ++i) buf[i] = (i % 2 ? r : -r) * 10 + i;
  world().all_reduce(i32(buf), ReduceOp::Max);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(buf[i], i % 2 ? (p - 1) * 10 + i : i) << i;
}

TEST(MpiCommunicator, all_reduce_sum_max_i64) {
  const int r = world().rank(), p = world().size();
  std::vector<int64_t> sum(3), max(3);
  for (int i = 0; i < 3; ++i) sum[i] = max[i] = (int64_t{1} << 40) * (r + 1) + i;
  world().all_reduce(i64(sum), ReduceOp::Sum);
  world().all_reduce(i64(max), ReduceOp::Max);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(sum[i], (int64_t{1} << 40) * p * (p + 1) / 2 + int64_t{p} * i);
    EXPECT_EQ(max[i], (int64_t{1} << 40) * p + i);
  }
}

TEST(MpiCommunicator, reduce_scatter_sum_f32_gives_each_rank_its_block) {
  const int r = world().rank(), p = world().size(), n = 5;
  std::vector<float> in(p * n), out(n, -1.0f);
  for (int k = 0; k < p * n; ++k) in[k] = static_cast<float>((r + 1) * (k + 1));
  world().reduce_scatter(f32(out), f32(in), ReduceOp::Sum);
  for (int j = 0; j < n; ++j)
    EXPECT_EQ(out[j], static_cast<float>((r * n + j + 1) * p * (p + 1) / 2)) << j;
}

TEST(MpiCommunicator, reduce_scatter_max_i32) {
  const int r = world().rank(), p = world().size(), n = 3;
  std::vector<int32_t> in(p * n), out(n, -1);
  for (int k = 0; k < p * n; ++k) in[k] = (k % 2 ? -r : r) * 1000 + k;
  world().reduce_scatter(i32(out), i32(in), ReduceOp::Max);
  for (int j = 0; j < n; ++j) {
    const int k = r * n + j;
    EXPECT_EQ(out[j], k % 2 ? k : (p - 1) * 1000 + k) << j;
  }
}

TEST(MpiCommunicator, all_gather_places_rank_blocks_in_order) {
  const int r = world().rank(), p = world().size(), n = 3;
  std::vector<float> in_f(n), out_f(p * n, -1.0f);
  std::vector<int32_t> in_i(n), out_i(p * n, -1);
  for (int i = 0; i < n; ++i) {
    in_f[i] = static_cast<float>(r * 10 + i) + 0.5f;
    in_i[i] = -(r * 10 + i);
  }
  world().all_gather(f32(out_f), f32(in_f));
  world().all_gather(i32(out_i), i32(in_i));
  for (int b = 0; b < p; ++b)
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(out_f[b * n + i], static_cast<float>(b * 10 + i) + 0.5f);
      EXPECT_EQ(out_i[b * n + i], -(b * 10 + i));
    }
}

// Rank s sends (s + d) % 3 elements to rank d: uneven, and zero for some pairs (s = d = 0 and
// wherever s + d is a multiple of 3). Element k of that block is s * 1000 + d * 100 + k.
int64_t pair_count(int s, int d) { return (s + d) % 3; }

template <typename T>
void check_all_to_all_v(DType dtype) {
  const int r = world().rank(), p = world().size();
  std::vector<int64_t> send_counts(p), recv_counts(p);
  std::vector<T> in, out, expected;
  for (int d = 0; d < p; ++d) {
    send_counts[d] = pair_count(r, d);
    for (int64_t k = 0; k < send_counts[d]; ++k)
      in.push_back(static_cast<T>(r * 1000 + d * 100 + k));
  }
  for (int s = 0; s < p; ++s) {
    recv_counts[s] = pair_count(s, r);
    for (int64_t k = 0; k < recv_counts[s]; ++k)
      expected.push_back(static_cast<T>(s * 1000 + r * 100 + k));
  }
  out.assign(expected.size(), static_cast<T>(-1));
  world().all_to_all_v(Tensor(out.data(), dtype, {static_cast<int64_t>(out.size())}), recv_counts,
                       Tensor(in.data(), dtype, {static_cast<int64_t>(in.size())}), send_counts);
  EXPECT_EQ(out, expected);
}

TEST(MpiCommunicator, all_to_all_v_uneven_counts_with_zeros) {
  check_all_to_all_v<float>(DType::F32);
  check_all_to_all_v<int32_t>(DType::I32);
  check_all_to_all_v<int64_t>(DType::I64);
}

TEST(MpiCommunicator, broadcast_from_last_rank) {
  const int r = world().rank(), root = world().size() - 1;
  std::vector<float> f(5, -1.0f);
  std::vector<int32_t> i(6, -1);
  if (r == root) {
    for (int k = 0; k < 5; ++k) f[k] = static_cast<float>(k * 7 + 3) + 0.25f;
    for (int k = 0; k < 6; ++k) i[k] = k * 11 - 4;
  }
  world().broadcast(f32(f), root);
  world().broadcast(i32(i), root);
  for (int k = 0; k < 5; ++k) EXPECT_EQ(f[k], static_cast<float>(k * 7 + 3) + 0.25f);
  for (int k = 0; k < 6; ++k) EXPECT_EQ(i[k], k * 11 - 4);
}

TEST(MpiCommunicator, split_orders_by_key_and_collectives_stay_inside_groups) {
  const int r = world().rank(), p = world().size();
  // Two groups by parity; key = -rank orders each group by descending world rank.
  auto group = world().split(r % 2, -r);
  std::vector<int32_t> members;
  for (int q = p - 1; q >= 0; --q)
    if (q % 2 == r % 2) members.push_back(q);
  ASSERT_EQ(group->size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[group->rank()], r);

  std::vector<int32_t> in{r}, gathered(members.size(), -1);
  group->all_gather(i32(gathered), i32(in));
  EXPECT_EQ(gathered, members);

  std::vector<int32_t> sum{r};
  group->all_reduce(i32(sum), ReduceOp::Sum);
  EXPECT_EQ(sum[0], std::accumulate(members.begin(), members.end(), 0));

  // A split of a split works too, and frees cleanly.
  auto single = group->split(group->rank(), 0);
  EXPECT_EQ(single->size(), 1);
  EXPECT_EQ(single->rank(), 0);
}

// A message above the shared-memory eager limit moves only while its sender is inside MPI. The
// send queue's progress thread keeps it moving while the sender computes (here: sleeps, making no
// MPI call for 1.5 s), so the receiver has it before the sender's next call. Without the thread the
// receive would return only after that sleep. The check is causal, not a time bound a loaded
// machine could miss: the receive ended before the moment the sender's sleep ended (steady_clock
// is CLOCK_MONOTONIC, one clock for the processes of one host; mpirun starts them on this one).
TEST(MpiCommunicator, a_queued_send_reaches_its_receiver_while_the_sender_makes_no_mpi_call) {
  if (!world().threads_may_call_concurrently()) GTEST_SKIP() << "MPI does not provide MPI_THREAD_MULTIPLE";
  constexpr int64_t kFloats = 1 << 20;  // 4 MiB: far above any eager limit
  const int r = world().rank();
  std::vector<float> buf(kFloats, r == 0 ? 3.0f : 0.0f);
  world().barrier();
  const auto ticks = [] { return std::chrono::steady_clock::now().time_since_epoch().count(); };
  std::vector<int64_t> sleep_ended{0};
  if (r == 0) {
    world().send(f32(buf), 1, 7);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    sleep_ended[0] = ticks();
    world().wait_sends();
    world().send(i64(sleep_ended), 1, 8);
    world().wait_sends();
  } else if (r == 1) {
    world().recv(f32(buf), 0, 7);
    const int64_t received = ticks();
    world().recv(i64(sleep_ended), 0, 8);
    EXPECT_LT(received, sleep_ended[0]) << "the receive waited for the sender's next MPI call ("
                                        << std::chrono::duration<double>(std::chrono::steady_clock::duration(
                                               received - sleep_ended[0])).count()
                                        << " s after its sleep ended)";
    EXPECT_EQ(buf.front(), 3.0f);
    EXPECT_EQ(buf.back(), 3.0f);
  }
  world().barrier();
}

TEST(MpiCommunicator, mismatched_sizes_and_types_are_errors) {
  const int p = world().size();
  std::vector<float> a(6), b(6 * p + 1);
  std::vector<int32_t> c(6);
  expect_error([&] { world().reduce_scatter(f32(a), f32(b), ReduceOp::Sum); },
               "reduce_scatter (rank " + std::to_string(world().rank()) + "): in has " +
                   std::to_string(6 * p + 1) + " elements, expected size " + std::to_string(p));
  expect_error([&] { world().all_gather(f32(b), f32(a)); }, "all_gather");
  expect_error([&] { world().all_gather(f32(a), i32(c)); }, "out has dtype F32 but in has I32");
  std::vector<int64_t> counts(p, 0);
  counts[0] = 5;  // sums to 5, but the tensors have 6 elements
  expect_error([&] { world().all_to_all_v(f32(a), counts, f32(a), counts); },
               "send_counts sum to 5 elements but in has 6");
  expect_error([&] { world().all_to_all_v(f32(a), {6}, f32(a), std::vector<int64_t>(p + 1, 0)); },
               "expected one per rank");
  std::vector<int64_t> negative(p, 0);
  negative[0] = -1;
  negative[p - 1] += 7;
  expect_error([&] { world().all_to_all_v(f32(a), negative, f32(a), negative); }, "is negative");
  expect_error([&] { world().broadcast(f32(a), p); }, "root " + std::to_string(p));
  std::vector<uint16_t> half(4);
  expect_error([&] { world().all_reduce(Tensor(half.data(), DType::BF16, {4}), ReduceOp::Sum); },
               "has dtype BF16; supported are F32, I32 and I64");
  Tensor on_device(a.data(), DType::F32, {6}, Device::CUDA);
  expect_error([&] { world().all_reduce(on_device, ReduceOp::Sum); }, "is a cuda tensor");
  // Nothing was sent: every rank threw before communicating, so the group is still in step.
  std::vector<int32_t> one{1};
  world().all_reduce(i32(one), ReduceOp::Sum);
  EXPECT_EQ(one[0], p);
}

TEST(LocalCommunicator, one_rank_collectives_are_identities) {
  LocalCommunicator local;
  EXPECT_EQ(local.rank(), 0);
  EXPECT_EQ(local.size(), 1);
  std::vector<float> buf{1.5f, -2.0f, 3.0f};
  local.all_reduce(f32(buf), ReduceOp::Sum);
  local.all_reduce(f32(buf), ReduceOp::Max);
  local.broadcast(f32(buf), 0);
  local.barrier();
  EXPECT_EQ(buf, (std::vector<float>{1.5f, -2.0f, 3.0f}));

  std::vector<int32_t> in{4, 5, 6}, out(3, -1);
  local.reduce_scatter(i32(out), i32(in), ReduceOp::Sum);
  EXPECT_EQ(out, in);
  out.assign(3, -1);
  local.all_gather(i32(out), i32(in));
  EXPECT_EQ(out, in);
  out.assign(3, -1);
  local.all_to_all_v(i32(out), {3}, i32(in), {3});
  EXPECT_EQ(out, in);
  std::vector<int32_t> none;
  local.all_to_all_v(i32(none), {0}, i32(none), {0});

  auto sub = local.split(7, 3);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  EXPECT_NE(dynamic_cast<LocalCommunicator*>(sub.get()), nullptr);
}

TEST(LocalCommunicator, checks_arguments_like_mpi) {
  LocalCommunicator local;
  std::vector<float> a(3), b(4);
  expect_error([&] { local.reduce_scatter(f32(a), f32(b), ReduceOp::Sum); },
               "in has 4 elements, expected size 1");
  expect_error([&] { local.all_gather(f32(b), f32(a)); }, "out has 4 elements");
  expect_error([&] { local.all_to_all_v(f32(b), {4}, f32(a), {3}); },
               "sends 3 elements to itself but expects to receive 4");
  expect_error([&] { local.broadcast(f32(a), 1); }, "root 1");
  std::vector<uint8_t> bytes(3);
  expect_error([&] { local.all_reduce(Tensor(bytes.data(), DType::U8, {3}), ReduceOp::Sum); },
               "dtype U8");
}

}  // namespace
}  // namespace moe
