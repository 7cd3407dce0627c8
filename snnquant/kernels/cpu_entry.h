// CPU entry points of the cpp backend: the arithmetic of neuron.cu, in loops laid out for a CPU.
//
// Included after host_shim.h and neuron.cu, and compiled once per configuration: the macros
//   SNQ_SCALAR (float | double | snq_half | snq_bfloat16) with its SNQ_DTYPE_CODE (0 | 1 | 2 | 3),
//   SNQ_NEURON (0 if, 1 lif, 2 plif),
//   SNQ_DECAY_INPUT, SNQ_HARD_RESET, SNQ_DETACH_RESET, SNQ_STORE_V_SEQ (0 | 1),
//   SNQ_SURROGATE (0 sigmoid, 1 atan)
// pick the one instantiation this library holds (see cpp_backend.py). The entry points take the
// configuration codes too (the argument list of host_entry.h's, which holds every instantiation)
// and return -1, running nothing, when they are not this library's.
//
// Loops and threading only: the neuron's arithmetic is neuron.cu's (snq_make_params,
// snq_forward_step, snq_backward_step, snq_membrane_after, snq_grad_k_term). The GPU runs one
// thread per neuron, each walking over all T steps; here the same per-element steps run in another
// loop nest: OpenMP threads share blocks of SNQ_BLOCK neighbouring neurons; inside a block, time
// is the outer loop and the neurons of the block the inner one, so the inner loop reads and writes
// SNQ_BLOCK consecutive elements of one step, keeps the block's state in a small array, and is
// vectorised by the compiler. No fast math and no FMA contraction (-ffp-contract=off): every
// operation is rounded as PyTorch rounds it, so spikes and membranes equal the torch backend's.
#ifndef SNQ_CPU_ENTRY_H
#define SNQ_CPU_ENTRY_H

#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef SNQ_BLOCK
#define SNQ_BLOCK 256
#endif

// below this many elements (T * N) one thread is faster than waking the others
#define SNQ_PARALLEL_MIN_ELEMENTS 32768LL

