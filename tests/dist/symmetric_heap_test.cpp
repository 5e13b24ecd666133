// ranks: 2 4
// The CPU symmetric heap: every rank stores straight into every peer's segment, and after
// sync() each rank sees exactly what every peer wrote, round after round.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "moe/comm/local_communicator.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/comm/symmetric_heap.h"

namespace moe {
namespace {

MpiCommunicator& world() {
  static MpiCommunicator comm(MPI_COMM_WORLD);
  return comm;
}

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

// An odd slot size, so slots do not line up with cache lines.
constexpr int kSlot = 1001;

// What `writer` stores at element k of its slot in `owner`'s segment in round `round`.
int32_t pattern(int round, int writer, int owner, int k) {
  return round * 10'000'000 + writer * 1'000'000 + owner * 100'000 + k;
}

// Each rank owns slot `writer` of every peer's segment: one round writes all slots, syncs, and
// checks every slot of its own segment. Returns the number of mismatched elements.
int exchange_round(SymmetricHeap& heap, int round) {
  const int me = heap.rank(), p = heap.size();
  auto* my_slot = static_cast<int32_t*>(heap.local()) + me * kSlot;
  for (int owner = 0; owner < p; ++owner) {
    auto* dst = static_cast<int32_t*>(heap.peer(my_slot, owner));
    for (int k = 0; k < kSlot; ++k) dst[k] = pattern(round, me, owner, k);
  }
  heap.sync();
  int wrong = 0;
  const auto* mine = static_cast<const int32_t*>(heap.local());
  for (int writer = 0; writer < p; ++writer)
    for (int k = 0; k < kSlot; ++k)
      if (mine[writer * kSlot + k] != pattern(round, writer, me, k)) ++wrong;
  // Nobody writes the next round until everyone has checked this one.
  heap.sync();
  return wrong;
}

TEST(MpiSymmetricHeap, starts_zeroed_and_sizes_match) {
  const int p = world().size();
  const size_t bytes = sizeof(int32_t) * kSlot * p;
  auto heap = make_mpi_symmetric_heap(world(), bytes);
  EXPECT_EQ(heap->rank(), world().rank());
  EXPECT_EQ(heap->size(), p);
  EXPECT_EQ(heap->bytes_per_rank(), bytes);
  for (int r = 0; r < p; ++r) {
    const auto* seg = static_cast<const unsigned char*>(heap->peer(heap->local(), r));
    size_t nonzero = 0;
    for (size_t b = 0; b < bytes; ++b) nonzero += seg[b] != 0;
    EXPECT_EQ(nonzero, 0u) << "peer " << r;
  }
  heap->sync();
}

TEST(MpiSymmetricHeap, every_rank_sees_exactly_what_each_peer_stored_each_round) {
  auto heap = make_mpi_symmetric_heap(world(), sizeof(int32_t) * kSlot * world().size());
  for (int round = 1; round <= 4; ++round) EXPECT_EQ(exchange_round(*heap, round), 0) << round;
}

TEST(MpiSymmetricHeap, heap_over_a_subgroup_stays_inside_it) {
  const int r = world().rank();
  // Pairs of contiguous ranks (an EP group of 2); with 2 ranks the whole world.
  auto group = world().split(r / 2, r);
  auto heap = make_mpi_symmetric_heap(*group, sizeof(int32_t) * kSlot * group->size());
  EXPECT_EQ(heap->size(), group->size());
  for (int round = 1; round <= 2; ++round) EXPECT_EQ(exchange_round(*heap, round), 0) << round;
}

TEST(MpiSymmetricHeap, peer_checks_bounds_and_rank) {
  const size_t bytes = 64;
  auto heap = make_mpi_symmetric_heap(world(), bytes);
  auto* base = static_cast<char*>(heap->local());
  // The end of the segment is a valid (end) pointer; one byte further is not.
  EXPECT_EQ(static_cast<char*>(heap->peer(base + bytes, 0)),
            static_cast<char*>(heap->peer(base, 0)) + bytes);
  expect_error([&] { heap->peer(base + bytes + 1, 0); }, "outside this rank's segment");
  expect_error([&] { heap->peer(base - 1, 0); }, "outside this rank's segment");
  expect_error([&] { heap->peer(base, world().size()); },
               "peer rank " + std::to_string(world().size()) + " is not in this group");
  expect_error([&] { heap->peer(base, -1); }, "peer rank -1");
  heap->sync();
}

TEST(MpiSymmetricHeap, needs_an_mpi_group_and_the_same_size_everywhere) {
  LocalCommunicator local;
  expect_error([&] { make_mpi_symmetric_heap(local, 64); }, "not an MpiCommunicator");
  // Every rank throws, so all leave the collective creation together.
  expect_error([&] { make_mpi_symmetric_heap(world(), 64 + 8 * world().rank()); },
               "different segment sizes");
  expect_error([&] { make_mpi_symmetric_heap(world(), 0); }, "must be positive");
  // The world is still in step.
  auto heap = make_mpi_symmetric_heap(world(), 16);
  heap->sync();
}

}  // namespace
}  // namespace moe
