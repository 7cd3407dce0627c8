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

// =============================================================================================
// Chip neurons (snnquant.targets): the neuron steps of Xylo, Loihi (Lava fixed point) and Speck,
// as snnquant.functional.chip_neurons computes them; float64 throughout, every forward value an
// integer below 2^53, so the arithmetic is exact and equal to the torch step's. The synaptic
// input of each step (a matrix product or a convolution) is computed before the kernel; the
// kernel runs the per-neuron recurrence over all T steps (one thread per neuron, as above).
//
// Layout: x, out, save0, save1 are [T, M] with M = N * out_features neurons (an element i is
// neuron j = i % out_features of sample n = i / out_features); s0/s1 are the two states ([M]).
//   Xylo : states (I, V); x the plain synaptic sum c W^T, up/down its positive and negative
//          parts (c W+^T, c W-^T), counts [T, N, in] and weight [out, in] for the event-ordered
//          saturating accumulation of the steps that may saturate; bias [out] or null;
//          saves I and V (after the reset); out = spike counts.
//   Loihi: states (u, v); x the Dense output a (already shifted); bias [out] mantissas or null;
//          saves the voltage before its clip; out = spikes.
//   Speck: state v (s1 unused); x the core's input current (bias included);
//          saves the voltage before firing; out = spike counts (before the sum pooling).
// The chip's integers come in P (see snq_chip_make_params):
//   Xylo : threshold, dash_syn, dash_mem, max_spikes, state_bits, alpha
//   Loihi: vth, du, dv, state_bits, bias_exp, alpha
//   Speck: threshold, multi (1) or single (0) spike, v_min, alpha
// =============================================================================================
#define SNQ_CHIP_XYLO 0
#define SNQ_CHIP_LOIHI 1
#define SNQ_CHIP_SPECK 2

struct snq_chip_params {
    double threshold;   // spikes at v >= threshold (Xylo, Speck single), v > threshold (Loihi)
    double fire_scale;  // the surrogate's threshold: dn/dv = sg'((v - f) / f) / f
    double lo, hi;      // saturation (Xylo), clip (Loihi), lower bound lo (Speck)
    double syn, mem;    // Xylo: 2^dash_syn, 2^dash_mem; Loihi: 4095 - du, 4096 - dv
    double syn_grad;    // Xylo: 1 - 2^-dash_syn; Loihi: (4095 - du) / 4096
    double mem_grad;    // Xylo: 2^-dash_mem (d leak / dV); Loihi: (4096 - dv) / 4096
    double max_spikes;  // Xylo: the count's bound; Speck: 1 multi-spike, 0 single spike
    double half;        // Loihi: 2^(state_bits - 1) (the current's wrap)
    double bias_scale;  // Loihi: 2^bias_exp; else 1
    double alpha;       // the surrogate's alpha
};

template <int CHIP>
__device__ __forceinline__ snq_chip_params snq_chip_make_params(const double* P) {
    snq_chip_params p;
    p.bias_scale = 1.0;
    p.half = 0.0;
    p.max_spikes = 0.0;
    p.syn = p.mem = p.syn_grad = p.mem_grad = 0.0;
    p.hi = 0.0;
    if (CHIP == SNQ_CHIP_XYLO) {
        const double half = ldexp(1.0, (int)P[4] - 1);
        p.threshold = P[0];
        p.fire_scale = P[0];
        p.lo = -half;
        p.hi = half - 1.0;
        p.syn = ldexp(1.0, (int)P[1]);
        p.mem = ldexp(1.0, (int)P[2]);
        p.syn_grad = 1.0 - ldexp(1.0, -(int)P[1]);
        p.mem_grad = ldexp(1.0, -(int)P[2]);
        p.max_spikes = P[3];
        p.alpha = P[5];
    } else if (CHIP == SNQ_CHIP_LOIHI) {
        const double half = ldexp(1.0, (int)P[3] - 1);
        p.threshold = 64.0 * P[0];
        p.fire_scale = p.threshold > 1.0 ? p.threshold : 1.0;
        p.lo = -half + 1.0;
        p.hi = half - 1.0;
        p.syn = 4095.0 - P[1];
        p.mem = 4096.0 - P[2];
        p.syn_grad = p.syn / 4096.0;
        p.mem_grad = p.mem / 4096.0;
        p.half = half;
        p.bias_scale = ldexp(1.0, (int)P[4]);
        p.alpha = P[5];
    } else {
        p.threshold = P[0];
        p.fire_scale = P[0];
        p.max_spikes = P[1];
        p.lo = P[2];
        p.alpha = P[3];
    }
    return p;
}

