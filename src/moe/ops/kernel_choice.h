// Which implementation the CUDA ops use where there are two: the fast kernels (default) or the
// plain reference kernels they were checked against (e.g. the tiled grouped product next to the
// CUTLASS grouped GEMM). `moetrain bench --check` computes one batch's loss both ways before it
// times anything. Process-wide; switch only between steps.
#pragma once

namespace moe {

enum class KernelChoice { Fast, Reference };

void set_kernel_choice(KernelChoice choice);
KernelChoice kernel_choice();

}  // namespace moe
