// CPU entry points of the cpp backend: the arithmetic of neuron.cu, in loops laid out for a CPU.
//
// Included after host_shim.h and neuron.cu, and compiled once per configuration: the macros
//   SNQ_SCALAR (float | double | snq_half | snq_bfloat16), SNQ_NEURON (0 if, 1 lif, 2 plif),
//   SNQ_DECAY_INPUT, SNQ_HARD_RESET, SNQ_DETACH_RESET, SNQ_STORE_V_SEQ (0 | 1),
//   SNQ_SURROGATE (0 sigmoid, 1 atan)
// pick the one instantiation this library holds (see cpp_backend.py).
//
// The GPU runs one thread per neuron, each walking over all T steps. On the CPU the same per-step
// functions (snq_charge, snq_quantize_fire, snq_reset, snq_surrogate_grad) run in a different loop
// nest: OpenMP threads share blocks of SNQ_BLOCK neighbouring neurons; inside a block, time is the
// outer loop and the neurons of the block the inner one, so the inner loop reads and writes
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

static inline int threads_for(long long elements, long long blocks, int num_threads) {
    if (num_threads < 1 || elements < SNQ_PARALLEL_MIN_ELEMENTS) {
        return 1;
    }
    return (long long)num_threads < blocks ? num_threads : (int)blocks;
}