// Xylo's bit-shift decay: x - max(floor(x / 2^dash), 1) for x > 0, x - floor(x / 2^dash) else
// (functional.bitshift.bitshift_decay; `scale` = 2^dash)
__device__ __forceinline__ double snq_bitshift_decay(double x, double scale) {
    double shifted = floor(x / scale);
    if (x > 0.0 && shifted == 0.0) {
        shifted = 1.0;
    }
    return x - shifted;
}

// Loihi's decay rounded toward zero: sign(x m) floor(|x m| / 4096) (bitshift.truncated_decay)
__device__ __forceinline__ double snq_truncated_decay(double x, double m) {
    const double prod = x * m;
    const double magnitude = floor(fabs(prod) / 4096.0);
    return prod > 0.0 ? magnitude : (prod < 0.0 ? -magnitude : 0.0);
}

// Lava's one wrap of the current (bitshift.wrap_signed)
__device__ __forceinline__ double snq_wrap(double x, double half) {
    return x > half ? x - 2.0 * half : (x <= -half ? x + 2.0 * half : x);
}

// the spike count of a voltage (no gradient)
template <int CHIP>
__device__ __forceinline__ double snq_chip_count(const snq_chip_params& p, double v) {
    if (CHIP == SNQ_CHIP_XYLO) {
        if (v < p.threshold) {
            return 0.0;
        }
        const double n = floor(v / p.threshold);
        return n > p.max_spikes ? p.max_spikes : n;
    } else if (CHIP == SNQ_CHIP_LOIHI) {
        return v > p.threshold ? 1.0 : 0.0;
    }
    if (p.max_spikes != 0.0) {
        return v > 0.0 ? floor(v / p.threshold) : 0.0;
    }
    return v >= p.threshold ? 1.0 : 0.0;
}

// Xylo's membrane update from V[t-1] and I[t], before firing: the three saturations
struct snq_xylo_membrane {
    double v;         // the voltage before firing
    bool m1, m2, m3;  // inside each saturation (the gradient passes)
};

__device__ __forceinline__ snq_xylo_membrane snq_xylo_charge(const snq_chip_params& p,
                                                             double v_before, double isyn,
                                                             const double* bias, int j) {
    snq_xylo_membrane r;
    const double leak = v_before - snq_bitshift_decay(v_before, p.mem);
    const double r1 = isyn - leak;
    r.m1 = r1 >= p.lo && r1 <= p.hi;
    double d = snq_clamp(r1, p.lo, p.hi);
    r.m2 = true;
    if (bias != 0) {
        const double r2 = d + bias[j];
        r.m2 = r2 >= p.lo && r2 <= p.hi;
        d = snq_clamp(r2, p.lo, p.hi);
    }
    const double r3 = v_before + d;
    r.m3 = r3 >= p.lo && r3 <= p.hi;
    r.v = snq_clamp(r3, p.lo, p.hi);
    return r;
}

// One forward step of chip neuron i at time t (element e = t * M + i): updates the states s0, s1
// and writes what the backward needs; returns the spike count.
template <int CHIP>
__device__ __forceinline__ double snq_chip_forward_step(
    const snq_chip_params& p, double& s0, double& s1, const double* x, const double* up,
    const double* down, const double* counts, const double* weight, const double* bias,
    double* save0, double* save1, int t, long long i, long long e, long long N_samples,
    int out_features, int in_features) {
    const int j = (int)(i % out_features);
    if (CHIP == SNQ_CHIP_XYLO) {
        double acc;
        if (s0 + up[e] <= p.hi && s0 + down[e] >= p.lo) {
            acc = s0 + x[e];  // no partial sum can saturate: the plain sum
        } else {
            // one event source at a time, in ascending order, saturating after each
            const long long n = i / out_features;
            const double* c = counts + ((long long)t * N_samples + n) * in_features;
            const double* w = weight + (long long)j * in_features;
            acc = s0;
            for (int k = 0; k < in_features; ++k) {
                if (c[k] != 0.0) {
                    acc = snq_clamp(acc + c[k] * w[k], p.lo, p.hi);
                }
            }
        }
        s0 = snq_bitshift_decay(acc, p.syn);
        const snq_xylo_membrane m = snq_xylo_charge(p, s1, s0, bias, j);
        const double n_spikes = snq_chip_count<CHIP>(p, m.v);
        s1 = m.v - n_spikes * p.threshold;
        save0[e] = s0;
        save1[e] = s1;
        return n_spikes;
    } else if (CHIP == SNQ_CHIP_LOIHI) {
        s0 = snq_wrap(snq_truncated_decay(s0, p.syn) + 64.0 * x[e], p.half);
        double pre = snq_truncated_decay(s1, p.mem) + s0;
        if (bias != 0) {
            pre = pre + bias[j] * p.bias_scale;
        }
        const double v = snq_clamp(pre, p.lo, p.hi);
        const double s = snq_chip_count<CHIP>(p, v);
        s1 = v * (1.0 - s);
        save0[e] = pre;
        return s;
    }
    const double v = s0 + x[e];
    const double n_spikes = snq_chip_count<CHIP>(p, v);
    const double after = v - n_spikes * p.threshold;
    s0 = after < p.lo ? p.lo : after;
    save0[e] = v;
    return n_spikes;
}

