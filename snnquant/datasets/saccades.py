r"""Turn still images into DVS event streams the way N-MNIST was recorded: saccades in front of an
event camera (Orchard et al., 2015, "Converting static image datasets to spiking neuromorphic
datasets using saccades", Front. Neurosci. 9:437).

The emulation, vectorised over all images and pixels with numpy (one loop over time steps):

1. *Optics.* Each image (values in [0, 1]) is shown as squares of side ``f`` sensor pixels
   (``f = image_size / max(h, w)``), blurred by a Gaussian point-spread function of width
   ``blur_sigma`` and sampled at the pixel centres of a ``width x height`` sensor, at the image's
   position at time :math:`t`.
2. *Saccades.* The image moves along a triangle of side ``saccade_amplitude`` pixels, one side per
   saccade, each side taking ``saccade_duration_us`` with a smooth (raised-cosine) velocity profile.
3. *DVS pixels.* Each pixel compares its log intensity with the level memorised at its last event
   and fires an ON or OFF event each time the difference crosses its contrast threshold; after an
   event it stays in reset for a refractory period. Background-activity noise may be added.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["saccade_events", "saccade_offsets"]

# Triangle of the three saccades, in units of the saccade amplitude: (x, y) of the image's offset.
_TRIANGLE = np.array([[0.5, 0.0], [1.0, 1.0], [0.0, 1.0], [0.5, 0.0]])

_MAX_CHUNK_PIXELS = 2**22  # images per vectorised chunk: ~4M pixels, ~16 MB per float32 state array


def saccade_offsets(t_us: np.ndarray, saccade_amplitude: float = 6.0, saccade_duration_us: int = 100_000) -> np.ndarray:
    r"""Offset (x, y) in sensor pixels of the image at times ``t_us`` during the three saccades.

    With vertices :math:`V_0 = A(\tfrac12, 0)`, :math:`V_1 = A(1, 1)`, :math:`V_2 = A(0, 1)`,
    :math:`V_3 = V_0` (amplitude :math:`A`, x to the right, y downwards) and saccade duration
    :math:`D`, saccade :math:`k = \lfloor t / D \rfloor \in \{0, 1, 2\}` moves the image from
    :math:`V_k` to :math:`V_{k+1}`:

    .. math::

        o(t) = V_k + s\!\left(\tfrac{t - kD}{D}\right) (V_{k+1} - V_k), \qquad
        s(\tau) = \frac{1 - \cos(\pi \tau)}{2}

    so the image rests at the corners (velocity zero) and moves fastest half-way through each
    saccade: events come in three bursts, one per saccade, as in N-MNIST.

    Args:
        t_us: times in microseconds, in ``[0, 3 * saccade_duration_us]``.
        saccade_amplitude: side of the triangle's bounding box in pixels.
        saccade_duration_us: duration of one saccade in microseconds.

    Returns:
        array of shape ``t_us.shape + (2,)``: the (x, y) offsets in pixels.
    """
    t = np.asarray(t_us, dtype=np.float64) / saccade_duration_us
    k = np.clip(np.floor(t).astype(np.int64), 0, 2)
    tau = np.clip(t - k, 0.0, 1.0)
    s = (1.0 - np.cos(np.pi * tau)) / 2.0
    start = _TRIANGLE[k]
    end = _TRIANGLE[k + 1]
    return saccade_amplitude * (start + s[..., None] * (end - start))


def saccade_events(
    images: np.ndarray,
    *,
    sensor_size: Tuple[int, int] = (34, 34),
    image_size: Optional[float] = None,
    saccade_amplitude: float = 6.0,
    saccade_duration_us: int = 100_000,
    time_step_us: int = 1000,
    contrast_threshold: float = 0.25,
    threshold_mismatch: float = 0.1,
    refractory_us: int = 1000,
    background: float = 0.1,
    blur_sigma: float = 0.5,
    noise_rate_hz: float = 0.2,
    seed: int = 0,
    image_ids: Optional[Sequence[int]] = None,
) -> List[dict]:
    r"""Emulate an event camera making three saccades in front of each image (N-MNIST style).

    *Optics.* Image pixel :math:`(r, c)` covers the square
    :math:`[x_0(t) + c f, x_0(t) + (c+1) f) \times [y_0(t) + r f, y_0(t) + (r+1) f)` on the sensor,
    where :math:`f` is the scale and :math:`(x_0, y_0)` the image's corner, centred on the sensor
    and moved by the saccade offset :math:`o(t)` of :func:`saccade_offsets`. A Gaussian blur of
    width :math:`\sigma_b` gives the intensity at the centre :math:`(X, Y)` of sensor pixel
    :math:`(x, y)`, :math:`X = x + \tfrac12`, :math:`Y = y + \tfrac12`:

    .. math::

        I(x, y, t) = \sum_{r, c} \mathrm{img}[r, c]\; w\big(Y - y_0(t) - r f\big)\;
                     w\big(X - x_0(t) - c f\big), \qquad
        w(u) = \Phi\!\left(\frac{u}{\sigma_b}\right) - \Phi\!\left(\frac{u - f}{\sigma_b}\right)

    with :math:`\Phi` the standard normal CDF; black (0) is shown at the relative luminance
    :math:`b` (``background``, a monitor's black level) and the log intensity is

    .. math::

        L(x, y, t) = \ln\big(b + (1 - b)\, I(x, y, t)\big).

    *DVS pixel.* Each pixel memorises a reference level :math:`L_\mathrm{ref}` and emits

    .. math::

        \text{ON } (p = 1) \text{ when } L - L_\mathrm{ref} \ge \theta_\mathrm{on}(x, y), \qquad
        \text{OFF } (p = 0) \text{ when } L - L_\mathrm{ref} \le -\theta_\mathrm{off}(x, y),

    at the time the linearly interpolated :math:`L` crosses the level (rounded down to the
    microsecond); then :math:`L_\mathrm{ref} \leftarrow L_\mathrm{ref} \pm \theta`. With a
    refractory period :math:`R > 0` the pixel stays in reset for :math:`R` after an event (no
    events; its reference follows the input) and memorises
    :math:`L_\mathrm{ref} = L(t_\mathrm{event} + R)`; the time loop then allows one event per pixel
    per time step. With :math:`R = 0` a pixel may emit several events in one step. The thresholds
    differ from pixel to pixel (fixed-pattern mismatch of one sensor, drawn once from ``seed``):

    .. math::

        \theta_\mathrm{on}(x, y) = \theta\, e^{\sigma_\theta \xi_\mathrm{on}(x, y)}, \quad
        \theta_\mathrm{off}(x, y) = \theta\, e^{\sigma_\theta \xi_\mathrm{off}(x, y)}, \quad
        \xi \sim \mathcal{N}(0, 1),

    and each recording starts with :math:`L_\mathrm{ref} = L(t{=}0) + u`,
    :math:`u \sim \mathcal{U}(-\theta/2, \theta/2)` per pixel (the pixels' state when the camera
    starts moving is arbitrary). Background-activity noise adds, per pixel, a Poisson process of
    rate ``noise_rate_hz`` with random polarity (it ignores the refractory period).

    Results are deterministic for a ``seed``: the sensor's mismatch comes from ``seed`` alone, and
    the random parts of image ``i`` (initial references, noise) from ``(seed, image_ids[i])``, so
    an image gets the same events whatever else is converted with it. They do not depend on the
    processor's code paths: the blur, the logarithm and the exponential are computed from
    correctly rounded additions, multiplications and divisions in a fixed order, not by a BLAS or
    numpy's vectorised ``log``/``exp``, whose last bits depend on the processor (with them, 0.6% of
    the events of 300 digits changed between two OpenBLAS kernels). What remains from elsewhere is
    the C library's ``erf`` (the blur's weights, rounded to float32) and numpy's random
    generators.

    Args:
        images: array ``[N, h, w]`` (or one image ``[h, w]``) of floats in [0, 1], 1 = white.
        sensor_size: ``(width, height)`` of the sensor in pixels, at most 256 each (N-MNIST: 34 x 34).
        image_size: size on the sensor, in pixels, of the image's longer side; default
            ``min(width, height) - saccade_amplitude`` (28 for N-MNIST's 28 x 28 MNIST digits).
        saccade_amplitude: side of the saccade triangle's bounding box in pixels (6 in N-MNIST:
            28 + 6 = 34).
        saccade_duration_us: duration of each of the three saccades (about 100 ms in N-MNIST).
        time_step_us: time step of the emulation; timestamps inside a step are interpolated.
        contrast_threshold: :math:`\theta`, in natural-log units of intensity.
        threshold_mismatch: :math:`\sigma_\theta`, the relative spread of the pixels' thresholds.
        refractory_us: :math:`R`, the refractory period in microseconds.
        background: :math:`b`, relative luminance of black, in (0, 1).
        blur_sigma: :math:`\sigma_b` in sensor pixels, > 0.
        noise_rate_hz: background-activity events per pixel per second (0 for none).
        seed: non-negative integer seed.
        image_ids: one non-negative integer per image, keying its random parts; default
            ``0 .. N-1``.

    Returns:
        list with one dict per image, keys ``'x'``, ``'y'``, ``'p'``, ``'t'`` (1-D ``numpy.int64``
        arrays, sorted by ``t``; ``x`` is the column, ``y`` the row, ``p = 1`` ON), ready for
        :func:`~snnquant.datasets.write_nmnist_bin`.
    """
    images = np.asarray(images)
    if images.ndim == 2:
        images = images[None]
    if images.ndim != 3 or images.shape[0] == 0 or min(images.shape[1:]) == 0:
        raise ValueError(f"images must have shape [N, h, w] with N, h, w >= 1, got shape {images.shape}")
    if not np.issubdtype(images.dtype, np.floating):
        raise TypeError(f"images must be a float array with values in [0, 1], got dtype {images.dtype}")
    if not np.all(np.isfinite(images)) or images.min() < 0.0 or images.max() > 1.0:
        raise ValueError(
            f"images must hold finite values in [0, 1], got values in [{images.min()}, {images.max()}]"
        )
    width, height = _check_size_pair("sensor_size", sensor_size)
    saccade_amplitude = _check_real("saccade_amplitude", saccade_amplitude, low=0.0)
    if image_size is None:
        image_size = min(width, height) - saccade_amplitude
    image_size = _check_real("image_size", image_size, low=0.0, low_open=True)
    saccade_duration_us = _check_int("saccade_duration_us", saccade_duration_us, low=1)
    time_step_us = _check_int("time_step_us", time_step_us, low=1)
    if saccade_duration_us % time_step_us:
        raise ValueError(
            f"saccade_duration_us ({saccade_duration_us}) must be a multiple of time_step_us ({time_step_us})"
        )
    if 3 * saccade_duration_us > 2**23 - 1:
        raise ValueError(
            f"saccade_duration_us = {saccade_duration_us}: three saccades must fit the 23-bit "
            "microsecond timestamps of the N-MNIST format (at most 2796202 us each)"
        )
    contrast_threshold = _check_real("contrast_threshold", contrast_threshold, low=0.0, low_open=True)
    threshold_mismatch = _check_real("threshold_mismatch", threshold_mismatch, low=0.0)
    refractory_us = _check_int("refractory_us", refractory_us, low=0)
    background = _check_real("background", background, low=0.0, low_open=True)
    if background >= 1.0:
        raise ValueError(f"background must be in (0, 1), got {background!r}")
    blur_sigma = _check_real("blur_sigma", blur_sigma, low=0.0, low_open=True)
    noise_rate_hz = _check_real("noise_rate_hz", noise_rate_hz, low=0.0)
    seed = _check_int("seed", seed, low=0)
    n_images = images.shape[0]
    if image_ids is None:
        image_ids = np.arange(n_images)
    else:
        image_ids = np.asarray(image_ids)
        if image_ids.shape != (n_images,) or not np.issubdtype(image_ids.dtype, np.integer):
            raise ValueError(
                f"image_ids must be {n_images} integers (one per image), got {image_ids.dtype} array of shape {image_ids.shape}"
            )
        if image_ids.size and image_ids.min() < 0:
            raise ValueError(f"image_ids must be non-negative, got {int(image_ids.min())}")

    sensor_rng = np.random.default_rng([seed, 0])
    theta_on = contrast_threshold * _portable_exp(threshold_mismatch * sensor_rng.standard_normal((height, 1, width)))
    theta_off = contrast_threshold * _portable_exp(threshold_mismatch * sensor_rng.standard_normal((height, 1, width)))

    n_steps = 3 * saccade_duration_us // time_step_us
    times = np.arange(n_steps + 1, dtype=np.int64) * time_step_us
    h, w = images.shape[1:]
    scale = image_size / max(h, w)
    offsets = saccade_offsets(times, saccade_amplitude, saccade_duration_us)
    # Corner of the image: centred on the sensor when the offset is in the middle of its range.
    x0 = (width - scale * w) / 2.0 - saccade_amplitude / 2.0 + offsets[:, 0]
    y0 = (height - scale * h) / 2.0 - saccade_amplitude / 2.0 + offsets[:, 1]
    weights_x = _pixel_weights(x0, w, width, scale, blur_sigma)  # [S+1, width, w]
    weights_y = _pixel_weights(y0, h, height, scale, blur_sigma)  # [S+1, height, h]

    params = _DvsParams(
        theta_on.astype(np.float32),
        theta_off.astype(np.float32),
        float(contrast_threshold),
        refractory_us,
        time_step_us,
        float(background),
    )
    chunk = max(1, _MAX_CHUNK_PIXELS // (width * height))
    results: List[dict] = []
    for start in range(0, n_images, chunk):
        stop = min(n_images, start + chunk)
        rngs = [np.random.default_rng([seed, 1, int(i)]) for i in image_ids[start:stop]]
        results.extend(
            _emulate_chunk(images[start:stop], weights_x, weights_y, times, params, rngs, noise_rate_hz)
        )
    return results


class _DvsParams:
    def __init__(self, theta_on, theta_off, theta, refractory_us, time_step_us, background):
        self.theta_on = theta_on
        self.theta_off = theta_off
        self.theta = theta
        self.refractory_us = refractory_us
        self.time_step_us = time_step_us
        self.background = background


def _pixel_weights(corner: np.ndarray, n_src: int, n_sensor: int, scale: float, sigma: float) -> np.ndarray:
    """w(centre - corner - k*scale) for every time, sensor pixel and image pixel: [T, n_sensor, n_src]."""
    centres = np.arange(n_sensor, dtype=np.float64) + 0.5
    u = centres[None, :, None] - corner[:, None, None] - scale * np.arange(n_src)[None, None, :]
    erf = np.frompyfunc(math.erf, 1, 1)
    inv = 1.0 / (sigma * math.sqrt(2.0))
    cdf_left = erf(u * inv).astype(np.float64)
    cdf_right = erf((u - scale) * inv).astype(np.float64)
    return 0.5 * (cdf_left - cdf_right)


def _log_intensity(images, wy, wx, background, out):
    """ln(b + (1-b) I) for all images at one time, written into ``out`` of layout [height, N, width].

    The blur ``wy @ image @ wx.T`` is summed here in a fixed order, one IEEE rounding per product
    and per sum, instead of by a BLAS: a BLAS picks its kernels and summation order by the CPU
    (OpenBLAS's Haswell and SkylakeX kernels differ in the last bits) and by the operands' shapes,
    and numpy's ``log`` by the CPU's vector extensions; either moves events that sit near a
    threshold, so the same seed gave other recordings on another machine. Additions,
    multiplications and divisions are correctly rounded on every CPU, so these bits are the same
    everywhere, and an image's bits never depend on its batch.
    """
    n, h, w = images.shape
    rows = np.zeros((n, h, wx.shape[0]), np.float32)  # image @ wx.T: [N, h, width]
    for j in range(w):
        rows += images[:, :, j, None] * wx[None, None, :, j]
    intensity = np.zeros((n, wy.shape[0], wx.shape[0]), np.float32)  # wy @ rows: [N, height, width]
    for i in range(h):
        intensity += wy[None, :, i, None] * rows[:, i, None, :]
    np.multiply(intensity, np.float32(1.0 - background), out=intensity)
    np.add(intensity, np.float32(background), out=intensity)
    out[...] = _portable_log(intensity).transpose(1, 0, 2)  # rounded to float32 on assignment
    return out


_LN2 = math.log(2.0)
_SERIES_TERMS = 8  # |s| <= 3 - 2 sqrt(2) < 0.172: 2 s**17 / 17 < 1e-13, far below float32's step


def _portable_log(x: np.ndarray) -> np.ndarray:
    r"""Natural logarithm of positive ``x`` in float64 from additions, multiplications and
    divisions only (the same bits on every CPU, unlike ``numpy.log``).

    .. math::

        \ln x = e \ln 2 + 2 \sum_{k=0}^{K} \frac{s^{2k+1}}{2k+1}, \quad
        s = \frac{m - 1}{m + 1}, \quad x = m\, 2^e, \quad m \in [1/\sqrt 2, \sqrt 2)
    """
    m, e = np.frexp(np.asarray(x, dtype=np.float64))  # m in [0.5, 1), exact
    low = m < math.sqrt(0.5)
    np.multiply(m, 2.0, out=m, where=low)  # exact
    e -= low
    s = m - 1.0
    m += 1.0
    s /= m
    s2 = np.multiply(s, s, out=m)
    acc = np.full_like(s, 1.0 / (2 * _SERIES_TERMS + 1))
    for k in range(_SERIES_TERMS - 1, -1, -1):
        acc *= s2
        acc += 1.0 / (2 * k + 1)
    acc *= s
    acc *= 2.0
    acc += e * _LN2
    return acc


def _portable_exp(x: np.ndarray) -> np.ndarray:
    r"""Exponential of float64 ``x`` from additions, multiplications and divisions only (the same
    bits on every CPU, unlike ``numpy.exp``).

    .. math::

        e^x = 2^k \sum_{n=0}^{N} \frac{r^n}{n!}, \quad k = \mathrm{rint}(x / \ln 2), \quad
        r = x - k \ln 2, \quad |r| \le \ln 2 / 2
    """
    x = np.asarray(x, dtype=np.float64)
    k = np.rint(x / _LN2)
    r = x - k * _LN2
    acc = np.ones_like(r)
    for n in range(18, 0, -1):  # 0.35**19 / 19! < 1e-25
        acc = 1.0 + acc * r / n
    return np.ldexp(acc, k.astype(np.int64))


def _emulate_chunk(images, weights_x, weights_y, times, params: _DvsParams, rngs, noise_rate_hz):
    n = images.shape[0]
    height, width = weights_y.shape[1], weights_x.shape[1]
    # The pixels' state has layout [height, N, width]; the images stay [N, h, w] for the blur.
    images_t = np.ascontiguousarray(images, dtype=np.float32)
    wx = weights_x.astype(np.float32)
    wy = weights_y.astype(np.float32)
    shape = (height, n, width)
    level_prev = _log_intensity(images_t, wy[0], wx[0], params.background, np.empty(shape, np.float32))
    level_cur = np.empty(shape, np.float32)
    theta = params.theta
    reference = level_prev + np.stack(
        [rng.uniform(-theta / 2.0, theta / 2.0, size=(height, width)) for rng in rngs], axis=1
    ).astype(np.float32)
    theta_on, theta_off = params.theta_on, params.theta_off
    neg_theta_off = -theta_off
    refractory = params.refractory_us
    dt = params.time_step_us
    # Pixels in their refractory period: flat indices and the time each is released.
    pending_idx = np.empty(0, np.int64)
    pending_until = np.empty(0, np.float64)
    out_idx, out_t, out_p = [], [], []
    ref_flat = reference.reshape(-1)
    for k in range(1, times.size):
        t_prev = float(times[k - 1])
        t_cur = float(times[k])
        _log_intensity(images_t, wy[k], wx[k], params.background, level_cur)
        prev_flat = level_prev.reshape(-1)
        cur_flat = level_cur.reshape(-1)
        release_at = None
        if pending_idx.size:
            keep = pending_until > t_prev
            pending_idx, pending_until = pending_idx[keep], pending_until[keep]
            held = pending_until >= t_cur
            # Held in reset for the whole step: the reference follows the input.
            ref_flat[pending_idx[held]] = cur_flat[pending_idx[held]]
            rel_idx = pending_idx[~held]
            rel_t = pending_until[~held]
            # Released during the step: memorise the input at the release time.
            a = (rel_t - t_prev) / dt
            ref_flat[rel_idx] = prev_flat[rel_idx] + (a * (cur_flat[rel_idx] - prev_flat[rel_idx])).astype(np.float32)
            release_at = (rel_idx, rel_t)
        diff = level_cur - reference
        fire = (diff >= theta_on) | (diff <= neg_theta_off)
        idx = np.flatnonzero(fire)
        if idx.size:
            i_row = idx // (n * width)
            i_col = idx % width
            d = diff.reshape(-1)[idx]
            on = d > 0
            th = np.where(on, theta_on.reshape(height, width)[i_row, i_col], theta_off.reshape(height, width)[i_row, i_col])
            count = np.floor(np.abs(d) / th).astype(np.int64)
            if refractory > 0:
                count = np.minimum(count, 1)
            count = np.maximum(count, 1)
            sign = np.where(on, 1.0, -1.0)
            ref0 = ref_flat[idx].astype(np.float64)
            lp = prev_flat[idx].astype(np.float64)
            lc = cur_flat[idx].astype(np.float64)
            t_start = np.full(idx.size, t_prev)
            if release_at is not None and release_at[0].size:
                pos = np.searchsorted(idx, release_at[0])
                pos_ok = pos < idx.size
                hit = np.zeros(release_at[0].size, bool)
                hit[pos_ok] = idx[pos[pos_ok]] == release_at[0][pos_ok]
                t_start[pos[hit]] = release_at[1][hit]
            rep = np.repeat(np.arange(idx.size), count)
            m = np.arange(rep.size) - np.repeat(np.cumsum(count) - count, count) + 1
            level = ref0[rep] + sign[rep] * th[rep] * m
            slope = lc[rep] - lp[rep]
            safe = np.where(slope != 0.0, slope, 1.0)
            frac = np.where(slope != 0.0, (level - lp[rep]) / safe, 1.0)
            t_event = np.maximum(t_prev + np.clip(frac, 0.0, 1.0) * dt, t_start[rep])
            out_idx.append(idx[rep])
            out_t.append(np.floor(t_event).astype(np.int64))
            out_p.append(on[rep].astype(np.int64))
            last = np.cumsum(count) - 1  # last event of each pixel in this step
            if refractory > 0:
                until = t_event[last] + refractory
                a = (np.minimum(until, t_cur) - t_prev) / dt
                ref_flat[idx] = (lp + a * (lc - lp)).astype(np.float32)
                held_new = until > t_cur
                pending_idx = np.concatenate([pending_idx, idx[held_new]])
                pending_until = np.concatenate([pending_until, until[held_new]])
                order = np.argsort(pending_idx, kind="stable")
                pending_idx, pending_until = pending_idx[order], pending_until[order]
            else:
                ref_flat[idx] = (ref0 + sign * th * count).astype(np.float32)
        level_prev, level_cur = level_cur, level_prev

    flat = np.concatenate(out_idx) if out_idx else np.empty(0, np.int64)
    t_all = np.concatenate(out_t) if out_t else np.empty(0, np.int64)
    p_all = np.concatenate(out_p) if out_p else np.empty(0, np.int64)
    y_all = flat // (n * width)
    sample = (flat // width) % n
    x_all = flat % width
    duration = int(times[-1])
    if noise_rate_hz > 0:
        noise = [_noise_events(rng, noise_rate_hz, duration, width, height) for rng in rngs]
        counts = np.array([e[0].size for e in noise], dtype=np.int64)
        sample = np.concatenate([sample, np.repeat(np.arange(n), counts)])
        x_all = np.concatenate([x_all] + [e[0] for e in noise])
        y_all = np.concatenate([y_all] + [e[1] for e in noise])
        p_all = np.concatenate([p_all] + [e[2] for e in noise])
        t_all = np.concatenate([t_all] + [e[3] for e in noise])
    order = np.argsort(sample * (duration + 1) + t_all, kind="stable")
    sample, x_all, y_all, p_all, t_all = (a[order] for a in (sample, x_all, y_all, p_all, t_all))
    bounds = np.searchsorted(sample, np.arange(n + 1))
    return [
        {
            "x": x_all[bounds[i] : bounds[i + 1]],
            "y": y_all[bounds[i] : bounds[i + 1]],
            "p": p_all[bounds[i] : bounds[i + 1]],
            "t": t_all[bounds[i] : bounds[i + 1]],
        }
        for i in range(n)
    ]


def _noise_events(rng, rate_hz, duration_us, width, height):
    count = int(rng.poisson(rate_hz * duration_us * 1e-6 * width * height))
    x = rng.integers(0, width, size=count)
    y = rng.integers(0, height, size=count)
    p = rng.integers(0, 2, size=count)
    t = rng.integers(0, duration_us, size=count)
    return x.astype(np.int64), y.astype(np.int64), p.astype(np.int64), t.astype(np.int64)


def _check_size_pair(name, value) -> Tuple[int, int]:
    try:
        first, second = value
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (width, height), got {value!r}") from None
    for part in (first, second):
        if isinstance(part, bool) or not isinstance(part, (int, np.integer)) or not 1 <= part <= 256:
            raise ValueError(f"{name} must be two integers in 1..256, got {value!r}")
    return int(first), int(second)


def _check_int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value!r}")
    return int(value)


def _check_real(name, value, low, low_open=False):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < low or (low_open and value == low):
        bound = f"> {low}" if low_open else f">= {low}"
        raise ValueError(f"{name} must be finite and {bound}, got {value!r}")
    return value