namespace snq_cpu {

typedef SNQ_SCALAR scalar_t;
typedef snq_compute<scalar_t>::type real;
typedef snq_params<real> params;

static inline int threads_for(long long elements, long long blocks, int num_threads) {
    if (num_threads < 1 || elements < SNQ_PARALLEL_MIN_ELEMENTS) {
        return 1;
    }
    return (long long)num_threads < blocks ? num_threads : (int)blocks;
}

static inline bool is_this_library(int dtype, int neuron, int decay_input, int hard_reset,
                                   int detach_reset, int surrogate, int store_v_seq) {
    return dtype == SNQ_DTYPE_CODE && neuron == SNQ_NEURON && decay_input == SNQ_DECAY_INPUT &&
           hard_reset == SNQ_HARD_RESET && detach_reset == SNQ_DETACH_RESET &&
           surrogate == SNQ_SURROGATE && store_v_seq == SNQ_STORE_V_SEQ;
}

// One block of n <= SNQ_BLOCK neurons starting at i0, all T steps. SAVE_H: write the charge.
template <bool SAVE_H>
static inline void forward_block(const params p, const scalar_t* __restrict__ x_seq,
                                 const scalar_t* __restrict__ v_init,
                                 scalar_t* __restrict__ spike_seq, scalar_t* __restrict__ v_last,
                                 scalar_t* __restrict__ v_seq, real* __restrict__ h_seq, int T,
                                 long long N, long long i0, int n) {
    real v[SNQ_BLOCK];
    for (int l = 0; l < n; ++l) {
        v[l] = snq_load(v_init, i0 + l);
    }
    for (int t = 0; t < T; ++t) {
        const long long base = (long long)t * N + i0;
        const scalar_t* __restrict__ x = x_seq + base;
        scalar_t* __restrict__ spike = spike_seq + base;
        for (int l = 0; l < n; ++l) {
            real h;
            snq_store(spike, l,
                      snq_forward_step<SNQ_NEURON, (bool)SNQ_DECAY_INPUT, (bool)SNQ_HARD_RESET>(
                          p, snq_load(x, l), v[l], h));
            if (SAVE_H) {
                h_seq[base + l] = h;
            }
            if (SNQ_STORE_V_SEQ) {
                snq_store(v_seq + base, l, v[l]);
            }
        }
    }
    for (int l = 0; l < n; ++l) {
        snq_store(v_last, i0 + l, v[l]);
    }
}

// One block of n neurons, reverse time. The step and k partial sums are always accumulated (a
// multiply-add per element) and written only when asked for; the branches that remain are
// template arguments, so the inner loop has none.
template <bool HAS_GRAD_SPIKE, bool HAS_GRAD_V_SEQ>
static inline void backward_block(
    const params p, const real* __restrict__ h_seq, const scalar_t* __restrict__ x_seq,
    const scalar_t* __restrict__ v_init, const scalar_t* __restrict__ grad_spike_seq,
    const scalar_t* __restrict__ grad_v_seq, const scalar_t* __restrict__ grad_v_last,
    scalar_t* __restrict__ grad_x_seq, scalar_t* __restrict__ grad_v_init,
    real* __restrict__ grad_step_partial, real* __restrict__ grad_k_partial, int T, long long N,
    long long i0, int n) {
    real grad_v[SNQ_BLOCK];
    real grad_step[SNQ_BLOCK];
    real grad_k[SNQ_BLOCK];
    for (int l = 0; l < n; ++l) {
        grad_v[l] = (grad_v_last != 0) ? snq_load(grad_v_last, i0 + l) : (real)0;
        grad_step[l] = (real)0;
        grad_k[l] = (real)0;
    }
    for (int t = T - 1; t >= 0; --t) {
        const long long base = (long long)t * N + i0;
        const real* __restrict__ h_t = h_seq + base;
        for (int l = 0; l < n; ++l) {
            const real grad_spike = HAS_GRAD_SPIKE ? snq_load(grad_spike_seq + base, l) : (real)0;
            const real gv = HAS_GRAD_V_SEQ ? grad_v[l] + snq_load(grad_v_seq + base, l)
                                           : grad_v[l];
            const snq_step_grads<real> g =
                snq_backward_step<SNQ_NEURON, (bool)SNQ_HARD_RESET, (bool)SNQ_DETACH_RESET,
                                  SNQ_SURROGATE>(p, h_t[l], grad_spike, gv);
            grad_step[l] = grad_step[l] + g.step;
            snq_store(grad_x_seq + base, l, g.x);
            if (SNQ_NEURON == SNQ_NEURON_PLIF) {
                const real v_before = (t > 0)
                    ? snq_membrane_after<(bool)SNQ_HARD_RESET>(p, h_t[l - N])
                    : snq_load(v_init, i0 + l);
                const real x = SNQ_DECAY_INPUT ? snq_load(x_seq + base, l) : (real)0;
                grad_k[l] =
                    grad_k[l] + snq_grad_k_term<(bool)SNQ_DECAY_INPUT>(p, g, x, v_before);
            }
            grad_v[l] = g.v;
        }
    }
    for (int l = 0; l < n; ++l) {
        snq_store(grad_v_init, i0 + l, grad_v[l]);
    }
    if (grad_step_partial != 0) {
        for (int l = 0; l < n; ++l) {
            grad_step_partial[i0 + l] = grad_step[l];
        }
    }
    if (grad_k_partial != 0) {
        for (int l = 0; l < n; ++l) {
            grad_k_partial[i0 + l] = grad_k[l];
        }
    }
}

static inline params make_params(const void* step_ptr, const void* k_ptr, double tau,
                                 double v_threshold, double v_reset, double qmin, double qmax,
                                 double alpha) {
    return snq_make_params<SNQ_NEURON, (bool)SNQ_DECAY_INPUT, (bool)SNQ_HARD_RESET>(
        ((const real*)step_ptr)[0],
        (SNQ_NEURON == SNQ_NEURON_PLIF) ? ((const real*)k_ptr)[0] : (real)0, (real)tau,
        (real)v_threshold, (real)v_reset, (real)qmin, (real)qmax, (real)alpha);
}

}  // namespace snq_cpu