// dn/dv of the surrogate spike count
template <int SURROGATE>
__device__ __forceinline__ double snq_chip_surrogate(const snq_chip_params& p, double v) {
    return snq_surrogate_grad<SURROGATE>((v - p.fire_scale) / p.fire_scale, p.alpha) /
           p.fire_scale;
}

// One backward step of chip neuron i at time t: from dL/d(out[t]) (grad_out) and the carried
// gradients g0, g1 of the states after step t, the gradient of x[t] (returned), of the states
// before step t (g0, g1 updated) and this step's term of the bias gradient (grad_bias).
template <int CHIP, int SURROGATE>
__device__ __forceinline__ double snq_chip_backward_step(
    const snq_chip_params& p, double& g0, double& g1, double& grad_bias, double grad_out,
    const double* save0, const double* save1, const double* s1_init, const double* bias,
    int t, long long i, long long e, long long M, int out_features) {
    if (CHIP == SNQ_CHIP_XYLO) {
        const double v_before = t > 0 ? save1[e - M] : (s1_init != 0 ? s1_init[i] : 0.0);
        const snq_xylo_membrane m =
            snq_xylo_charge(p, v_before, save0[e], bias, (int)(i % out_features));
        const double g_count = grad_out - g1 * p.threshold;
        const double g_v = g1 + g_count * snq_chip_surrogate<SURROGATE>(p, m.v);
        const double g_r3 = m.m3 ? g_v : 0.0;
        const double g_r2 = m.m2 ? g_r3 : 0.0;
        const double g_r1 = m.m1 ? g_r2 : 0.0;
        grad_bias = g_r2;
        const double g_acc = (g0 + g_r1) * p.syn_grad;
        g1 = g_r3 - g_r1 * p.mem_grad;
        g0 = g_acc;
        return g_acc;
    } else if (CHIP == SNQ_CHIP_LOIHI) {
        const double pre = save0[e];
        const double v = snq_clamp(pre, p.lo, p.hi);
        const double s = snq_chip_count<CHIP>(p, v);
        const double g_s = grad_out - g1 * v;
        const double g_v = g1 * (1.0 - s) + g_s * snq_chip_surrogate<SURROGATE>(p, v);
        const double g_pre = (pre >= p.lo && pre <= p.hi) ? g_v : 0.0;
        grad_bias = g_pre * p.bias_scale;
        const double g_u = g0 + g_pre;
        g1 = g_pre * p.mem_grad;
        g0 = g_u * p.syn_grad;
        return 64.0 * g_u;
    }
    const double v = save0[e];
    const double n_spikes = snq_chip_count<CHIP>(p, v);
    const double g_after = (v - n_spikes * p.threshold >= p.lo) ? g0 : 0.0;
    const double g_count = grad_out - g_after * p.threshold;
    const double g_v = g_after + g_count * snq_chip_surrogate<SURROGATE>(p, v);
    grad_bias = 0.0;
    g0 = g_v;
    return g_v;
}

