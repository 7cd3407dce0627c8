// snnquant fused multi-step neurons with a quantized membrane.
//
// One CUDA C source, used twice:
//   * on the GPU: compiled at run time by CuPy (NVRTC) with name expressions picking one template
//     instantiation per configuration (see cupy_backend.py);
//   * on the CPU: compiled by g++ behind host_shim.h (which turns __global__/__device__ into plain
//     functions and the CUDA rounding intrinsics into plain operators) so that CI checks this very
//     arithmetic against the torch reference without a GPU (see host.py).
// It therefore includes no header and uses only NVRTC built-ins.
//
// Layout: every sequence is [T, N] contiguous (time major, N neurons per step); one thread owns one
// neuron and walks over all T steps, so each step reads and writes N consecutive elements
// (coalesced). Per-step state stays in registers.
//
// Dynamics and gradients: docs/api/kernels.rst and the spec of quant_neuron_multi_step; in short
//   H = charge(V, X);  Hq = clamp(rint(H / s), qmin, qmax) * s;  S = (Hq - v_th >= 0);
//   V = Hq * (1 - S) + Vr_q * S  (hard)   |   V = Hq - theta_q * S  (soft).
//
// Precision: float32, float16 and bfloat16 storage compute in float32; float64 computes in float64.
// The forward arithmetic (and its recomputation in the backward) is written with the explicitly
// rounded intrinsics __fadd_rn/__fsub_rn/__fmul_rn/__fdiv_rn (and the __d*_rn ones for float64):
// the compiler may not contract them into fused multiply-adds, and the division is IEEE-rounded,
// so the result is bit-identical to the same expression evaluated op by op by PyTorch on the CPU
// (the host build compiles with -ffp-contract=off). The backward sums after that point are plain
// operators (FMA allowed): gradients are compared with tolerances, spikes and membranes exactly.

#define SNQ_NEURON_IF 0
#define SNQ_NEURON_LIF 1
#define SNQ_NEURON_PLIF 2

#define SNQ_SURROGATE_SIGMOID 0
#define SNQ_SURROGATE_ATAN 1

// Unrolling the time loops lets the GPU compiler issue the (independent, __restrict__) loads of
// several steps before their arithmetic: more memory requests in flight per thread.
#ifdef SNQ_HOST_BUILD
#define SNQ_UNROLL
#else
#define SNQ_UNROLL _Pragma("unroll 4")
#endif

// 16-bit storage types: raw bits, converted by hand so that no cuda_fp16.h / cuda_bf16.h header
// is needed (NVRTC as shipped in the pip wheels may not find them).
struct snq_half {
    unsigned short bits;
};
struct snq_bfloat16 {
    unsigned short bits;
};

template <typename scalar_t>
struct snq_compute {
    typedef float type;
};
template <>
struct snq_compute<double> {
    typedef double type;
};

// ---------------------------------------------------------------------------------------------
// Correctly rounded arithmetic (no contraction).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ float snq_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float snq_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float snq_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float snq_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double snq_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double snq_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double snq_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double snq_div(double a, double b) { return __ddiv_rn(a, b); }

// round half to even (= torch.round), in the default rounding mode
__device__ __forceinline__ float snq_rint(float a) { return rintf(a); }
__device__ __forceinline__ double snq_rint(double a) { return rint(a); }
__device__ __forceinline__ float snq_ceil(float a) { return ceilf(a); }
__device__ __forceinline__ double snq_ceil(double a) { return ceil(a); }
#ifdef SNQ_HOST_BUILD
// a vectorisable expf (host_shim.h); used only by the surrogate derivative in the backward
__device__ __forceinline__ float snq_exp(float a) { return snq_host_expf(a); }
#else
__device__ __forceinline__ float snq_exp(float a) { return expf(a); }
#endif
__device__ __forceinline__ double snq_exp(double a) { return exp(a); }
// as torch.clamp: NaN stays NaN; written with comparisons so that a CPU compiler can vectorise it
__device__ __forceinline__ float snq_clamp(float a, float lo, float hi) {
    const float low = a < lo ? lo : a;
    return low > hi ? hi : low;
}
__device__ __forceinline__ double snq_clamp(double a, double lo, double hi) {
    const double low = a < lo ? lo : a;
    return low > hi ? hi : low;
}

