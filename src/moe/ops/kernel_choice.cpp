#include "moe/ops/kernel_choice.h"

#include <atomic>

namespace moe {
namespace {
std::atomic<KernelChoice> g_choice{KernelChoice::Fast};
}  // namespace

void set_kernel_choice(KernelChoice choice) { g_choice.store(choice); }
KernelChoice kernel_choice() { return g_choice.load(); }

}  // namespace moe