// Forward of neuron i: all T steps.
template <int CHIP>
__device__ __forceinline__ void snq_chip_forward_neuron(
    const double* P, const double* x, const double* up, const double* down,
    const double* counts, const double* weight, const double* bias, const double* s0_init,
    const double* s1_init, double* out, double* save0, double* save1, double* s0_last,
    double* s1_last, int T, long long M, int out_features, int in_features, long long i) {
    const snq_chip_params p = snq_chip_make_params<CHIP>(P);
    double s0 = s0_init != 0 ? s0_init[i] : 0.0;
    double s1 = s1_init != 0 ? s1_init[i] : 0.0;
    const long long n_samples = M / out_features;
    long long e = i;
    for (int t = 0; t < T; ++t, e += M) {
        out[e] = snq_chip_forward_step<CHIP>(p, s0, s1, x, up, down, counts, weight, bias, save0,
                                             save1, t, i, e, n_samples, out_features,
                                             in_features);
    }
    s0_last[i] = s0;
    if (s1_last != 0) {
        s1_last[i] = s1;
    }
}

// Backward of neuron i: reverse time. grad_out and the gradients of the last states may be null
// (zero); grad_bias_partial [M] (the sum over time of the bias terms) may be null.
template <int CHIP, int SURROGATE>
__device__ __forceinline__ void snq_chip_backward_neuron(
    const double* P, const double* save0, const double* save1, const double* s1_init,
    const double* bias, const double* grad_out, const double* grad_s0_last,
    const double* grad_s1_last, double* grad_x, double* grad_bias_partial, double* grad_s0_init,
    double* grad_s1_init, int T, long long M, int out_features, long long i) {
    const snq_chip_params p = snq_chip_make_params<CHIP>(P);
    double g0 = grad_s0_last != 0 ? grad_s0_last[i] : 0.0;
    double g1 = grad_s1_last != 0 ? grad_s1_last[i] : 0.0;
    double g_bias = 0.0;
    long long e = (long long)(T - 1) * M + i;
    for (int t = T - 1; t >= 0; --t, e -= M) {
        double term;
        grad_x[e] = snq_chip_backward_step<CHIP, SURROGATE>(
            p, g0, g1, term, grad_out != 0 ? grad_out[e] : 0.0, save0, save1, s1_init, bias, t,
            i, e, M, out_features);
        g_bias = g_bias + term;
    }
    grad_s0_init[i] = g0;
    if (grad_s1_init != 0) {
        grad_s1_init[i] = g1;
    }
    if (grad_bias_partial != 0) {
        grad_bias_partial[i] = g_bias;
    }
}

template <int CHIP>
__global__ void snq_chip_forward(const double* __restrict__ P, const double* __restrict__ x,
                                 const double* __restrict__ up, const double* __restrict__ down,
                                 const double* __restrict__ counts,
                                 const double* __restrict__ weight,
                                 const double* __restrict__ bias,
                                 const double* __restrict__ s0_init,
                                 const double* __restrict__ s1_init, double* __restrict__ out,
                                 double* __restrict__ save0, double* __restrict__ save1,
                                 double* __restrict__ s0_last, double* __restrict__ s1_last,
                                 const int T, const long long M, const int out_features,
                                 const int in_features) {
    const long long i = (long long)blockIdx.x * (long long)blockDim.x + (long long)threadIdx.x;
    if (i >= M) {
        return;
    }
    snq_chip_forward_neuron<CHIP>(P, x, up, down, counts, weight, bias, s0_init, s1_init, out,
                                  save0, save1, s0_last, s1_last, T, M, out_features,
                                  in_features, i);
}

template <int CHIP, int SURROGATE>
__global__ void snq_chip_backward(const double* __restrict__ P,
                                  const double* __restrict__ save0,
                                  const double* __restrict__ save1,
                                  const double* __restrict__ s1_init,
                                  const double* __restrict__ bias,
                                  const double* __restrict__ grad_out,
                                  const double* __restrict__ grad_s0_last,
                                  const double* __restrict__ grad_s1_last,
                                  double* __restrict__ grad_x,
                                  double* __restrict__ grad_bias_partial,
                                  double* __restrict__ grad_s0_init,
                                  double* __restrict__ grad_s1_init, const int T,
                                  const long long M, const int out_features) {
    const long long i = (long long)blockIdx.x * (long long)blockDim.x + (long long)threadIdx.x;
    if (i >= M) {
        return;
    }
    snq_chip_backward_neuron<CHIP, SURROGATE>(P, save0, save1, s1_init, bias, grad_out,
                                              grad_s0_last, grad_s1_last, grad_x,
                                              grad_bias_partial, grad_s0_init, grad_s1_init, T,
                                              M, out_features, i);
}