// ---------------------------------------------------------------------------------------------
// Storage <-> compute conversion.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned int snq_float_bits(float f) {
#ifdef SNQ_HOST_BUILD
    unsigned int u;
    __builtin_memcpy(&u, &f, sizeof(u));
    return u;
#else
    return __float_as_uint(f);
#endif
}

__device__ __forceinline__ float snq_bits_float(unsigned int u) {
#ifdef SNQ_HOST_BUILD
    float f;
    __builtin_memcpy(&f, &u, sizeof(f));
    return f;
#else
    return __uint_as_float(u);
#endif
}

__device__ __forceinline__ float snq_half_to_float(unsigned short h) {
#ifdef SNQ_HOST_BUILD
    const unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    const unsigned int exponent = ((unsigned int)h >> 10) & 0x1fu;
    const unsigned int mantissa = (unsigned int)h & 0x3ffu;
    if (exponent == 0u) {
        // zero or subnormal: mantissa * 2^-24 is exact in float
        const float magnitude = (float)mantissa * 5.9604644775390625e-08f;
        return sign ? -magnitude : magnitude;
    }
    if (exponent == 0x1fu) {
        return snq_bits_float(sign | 0x7f800000u | (mantissa << 13));
    }
    return snq_bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#endif
}

__device__ __forceinline__ unsigned short snq_float_to_half(float f) {
#ifdef SNQ_HOST_BUILD
    // round to nearest even, overflow to infinity, NaN stays NaN
    unsigned int x = snq_float_bits(f);
    const unsigned int sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) {
        return (unsigned short)(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
    }
    if (x >= 0x477ff000u) {  // >= 65520: rounds to infinity
        return (unsigned short)(sign | 0x7c00u);
    }
    if (x < 0x38800000u) {  // below the smallest normal half: multiples of 2^-24
        const float scaled = snq_bits_float(x) * 16777216.0f;  // exact
        return (unsigned short)(sign | (unsigned int)rintf(scaled));
    }
    const unsigned int odd = (x >> 13) & 1u;
    x += 0xc8000fffu + odd;  // rebias the exponent (-112 << 23) and round half to even
    return (unsigned short)(sign | (x >> 13));
#else
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#endif
}

__device__ __forceinline__ float snq_bfloat16_to_float(unsigned short b) {
    return snq_bits_float(((unsigned int)b) << 16);
}

__device__ __forceinline__ unsigned short snq_float_to_bfloat16(float f) {
    const unsigned int x = snq_float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)((x >> 16) | 0x40u);  // quiet NaN
    }
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);  // round half to even
}

