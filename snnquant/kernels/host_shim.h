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

// exp(x) for float, written so that the compiler can vectorise a loop that calls it (the C
// library's expf is an opaque call): x = n ln2 + r with n = rint(x / ln2), |r| <= ln2 / 2, a
// degree-7 polynomial for exp(r) (Cephes' expf), and 2^n applied in two halves so that results
// near the overflow and underflow limits stay right (overflow gives inf, underflow 0 or a
// subnormal). Within 2 ulp of expf for normal results; NaN gives NaN.
static inline float snq_host_expf(float x) {
    const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
    const float n = rintf(xc * 1.44269504088896341f);
    const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
    const float r2 = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r2 + r + 1.0f;
    const int ni = (int)n;
    const int half = ni / 2;
    unsigned int b1 = (unsigned int)(half + 127) << 23;
    unsigned int b2 = (unsigned int)(ni - half + 127) << 23;
    float s1, s2;
    __builtin_memcpy(&s1, &b1, sizeof(s1));
    __builtin_memcpy(&s2, &b2, sizeof(s2));
    const float result = (p * s1) * s2;
    return x != x ? x : result;
}

// The C entry points of the CPU build, one argument list for both modes (cpu_entry.h: one
// configuration, host_entry.h: all of them): the configuration codes (dtype 0 float32, 1 float64,
// 2 float16, 3 bfloat16; neuron 0 if, 1 lif, 2 plif; surrogate 0 sigmoid, 1 atan; the others
// 0 | 1), the arguments of the kernel (neuron.cu) and the thread count. They return 0, or -1
// (running nothing) for a configuration the library does not hold.
#define SNQ_CPU_FORWARD_ENTRY                                                                    \
    extern "C" int snq_cpu_forward(                                                              \
        int dtype, int neuron, int decay_input, int hard_reset, int detach_reset, int surrogate,  \
        int store_v_seq, const void* x_seq, const void* v_init, const void* step_ptr,             \
        const void* k_ptr, void* spike_seq, void* v_last, void* v_seq, void* h_seq, double tau,   \
        double v_threshold, double v_reset, double qmin, double qmax, int T, long long N,         \
        int num_threads)
#define SNQ_CPU_BACKWARD_ENTRY                                                                   \
    extern "C" int snq_cpu_backward(                                                             \
        int dtype, int neuron, int decay_input, int hard_reset, int detach_reset, int surrogate,  \
        int store_v_seq, const void* h_seq, const void* x_seq, const void* v_init,                \
        const void* step_ptr, const void* k_ptr, const void* grad_spike_seq,                      \
        const void* grad_v_seq, const void* grad_v_last, void* grad_x_seq, void* grad_v_init,     \
        void* grad_step_partial, void* grad_k_partial, double tau, double v_threshold,            \
        double v_reset, double qmin, double qmax, double alpha, int T, long long N,               \
        int num_threads)

#endif  // SNQ_HOST_SHIM_H
