// Entry points of the test ("host") mode of the CPU build (included after host_shim.h and
// neuron.cu instead of cpu_entry.h; see cpp_backend.py).
//
// snq_cpu_forward / snq_cpu_backward take the arguments of cpu_entry.h's (host_shim.h: one
// ctypes argument list for both modes), pick the template instantiation from the configuration
// codes (the same configuration the CuPy launcher turns into a name expression) and run the GPU
// kernel itself once per neuron, as the GPU would run one thread per neuron (the thread count is
// unused). They return 0 on success and -1 (running nothing) for a code out of range.
#ifndef SNQ_HOST_ENTRY_H
#define SNQ_HOST_ENTRY_H

#include <type_traits>

namespace snq_host {

template <typename F>
static bool with_bool(int b, F f) {
    if (b) {
        f(std::integral_constant<bool, true>());
    } else {
        f(std::integral_constant<bool, false>());
    }
    return true;
}

template <typename F>
static bool with_int3(int n, F f) {
    switch (n) {
        case 0: f(std::integral_constant<int, 0>()); return true;
        case 1: f(std::integral_constant<int, 1>()); return true;
        case 2: f(std::integral_constant<int, 2>()); return true;
        default: return false;
    }
}

template <typename F>
static bool with_int2(int n, F f) {
    switch (n) {
        case 0: f(std::integral_constant<int, 0>()); return true;
        case 1: f(std::integral_constant<int, 1>()); return true;
        default: return false;
    }
}

template <typename F>
static bool with_dtype(int d, F f) {
    switch (d) {
        case 0: f(float()); return true;
        case 1: f(double()); return true;
        case 2: f(snq_half()); return true;
        case 3: f(snq_bfloat16()); return true;
        default: return false;
    }
}

static inline bool valid_codes(int dtype, int neuron, int surrogate) {
    return dtype >= 0 && dtype <= 3 && neuron >= 0 && neuron <= 2 && surrogate >= 0 &&
           surrogate <= 1;
}

static inline void set_thread(long long i) {
    blockIdx.x = (unsigned int)i;
    blockDim.x = 1u;
    threadIdx.x = 0u;
}

}  // namespace snq_host

SNQ_CPU_FORWARD_ENTRY {
    (void)detach_reset;
    (void)num_threads;
    if (!snq_host::valid_codes(dtype, neuron, surrogate)) {
        return -1;
    }
    snq_host::with_dtype(dtype, [&](auto dtype_tag) {
        typedef decltype(dtype_tag) scalar_t;
        typedef typename snq_compute<scalar_t>::type real;
        snq_host::with_int3(neuron, [&](auto neuron_tag) {
            snq_host::with_bool(decay_input, [&](auto decay_tag) {
                snq_host::with_bool(hard_reset, [&](auto hard_tag) {
                    snq_host::with_bool(store_v_seq, [&](auto store_tag) {
                        for (long long i = 0; i < N; ++i) {
                            snq_host::set_thread(i);
                            snq_forward<scalar_t, decltype(neuron_tag)::value,
                                        decltype(decay_tag)::value, decltype(hard_tag)::value,
                                        decltype(store_tag)::value>(
                                (const scalar_t*)x_seq, (const scalar_t*)v_init,
                                (const real*)step_ptr, (const real*)k_ptr, (scalar_t*)spike_seq,
                                (scalar_t*)v_last, (scalar_t*)v_seq, (real*)h_seq, (real)tau,
                                (real)v_threshold, (real)v_reset, (real)qmin, (real)qmax, T, N);
                        }
                    });
                });
            });
        });
    });
    return 0;
}

SNQ_CPU_BACKWARD_ENTRY {
    (void)store_v_seq;
    (void)num_threads;
    if (!snq_host::valid_codes(dtype, neuron, surrogate)) {
        return -1;
    }
    snq_host::with_dtype(dtype, [&](auto dtype_tag) {
        typedef decltype(dtype_tag) scalar_t;
        typedef typename snq_compute<scalar_t>::type real;
        snq_host::with_int3(neuron, [&](auto neuron_tag) {
            snq_host::with_bool(decay_input, [&](auto decay_tag) {
                snq_host::with_bool(hard_reset, [&](auto hard_tag) {
                    snq_host::with_bool(detach_reset, [&](auto detach_tag) {
                        snq_host::with_int2(surrogate, [&](auto surrogate_tag) {
                            for (long long i = 0; i < N; ++i) {
                                snq_host::set_thread(i);
                                snq_backward<scalar_t, decltype(neuron_tag)::value,
                                             decltype(decay_tag)::value,
                                             decltype(hard_tag)::value,
                                             decltype(detach_tag)::value,
                                             decltype(surrogate_tag)::value>(
                                    (const real*)h_seq, (const scalar_t*)x_seq,
                                    (const scalar_t*)v_init, (const real*)step_ptr,
                                    (const real*)k_ptr,
                                    (const scalar_t*)grad_spike_seq,
                                    (const scalar_t*)grad_v_seq,
                                    (const scalar_t*)grad_v_last, (scalar_t*)grad_x_seq,
                                    (scalar_t*)grad_v_init, (real*)grad_step_partial,
                                    (real*)grad_k_partial, (real)tau, (real)v_threshold,
                                    (real)v_reset, (real)qmin, (real)qmax, (real)alpha, T, N);
                            }
                        });
                    });
                });
            });
        });
    });
    return 0;
}

// Conversion helpers, exposed so that the tests can check the hand-written 16-bit conversions
// against PyTorch's over every bit pattern.
extern "C" void snq_host_float_to_half(const float* in, unsigned short* out, long long n) {
    for (long long i = 0; i < n; ++i) out[i] = snq_float_to_half(in[i]);
}
extern "C" void snq_host_half_to_float(const unsigned short* in, float* out, long long n) {
    for (long long i = 0; i < n; ++i) out[i] = snq_half_to_float(in[i]);
}
extern "C" void snq_host_float_to_bfloat16(const float* in, unsigned short* out, long long n) {
    for (long long i = 0; i < n; ++i) out[i] = snq_float_to_bfloat16(in[i]);
}
extern "C" void snq_host_bfloat16_to_float(const unsigned short* in, float* out, long long n) {
    for (long long i = 0; i < n; ++i) out[i] = snq_bfloat16_to_float(in[i]);
}

#endif  // SNQ_HOST_ENTRY_H