__device__ __forceinline__ float snq_load(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ double snq_load(const double* p, long long i) { return p[i]; }
__device__ __forceinline__ float snq_load(const snq_half* p, long long i) {
    return snq_half_to_float(p[i].bits);
}
__device__ __forceinline__ float snq_load(const snq_bfloat16* p, long long i) {
    return snq_bfloat16_to_float(p[i].bits);
}

__device__ __forceinline__ void snq_store(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void snq_store(double* p, long long i, double v) { p[i] = v; }
__device__ __forceinline__ void snq_store(snq_half* p, long long i, float v) {
    p[i].bits = snq_float_to_half(v);
}
__device__ __forceinline__ void snq_store(snq_bfloat16* p, long long i, float v) {
    p[i].bits = snq_float_to_bfloat16(v);
}

// ---------------------------------------------------------------------------------------------
// The neuron, shared by forward and backward so that both see bit-identical values.
// ---------------------------------------------------------------------------------------------

// Charge, in the operation order of the reference:
//   if                 : V + X
//   lif,  decay_input  : V + (X - (V - Vr)) / tau       lif,  !decay_input : V - (V - Vr) / tau + X
//   plif, decay_input  : V + (X - (V - Vr)) * k         plif, !decay_input : V - (V - Vr) * k + X
template <int NEURON, bool DECAY_INPUT, typename real>
__device__ __forceinline__ real snq_charge(real v, real x, real v_rest, real tau, real k) {
    if (NEURON == SNQ_NEURON_IF) {
        return snq_add(v, x);
    } else if (NEURON == SNQ_NEURON_LIF) {
        if (DECAY_INPUT) {
            return snq_add(v, snq_div(snq_sub(x, snq_sub(v, v_rest)), tau));
        }
        return snq_add(snq_sub(v, snq_div(snq_sub(v, v_rest), tau)), x);
    } else {
        if (DECAY_INPUT) {
            return snq_add(v, snq_mul(snq_sub(x, snq_sub(v, v_rest)), k));
        }
        return snq_add(snq_sub(v, snq_mul(snq_sub(v, v_rest), k)), x);
    }
}

// Quantized state after one charge: grid index q = clamp(rint(H / s)), value Hq = q * s,
// spike S = (Hq - v_th >= 0) and the membrane after reset.
template <typename real>
struct snq_quantized {
    real ratio;      // H / s
    real level;      // clamp(rint(H / s), qmin, qmax)
    real value;      // level * s
    real distance;   // value - v_threshold (the surrogate's argument)
    real spike;      // 0 or 1
};

template <typename real>
__device__ __forceinline__ snq_quantized<real> snq_quantize_fire(real h, real step, real qmin,
                                                                 real qmax, real v_threshold) {
    snq_quantized<real> r;
    r.ratio = snq_div(h, step);
    r.level = snq_clamp(snq_rint(r.ratio), qmin, qmax);
    r.value = snq_mul(r.level, step);
    r.distance = snq_sub(r.value, v_threshold);
    r.spike = r.distance >= (real)0 ? (real)1 : (real)0;
    return r;
}

template <bool HARD_RESET, typename real>
__device__ __forceinline__ real snq_reset(real hq, real spike, real v_reset_q, real theta_q) {
    if (HARD_RESET) {
        return snq_add(snq_mul(hq, snq_sub((real)1, spike)), snq_mul(v_reset_q, spike));
    }
    return snq_sub(hq, snq_mul(theta_q, spike));
}

// Quantized reset value Vr_q = clamp(rint(v_reset / s), qmin, qmax) * s and soft-reset amount
// theta_q = ceil(v_threshold / s) * s (the smallest grid value >= v_threshold).
// In the reference, v_reset and v_threshold are Python floats and ``float / tensor`` is evaluated by
// PyTorch as ``reciprocal(tensor) * float`` (Tensor.__rtruediv__); the kernels do the same, which
// matters for steps that are not powers of two (e.g. s = 0.024: 0.6 / s rounds up to 25.000002).
template <typename real>
__device__ __forceinline__ real snq_ratio_to_step(real value, real step) {
    return snq_mul(snq_div((real)1, step), value);
}

template <typename real>
__device__ __forceinline__ real snq_reset_level(real v_reset, real step, real qmin, real qmax) {
    return snq_mul(snq_clamp(snq_rint(snq_ratio_to_step(v_reset, step)), qmin, qmax), step);
}

template <typename real>
__device__ __forceinline__ real snq_theta_level(real v_threshold, real step) {
    return snq_mul(snq_ceil(snq_ratio_to_step(v_threshold, step)), step);
}

// Surrogate derivative sg'(x), as SpikingJelly 2.0 computes it:
//   Sigmoid(alpha): alpha * sigmoid(alpha x) * (1 - sigmoid(alpha x))
//   ATan(alpha):    (alpha / 2) / (1 + (pi / 2 * alpha * x)^2)
template <int SURROGATE, typename real>
__device__ __forceinline__ real snq_surrogate_grad(real x, real alpha) {
    if (SURROGATE == SNQ_SURROGATE_SIGMOID) {
        const real sg = (real)1 / ((real)1 + snq_exp(-(alpha * x)));
        return ((real)1 - sg) * sg * alpha;
    } else {
        const real half_alpha = alpha * (real)0.5;
        const real ax = (real)3.14159265358979323846 * half_alpha * x;
        return half_alpha / ((real)1 + ax * ax);
    }
}

// ---------------------------------------------------------------------------------------------
// The constants of one launch and the per-element steps, shared by the GPU kernels below and the
// CPU loops of cpu_entry.h: the neuron's arithmetic is written here once.
// ---------------------------------------------------------------------------------------------
template <typename real>
struct snq_params {
    real step;         // s
    real k;            // sigmoid(w) (PLIF), else 0
    real v_threshold;  // V_th
    real qmin, qmax;   // grid index range
    real v_reset_q;    // Vr_q (hard reset), else 0
    real theta_q;      // theta_q (soft reset), else 0
    real v_rest;       // the charge decays towards Vr_q (hard reset) or 0 (soft reset)
    real tau;          // LIF time constant
    real alpha;        // the surrogate's alpha (backward only)
    real dh_dx;        // dH/dX
    real dh_dv;        // dH/dV[t-1]
};

template <int NEURON, bool DECAY_INPUT, bool HARD_RESET, typename real>
__device__ __forceinline__ snq_params<real> snq_make_params(real step, real k, real tau,
                                                            real v_threshold, real v_reset,
                                                            real qmin, real qmax, real alpha) {
    snq_params<real> p;
    p.step = step;
    p.k = (NEURON == SNQ_NEURON_PLIF) ? k : (real)0;
    p.v_threshold = v_threshold;
    p.qmin = qmin;
    p.qmax = qmax;
    p.v_reset_q = HARD_RESET ? snq_reset_level(v_reset, step, qmin, qmax) : (real)0;
    p.theta_q = HARD_RESET ? (real)0 : snq_theta_level(v_threshold, step);
    p.v_rest = p.v_reset_q;
    p.tau = tau;
    p.alpha = alpha;
    p.dh_dx = (real)1;
    p.dh_dv = (real)1;
    if (NEURON == SNQ_NEURON_LIF) {
        const real inv_tau = (real)1 / tau;
        p.dh_dx = DECAY_INPUT ? inv_tau : (real)1;
        p.dh_dv = (real)1 - inv_tau;
    } else if (NEURON == SNQ_NEURON_PLIF) {
        p.dh_dx = DECAY_INPUT ? p.k : (real)1;
        p.dh_dv = (real)1 - p.k;
    }
    return p;
}

// One forward step of one neuron: charge H from V[t-1] (v, updated to V[t]) and X[t]; returns the
// spike and writes H (kept for the backward).
template <int NEURON, bool DECAY_INPUT, bool HARD_RESET, typename real>
__device__ __forceinline__ real snq_forward_step(const snq_params<real>& p, real x, real& v,
                                                 real& h) {
    h = snq_charge<NEURON, DECAY_INPUT>(v, x, p.v_rest, p.tau, p.k);
    const snq_quantized<real> q = snq_quantize_fire(h, p.step, p.qmin, p.qmax, p.v_threshold);
    v = snq_reset<HARD_RESET>(q.value, q.spike, p.v_reset_q, p.theta_q);
    return q.spike;
}

// The membrane after the step whose charge was h (the backward's V[t-1], recomputed from H).
template <bool HARD_RESET, typename real>
__device__ __forceinline__ real snq_membrane_after(const snq_params<real>& p, real h) {
    const snq_quantized<real> q = snq_quantize_fire(h, p.step, p.qmin, p.qmax, p.v_threshold);
    return snq_reset<HARD_RESET>(q.value, q.spike, p.v_reset_q, p.theta_q);
}

// The gradients of one backward step of one neuron.
template <typename real>
struct snq_step_grads {
    real x;     // dL/dX[t]
    real v;     // dL/dV[t-1]
    real h;     // dL/dH[t] (PLIF's k gradient is h * dH/dk)
    real step;  // this step's term of dL/ds (before step_grad_scale)
};

// One backward step of one neuron: from its charge h, dL/dS[t] (grad_spike) and dL/dV[t]
// (grad_v, the stored membrane's gradient included).
template <int NEURON, bool HARD_RESET, bool DETACH_RESET, int SURROGATE, typename real>
__device__ __forceinline__ snq_step_grads<real> snq_backward_step(const snq_params<real>& p,
                                                                 real h, real grad_spike,
                                                                 real grad_v) {
    const snq_quantized<real> q = snq_quantize_fire(h, p.step, p.qmin, p.qmax, p.v_threshold);
    const bool inside = (q.ratio >= p.qmin) && (q.ratio <= p.qmax);
    if (!DETACH_RESET) {
        // dV/dS = Vr_q - Hq (hard) | -theta_q (soft)
        grad_spike = grad_spike + grad_v * (HARD_RESET ? (p.v_reset_q - q.value) : -p.theta_q);
    }
    // dV/dHq at fixed S = 1 - S (hard) | 1 (soft)
    const real grad_hq = grad_v * (HARD_RESET ? ((real)1 - q.spike) : (real)1) +
                         grad_spike * snq_surrogate_grad<SURROGATE>(q.distance, p.alpha);
    snq_step_grads<real> g;
    g.h = inside ? grad_hq : (real)0;
    // dHq/ds = rint(H/s) - H/s strictly inside the range, else the clamped level (qmin or qmax),
    // the end points included (Esser et al. 2020, eq. 3)
    const bool strictly_inside = (q.ratio > p.qmin) && (q.ratio < p.qmax);
    g.step = grad_hq * (strictly_inside ? (q.level - q.ratio) : q.level);
    g.x = g.h * p.dh_dx;
    g.v = g.h * p.dh_dv;
    return g;
}

// PLIF: one step's term of dL/dk, dL/dH * dH/dk with
// dH/dk = X - V[t-1] + Vr (decay_input) | -(V[t-1] - Vr)
template <bool DECAY_INPUT, typename real>
__device__ __forceinline__ real snq_grad_k_term(const snq_params<real>& p,
                                                const snq_step_grads<real>& g, real x,
                                                real v_before) {
    return g.h * (DECAY_INPUT ? (x - v_before + p.v_rest) : -(v_before - p.v_rest));
}

// ---------------------------------------------------------------------------------------------
// Forward: all T steps of one neuron per thread.
//   x_seq, spike_seq, v_seq: [T, N] storage type; v_init, v_last: [N] storage type;
//   step, k: one compute-type value in device memory (k = sigmoid(w), PLIF only);
//   h_seq: [T, N] compute type, the charge before quantization, written only when not null
//   (training: the backward recomputes everything else from it).
// ---------------------------------------------------------------------------------------------
template <typename scalar_t, int NEURON, bool DECAY_INPUT, bool HARD_RESET, bool STORE_V_SEQ>
__global__ void snq_forward(const scalar_t* __restrict__ x_seq,
                            const scalar_t* __restrict__ v_init,
                            const typename snq_compute<scalar_t>::type* __restrict__ step_ptr,
                            const typename snq_compute<scalar_t>::type* __restrict__ k_ptr,
                            scalar_t* __restrict__ spike_seq, scalar_t* __restrict__ v_last,
                            scalar_t* __restrict__ v_seq,
                            typename snq_compute<scalar_t>::type* __restrict__ h_seq,
                            const typename snq_compute<scalar_t>::type tau,
                            const typename snq_compute<scalar_t>::type v_threshold,
                            const typename snq_compute<scalar_t>::type v_reset,
                            const typename snq_compute<scalar_t>::type qmin,
                            const typename snq_compute<scalar_t>::type qmax, const int T,
                            const long long N) {
    typedef typename snq_compute<scalar_t>::type real;
    const long long i = (long long)blockIdx.x * (long long)blockDim.x + (long long)threadIdx.x;
    if (i >= N) {
        return;
    }
    const snq_params<real> p = snq_make_params<NEURON, DECAY_INPUT, HARD_RESET>(
        step_ptr[0], (NEURON == SNQ_NEURON_PLIF) ? k_ptr[0] : (real)0, tau, v_threshold, v_reset,
        qmin, qmax, (real)0);

    real v = snq_load(v_init, i);
    long long j = i;
    // the input of the next step is loaded one step ahead, so that its latency overlaps this step
    real x_next = (T > 0) ? snq_load(x_seq, j) : (real)0;
    SNQ_UNROLL
    for (int t = 0; t < T; ++t, j += N) {
        const real x = x_next;
        if (t + 1 < T) {
            x_next = snq_load(x_seq, j + N);
        }
        real h;
        snq_store(spike_seq, j, snq_forward_step<NEURON, DECAY_INPUT, HARD_RESET>(p, x, v, h));
        if (h_seq != 0) {
            h_seq[j] = h;
        }
        if (STORE_V_SEQ) {
            snq_store(v_seq, j, v);
        }
    }
    snq_store(v_last, i, v);
}

// ---------------------------------------------------------------------------------------------
// Backward: reverse time, one neuron per thread.
//   h_seq: [T, N] compute type (from the forward);
//   x_seq: [T, N] storage type, read only for PLIF with decay_input (dH/dk needs X);
//   v_init: [N], read only for PLIF (dH/dk needs V[-1]);
//   grad_spike_seq, grad_v_seq: [T, N] or null (zero); grad_v_last: [N] or null (zero);
//   grad_x_seq: [T, N] and grad_v_init: [N], written;
//   grad_step_partial, grad_k_partial: [N] compute type or null; per-neuron sums over time of
//   dL/dHq * dHq/ds and dL/dH * dH/dk, reduced on the stream afterwards (no atomics: the
//   result is deterministic).
// ---------------------------------------------------------------------------------------------
template <typename scalar_t, int NEURON, bool DECAY_INPUT, bool HARD_RESET, bool DETACH_RESET,
          int SURROGATE>
__global__ void snq_backward(const typename snq_compute<scalar_t>::type* __restrict__ h_seq,
                             const scalar_t* __restrict__ x_seq,
                             const scalar_t* __restrict__ v_init,
                             const typename snq_compute<scalar_t>::type* __restrict__ step_ptr,
                             const typename snq_compute<scalar_t>::type* __restrict__ k_ptr,
                             const scalar_t* __restrict__ grad_spike_seq,
                             const scalar_t* __restrict__ grad_v_seq,
                             const scalar_t* __restrict__ grad_v_last,
                             scalar_t* __restrict__ grad_x_seq,
                             scalar_t* __restrict__ grad_v_init,
                             typename snq_compute<scalar_t>::type* __restrict__ grad_step_partial,
                             typename snq_compute<scalar_t>::type* __restrict__ grad_k_partial,
                             const typename snq_compute<scalar_t>::type tau,
                             const typename snq_compute<scalar_t>::type v_threshold,
                             const typename snq_compute<scalar_t>::type v_reset,
                             const typename snq_compute<scalar_t>::type qmin,
                             const typename snq_compute<scalar_t>::type qmax,
                             const typename snq_compute<scalar_t>::type alpha, const int T,
                             const long long N) {
    typedef typename snq_compute<scalar_t>::type real;
    const long long i = (long long)blockIdx.x * (long long)blockDim.x + (long long)threadIdx.x;
    if (i >= N) {
        return;
    }
    const snq_params<real> p = snq_make_params<NEURON, DECAY_INPUT, HARD_RESET>(
        step_ptr[0], (NEURON == SNQ_NEURON_PLIF) ? k_ptr[0] : (real)0, tau, v_threshold, v_reset,
        qmin, qmax, alpha);

    real grad_v = (grad_v_last != 0) ? snq_load(grad_v_last, i) : (real)0;
    real grad_step = (real)0;
    real grad_k = (real)0;
    long long j = (long long)(T - 1) * N + i;
    // the per-step inputs of step t - 1 are loaded during step t (latency overlaps arithmetic)
    real h = (T > 0) ? h_seq[j] : (real)0;
    real grad_spike_next = (T > 0 && grad_spike_seq != 0) ? snq_load(grad_spike_seq, j) : (real)0;
    real grad_v_seq_next = (T > 0 && grad_v_seq != 0) ? snq_load(grad_v_seq, j) : (real)0;
    SNQ_UNROLL
    for (int t = T - 1; t >= 0; --t, j -= N) {
        const real grad_spike = grad_spike_next;
        grad_v = grad_v + grad_v_seq_next;
        // the charge one step earlier, needed next iteration (and now for PLIF's V[t-1])
        real h_before = (real)0;
        if (t > 0) {
            h_before = h_seq[j - N];
            if (grad_spike_seq != 0) {
                grad_spike_next = snq_load(grad_spike_seq, j - N);
            }
            if (grad_v_seq != 0) {
                grad_v_seq_next = snq_load(grad_v_seq, j - N);
            }
        }
        const snq_step_grads<real> g =
            snq_backward_step<NEURON, HARD_RESET, DETACH_RESET, SURROGATE>(p, h, grad_spike,
                                                                           grad_v);
        if (grad_step_partial != 0) {
            grad_step = grad_step + g.step;
        }
        snq_store(grad_x_seq, j, g.x);
        if (NEURON == SNQ_NEURON_PLIF && grad_k_partial != 0) {
            const real v_before = (t > 0) ? snq_membrane_after<HARD_RESET>(p, h_before)
                                          : snq_load(v_init, i);
            const real x = DECAY_INPUT ? snq_load(x_seq, j) : (real)0;
            grad_k = grad_k + snq_grad_k_term<DECAY_INPUT>(p, g, x, v_before);
        }
        grad_v = g.v;
        h = h_before;
    }
    snq_store(grad_v_init, i, grad_v);
    if (grad_step_partial != 0) {
        grad_step_partial[i] = grad_step;
    }
    if (NEURON == SNQ_NEURON_PLIF && grad_k_partial != 0) {
        grad_k_partial[i] = grad_k;
    }
}