// One block of n <= SNQ_BLOCK neurons starting at i0, all T steps. SAVE_H: write the charge.
template <bool SAVE_H>
static inline void forward_block(const scalar_t* __restrict__ x_seq,
                                 const scalar_t* __restrict__ v_init, scalar_t* __restrict__ spike_seq,
                                 scalar_t* __restrict__ v_last, scalar_t* __restrict__ v_seq,
                                 real* __restrict__ h_seq, real step, real k, real tau,
                                 real v_threshold, real v_rest, real v_reset_q, real theta_q,
                                 real qmin, real qmax, int T, long long N, long long i0, int n) {
    real v[SNQ_BLOCK];
    for (int l = 0; l < n; ++l) {
        v[l] = snq_load(v_init, i0 + l);
    }
    for (int t = 0; t < T; ++t) {
        const long long base = (long long)t * N + i0;
        const scalar_t* __restrict__ x = x_seq + base;
        scalar_t* __restrict__ spike = spike_seq + base;
        for (int l = 0; l < n; ++l) {
            const real h = snq_charge<SNQ_NEURON, (bool)SNQ_DECAY_INPUT>(
                v[l], snq_load(x, l), v_rest, tau, k);
            const snq_quantized<real> q = snq_quantize_fire(h, step, qmin, qmax, v_threshold);
            v[l] = snq_reset<(bool)SNQ_HARD_RESET>(q.value, q.spike, v_reset_q, theta_q);
            snq_store(spike, l, q.spike);
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

}  // namespace snq_cpu

// Forward over all N neurons: the arguments of snq_forward (neuron.cu), plus the thread count.
extern "C" void snq_cpu_forward(const void* x_seq, const void* v_init, const void* step_ptr,
                                const void* k_ptr, void* spike_seq, void* v_last, void* v_seq,
                                void* h_seq, double tau_d, double v_threshold_d, double v_reset_d,
                                double qmin_d, double qmax_d, int T, long long N,
                                int num_threads) {
    using namespace snq_cpu;
    const real step = ((const real*)step_ptr)[0];
    const real k = (SNQ_NEURON == SNQ_NEURON_PLIF) ? ((const real*)k_ptr)[0] : (real)0;
    const real tau = (real)tau_d, v_threshold = (real)v_threshold_d, v_reset = (real)v_reset_d;
    const real qmin = (real)qmin_d, qmax = (real)qmax_d;
    const real v_reset_q = SNQ_HARD_RESET ? snq_reset_level(v_reset, step, qmin, qmax) : (real)0;
    const real theta_q = SNQ_HARD_RESET ? (real)0 : snq_theta_level(v_threshold, step);
    const long long blocks = (N + SNQ_BLOCK - 1) / SNQ_BLOCK;
    const int threads = threads_for((long long)T * N, blocks, num_threads);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long long b = 0; b < blocks; ++b) {
        const long long i0 = b * SNQ_BLOCK;
        const int n = (int)((N - i0) < SNQ_BLOCK ? (N - i0) : SNQ_BLOCK);
        if (h_seq != 0) {
            forward_block<true>((const scalar_t*)x_seq, (const scalar_t*)v_init,
                                (scalar_t*)spike_seq, (scalar_t*)v_last, (scalar_t*)v_seq,
                                (real*)h_seq, step, k, tau, v_threshold, v_reset_q, v_reset_q,
                                theta_q, qmin, qmax, T, N, i0, n);
        } else {
            forward_block<false>((const scalar_t*)x_seq, (const scalar_t*)v_init,
                                 (scalar_t*)spike_seq, (scalar_t*)v_last, (scalar_t*)v_seq,
                                 (real*)h_seq, step, k, tau, v_threshold, v_reset_q, v_reset_q,
                                 theta_q, qmin, qmax, T, N, i0, n);
        }
    }
}

namespace snq_cpu {

// One block of n neurons, reverse time: the gradient of snq_forward, as snq_backward computes it.
// The step and k partial sums are always accumulated (a multiply-add per element) and written
// only when asked for; the branches that remain are template arguments, so the inner loop has none.
template <bool HAS_GRAD_SPIKE, bool HAS_GRAD_V_SEQ>
static inline void backward_block(
    const real* __restrict__ h_seq, const scalar_t* __restrict__ x_seq,
    const scalar_t* __restrict__ v_init, const scalar_t* __restrict__ grad_spike_seq,
    const scalar_t* __restrict__ grad_v_seq, const scalar_t* __restrict__ grad_v_last,
    scalar_t* __restrict__ grad_x_seq, scalar_t* __restrict__ grad_v_init,
    real* __restrict__ grad_step_partial, real* __restrict__ grad_k_partial, real step,
    real v_threshold, real v_rest, real v_reset_q, real theta_q, real qmin, real qmax, real alpha,
    real dh_dx, real dh_dv, int T, long long N, long long i0, int n) {
    const bool plif_k = SNQ_NEURON == SNQ_NEURON_PLIF && grad_k_partial != 0;
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
            real grad_spike = HAS_GRAD_SPIKE ? snq_load(grad_spike_seq + base, l) : (real)0;
            const real gv = HAS_GRAD_V_SEQ ? grad_v[l] + snq_load(grad_v_seq + base, l)
                                           : grad_v[l];
            const snq_quantized<real> q = snq_quantize_fire(h_t[l], step, qmin, qmax, v_threshold);
            const bool inside = (q.ratio >= qmin) && (q.ratio <= qmax);
            if (!SNQ_DETACH_RESET) {
                grad_spike = grad_spike + gv * (SNQ_HARD_RESET ? (v_reset_q - q.value) : -theta_q);
            }
            const real grad_hq = gv * (SNQ_HARD_RESET ? ((real)1 - q.spike) : (real)1) +
                                 grad_spike * snq_surrogate_grad<SNQ_SURROGATE>(q.distance, alpha);
            const real grad_h = inside ? grad_hq : (real)0;
            // the clamped level at and beyond the end points (Esser et al. 2020, eq. 3), as neuron.cu
            const bool strictly_inside = (q.ratio > qmin) && (q.ratio < qmax);
            grad_step[l] = grad_step[l] + grad_hq * (strictly_inside ? (q.level - q.ratio) : q.level);
            snq_store(grad_x_seq + base, l, grad_h * dh_dx);
            if (SNQ_NEURON == SNQ_NEURON_PLIF) {
                real v_before;
                if (t > 0) {
                    const snq_quantized<real> qb =
                        snq_quantize_fire(h_t[l - N], step, qmin, qmax, v_threshold);
                    v_before = snq_reset<(bool)SNQ_HARD_RESET>(qb.value, qb.spike, v_reset_q,
                                                               theta_q);
                } else {
                    v_before = snq_load(v_init, i0 + l);
                }
                const real dh_dk = SNQ_DECAY_INPUT
                                       ? (snq_load(x_seq + base, l) - v_before + v_rest)
                                       : -(v_before - v_rest);
                grad_k[l] = grad_k[l] + grad_h * dh_dk;
            }
            grad_v[l] = grad_h * dh_dv;
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
    if (plif_k) {
        for (int l = 0; l < n; ++l) {
            grad_k_partial[i0 + l] = grad_k[l];
        }
    }
}

}  // namespace snq_cpu

// Backward over all N neurons: the arguments of snq_backward (neuron.cu), plus the thread count.
extern "C" void snq_cpu_backward(const void* h_seq, const void* x_seq, const void* v_init,
                                 const void* step_ptr, const void* k_ptr,
                                 const void* grad_spike_seq, const void* grad_v_seq,
                                 const void* grad_v_last, void* grad_x_seq, void* grad_v_init,
                                 void* grad_step_partial, void* grad_k_partial, double tau_d,
                                 double v_threshold_d, double v_reset_d, double qmin_d,
                                 double qmax_d, double alpha_d, int T, long long N,
                                 int num_threads) {
    using namespace snq_cpu;
    const real step = ((const real*)step_ptr)[0];
    const real k = (SNQ_NEURON == SNQ_NEURON_PLIF) ? ((const real*)k_ptr)[0] : (real)0;
    const real tau = (real)tau_d, v_threshold = (real)v_threshold_d, v_reset = (real)v_reset_d;
    const real qmin = (real)qmin_d, qmax = (real)qmax_d, alpha = (real)alpha_d;
    const real v_reset_q = SNQ_HARD_RESET ? snq_reset_level(v_reset, step, qmin, qmax) : (real)0;
    const real theta_q = SNQ_HARD_RESET ? (real)0 : snq_theta_level(v_threshold, step);
    real dh_dx = (real)1;
    real dh_dv = (real)1;
    if (SNQ_NEURON == SNQ_NEURON_LIF) {
        const real inv_tau = (real)1 / tau;
        dh_dx = SNQ_DECAY_INPUT ? inv_tau : (real)1;
        dh_dv = (real)1 - inv_tau;
    } else if (SNQ_NEURON == SNQ_NEURON_PLIF) {
        dh_dx = SNQ_DECAY_INPUT ? k : (real)1;
        dh_dv = (real)1 - k;
    }
    const long long blocks = (N + SNQ_BLOCK - 1) / SNQ_BLOCK;
    const int threads = threads_for((long long)T * N, blocks, num_threads);
    // x_seq and v_init are read for PLIF's dH/dk only, and then they are always given
    const bool plif_k = SNQ_NEURON == SNQ_NEURON_PLIF && grad_k_partial != 0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long long b = 0; b < blocks; ++b) {
        const long long i0 = b * SNQ_BLOCK;
        const int n = (int)((N - i0) < SNQ_BLOCK ? (N - i0) : SNQ_BLOCK);
#define SNQ_BACKWARD_BLOCK(HAS_SPIKE, HAS_V_SEQ)                                                  \
        backward_block<HAS_SPIKE, HAS_V_SEQ>(                                                     \
            (const real*)h_seq, (const scalar_t*)x_seq, (const scalar_t*)v_init,                \
            (const scalar_t*)grad_spike_seq, (const scalar_t*)grad_v_seq,                       \
            (const scalar_t*)grad_v_last, (scalar_t*)grad_x_seq, (scalar_t*)grad_v_init,        \
            (real*)grad_step_partial, plif_k ? (real*)grad_k_partial : (real*)0, step,         \
            v_threshold, v_reset_q, v_reset_q, theta_q, qmin, qmax, alpha, dh_dx, dh_dv, T, N,  \
            i0, n)
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
    (void)tau;
}

#endif  // SNQ_CPU_ENTRY_H