// Forward over all N neurons (the arguments: host_shim.h).
SNQ_CPU_FORWARD_ENTRY {
    using namespace snq_cpu;
    if (!is_this_library(dtype, neuron, decay_input, hard_reset, detach_reset, surrogate,
                         store_v_seq)) {
        return -1;
    }
    const params p = make_params(step_ptr, k_ptr, tau, v_threshold, v_reset, qmin, qmax, 0.0);
    const long long blocks = (N + SNQ_BLOCK - 1) / SNQ_BLOCK;
    const int threads = threads_for((long long)T * N, blocks, num_threads);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long long b = 0; b < blocks; ++b) {
        const long long i0 = b * SNQ_BLOCK;
        const int n = (int)((N - i0) < SNQ_BLOCK ? (N - i0) : SNQ_BLOCK);
#define SNQ_FORWARD_BLOCK(SAVE_H)                                                                 \
        forward_block<SAVE_H>(p, (const scalar_t*)x_seq, (const scalar_t*)v_init,               \
                              (scalar_t*)spike_seq, (scalar_t*)v_last, (scalar_t*)v_seq,        \
                              (real*)h_seq, T, N, i0, n)
        if (h_seq != 0) {
            SNQ_FORWARD_BLOCK(true);
        } else {
            SNQ_FORWARD_BLOCK(false);
        }
#undef SNQ_FORWARD_BLOCK
    }
    return 0;
}

// Backward over all N neurons (the arguments: host_shim.h).
SNQ_CPU_BACKWARD_ENTRY {
    using namespace snq_cpu;
    if (!is_this_library(dtype, neuron, decay_input, hard_reset, detach_reset, surrogate,
                         store_v_seq)) {
        return -1;
    }
    const params p = make_params(step_ptr, k_ptr, tau, v_threshold, v_reset, qmin, qmax, alpha);
    const long long blocks = (N + SNQ_BLOCK - 1) / SNQ_BLOCK;
    const int threads = threads_for((long long)T * N, blocks, num_threads);
    // x_seq and v_init are read for PLIF's dH/dk only, and then they are always given
    real* const k_partial =
        (SNQ_NEURON == SNQ_NEURON_PLIF && grad_k_partial != 0) ? (real*)grad_k_partial : (real*)0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long long b = 0; b < blocks; ++b) {
        const long long i0 = b * SNQ_BLOCK;
        const int n = (int)((N - i0) < SNQ_BLOCK ? (N - i0) : SNQ_BLOCK);
#define SNQ_BACKWARD_BLOCK(HAS_SPIKE, HAS_V_SEQ)                                                  \
        backward_block<HAS_SPIKE, HAS_V_SEQ>(                                                     \
            p, (const real*)h_seq, (const scalar_t*)x_seq, (const scalar_t*)v_init,             \
            (const scalar_t*)grad_spike_seq, (const scalar_t*)grad_v_seq,                       \
            (const scalar_t*)grad_v_last, (scalar_t*)grad_x_seq, (scalar_t*)grad_v_init,        \
            (real*)grad_step_partial, k_partial, T, N, i0, n)
#if SNQ_STORE_V_SEQ
        if (grad_v_seq != 0) {
            if (grad_spike_seq != 0) {
                SNQ_BACKWARD_BLOCK(true, true);
            } else {
                SNQ_BACKWARD_BLOCK(false, true);
            }
            continue;
        }
#endif
        if (grad_spike_seq != 0) {
            SNQ_BACKWARD_BLOCK(true, false);
        } else {
            SNQ_BACKWARD_BLOCK(false, false);
        }
#undef SNQ_BACKWARD_BLOCK
    }
    return 0;
}

#endif  // SNQ_CPU_ENTRY_H
