// CPU entry points of the chip neuron kernels (neuron.cu's "Chip neurons" section), compiled
// after host_shim.h and neuron.cu into one library that holds every chip and surrogate (see
// snnquant/kernels/chip.py). Loops and threading only: each neuron runs neuron.cu's
// snq_chip_forward_neuron / snq_chip_backward_neuron, the functions the GPU kernels run for one
// thread; OpenMP threads share the neurons. Compiled without fast math and without FMA
// contraction (-ffp-contract=off); every forward value is an integer below 2^53 in float64, so
// the spikes and states are exact and equal the torch step's.
//
// Both entry points return 0, or -1 (running nothing) for a chip or surrogate code out of range.
#ifndef SNQ_CHIP_ENTRY_H
#define SNQ_CHIP_ENTRY_H

#ifdef _OPENMP
#include <omp.h>
#endif

// below this many elements (T * M) one thread is faster than waking the others
#define SNQ_CHIP_PARALLEL_MIN_ELEMENTS 32768LL

namespace snq_chip_cpu {

static inline int threads_for(long long elements, long long M, int num_threads) {
    if (num_threads < 1 || elements < SNQ_CHIP_PARALLEL_MIN_ELEMENTS) {
        return 1;
    }
    return (long long)num_threads < M ? num_threads : (int)M;
}

template <int CHIP>
static void forward(const double* P, const double* x, const double* up, const double* down,
                    const double* counts, const double* weight, const double* bias,
                    const double* s0_init, const double* s1_init, double* out, double* save0,
                    double* save1, double* s0_last, double* s1_last, int T, long long M,
                    int out_features, int in_features, int num_threads) {
    const int threads = threads_for((long long)T * M, M, num_threads);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long long i = 0; i < M; ++i) {
        snq_chip_forward_neuron<CHIP>(P, x, up, down, counts, weight, bias, s0_init, s1_init,
                                      out, save0, save1, s0_last, s1_last, T, M, out_features,
                                      in_features, i);
    }
}

template <int CHIP, int SURROGATE>
static void backward(const double* P, const double* save0, const double* save1,
                     const double* s1_init, const double* bias, const double* grad_out,
                     const double* grad_s0_last, const double* grad_s1_last, double* grad_x,
                     double* grad_bias_partial, double* grad_s0_init, double* grad_s1_init,
                     int T, long long M, int out_features, int num_threads) {
    const int threads = threads_for((long long)T * M, M, num_threads);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long long i = 0; i < M; ++i) {
        snq_chip_backward_neuron<CHIP, SURROGATE>(P, save0, save1, s1_init, bias, grad_out,
                                                  grad_s0_last, grad_s1_last, grad_x,
                                                  grad_bias_partial, grad_s0_init,
                                                  grad_s1_init, T, M, out_features, i);
    }
}

}  // namespace snq_chip_cpu

extern "C" int snq_chip_cpu_forward(int chip, const double* P, const double* x,
                                    const double* up, const double* down, const double* counts,
                                    const double* weight, const double* bias,
                                    const double* s0_init, const double* s1_init, double* out,
                                    double* save0, double* save1, double* s0_last,
                                    double* s1_last, int T, long long M, int out_features,
                                    int in_features, int num_threads) {
#define SNQ_CHIP_FORWARD(CHIP)                                                                    \
    snq_chip_cpu::forward<CHIP>(P, x, up, down, counts, weight, bias, s0_init, s1_init, out,     \
                                save0, save1, s0_last, s1_last, T, M, out_features, in_features,  \
                                num_threads)
    switch (chip) {
        case SNQ_CHIP_XYLO: SNQ_CHIP_FORWARD(SNQ_CHIP_XYLO); return 0;
        case SNQ_CHIP_LOIHI: SNQ_CHIP_FORWARD(SNQ_CHIP_LOIHI); return 0;
        case SNQ_CHIP_SPECK: SNQ_CHIP_FORWARD(SNQ_CHIP_SPECK); return 0;
        default: return -1;
    }
#undef SNQ_CHIP_FORWARD
}

extern "C" int snq_chip_cpu_backward(int chip, int surrogate, const double* P,
                                     const double* save0, const double* save1,
                                     const double* s1_init, const double* bias,
                                     const double* grad_out, const double* grad_s0_last,
                                     const double* grad_s1_last, double* grad_x,
                                     double* grad_bias_partial, double* grad_s0_init,
                                     double* grad_s1_init, int T, long long M, int out_features,
                                     int num_threads) {
    if (surrogate < 0 || surrogate > 1 || chip < 0 || chip > 2) {
        return -1;
    }
#define SNQ_CHIP_BACKWARD(CHIP, SURROGATE)                                                        \
    snq_chip_cpu::backward<CHIP, SURROGATE>(P, save0, save1, s1_init, bias, grad_out,            \
                                            grad_s0_last, grad_s1_last, grad_x,                   \
                                            grad_bias_partial, grad_s0_init, grad_s1_init, T, M,  \
                                            out_features, num_threads)
#define SNQ_CHIP_BACKWARD_SURROGATE(CHIP)                                                         \
    if (surrogate == SNQ_SURROGATE_SIGMOID) {                                                    \
        SNQ_CHIP_BACKWARD(CHIP, SNQ_SURROGATE_SIGMOID);                                          \
    } else {                                                                                      \
        SNQ_CHIP_BACKWARD(CHIP, SNQ_SURROGATE_ATAN);                                             \
    }
    if (chip == SNQ_CHIP_XYLO) {
        SNQ_CHIP_BACKWARD_SURROGATE(SNQ_CHIP_XYLO)
    } else if (chip == SNQ_CHIP_LOIHI) {
        SNQ_CHIP_BACKWARD_SURROGATE(SNQ_CHIP_LOIHI)
    } else {
        SNQ_CHIP_BACKWARD_SURROGATE(SNQ_CHIP_SPECK)
    }
#undef SNQ_CHIP_BACKWARD_SURROGATE
#undef SNQ_CHIP_BACKWARD
    return 0;
}

#endif  // SNQ_CHIP_ENTRY_H
