// Host shim: lets g++ compile neuron.cu unchanged, for the CPU tests of the kernel arithmetic.
//
// __global__/__device__ kernels become plain functions; the thread and block indices become
// thread-local globals that the host entry points (host_entry.h) set in a loop, one "thread" per
// neuron; the CUDA correctly rounded intrinsics become plain IEEE operators. Compile with
// -ffp-contract=off (and without -ffast-math) so that g++ evaluates every operation separately,
// exactly as the GPU intrinsics and PyTorch's CPU kernels do.
#ifndef SNQ_HOST_SHIM_H
#define SNQ_HOST_SHIM_H

#include <math.h>

#define SNQ_HOST_BUILD 1
#define __global__
#define __device__
#define __forceinline__ inline

struct snq_dim3 {
    unsigned int x, y, z;
};
static thread_local snq_dim3 threadIdx = {0u, 0u, 0u};
static thread_local snq_dim3 blockIdx = {0u, 0u, 0u};
static thread_local snq_dim3 blockDim = {1u, 1u, 1u};

static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }

#endif  // SNQ_HOST_SHIM_H
