"""Run a Loihi network (written by :func:`snnquant.targets.loihi.run_lava`) on Lava's fixed-point
CPU simulation, in the Python that has Lava installed (lava-nc needs Python <= 3.10).

This file imports only numpy and Lava, never snnquant: it is run as a script,
``python lava_runner.py IN.npz OUT.npz``. ``IN.npz`` holds ``raster`` (``[N, T, n_in]`` 0/1 spikes),
``n_layers`` and, per layer ``k``, ``w{k}`` (``[out, in]`` Lava weights), ``weight_exp{k}``,
``du{k}``, ``dv{k}``, ``vth{k}``, ``bias_mant{k}``, ``bias_exp{k}``. Each of the ``N`` samples runs
on a network built afresh (a reset state), for ``T`` steps plus one per layer (the steps the
spikes need to cross the layers: each ``Dense`` delivers one step later).
``OUT.npz`` holds ``s{k}``: ``[N, T + n_layers, out]`` spikes of layer ``k``.
"""

import sys

import numpy as np


def main(src: str, dst: str) -> None:
    from lava.magma.core.run_conditions import RunSteps
    from lava.magma.core.run_configs import Loihi2SimCfg
    from lava.proc.dense.process import Dense
    from lava.proc.io.sink import RingBuffer as Sink
    from lava.proc.io.source import RingBuffer as Source
    from lava.proc.lif.process import LIF

    data = np.load(src)
    raster = data["raster"]
    n_layers = int(data["n_layers"])
    n, t_in, _ = raster.shape
    steps = t_in + n_layers
    cfg = Loihi2SimCfg(select_tag="fixed_pt")
    spikes = [[] for _ in range(n_layers)]
    for i in range(n):  # one run per sample: Lava runs the processes connected to one process
        x = np.zeros((raster.shape[2], steps), dtype=np.int32)
        x[:, :t_in] = raster[i].T
        source = Source(data=x)
        port, sinks = source.s_out, []
        for k in range(n_layers):
            w = data[f"w{k}"]
            dense = Dense(weights=w, weight_exp=int(data[f"weight_exp{k}"]), num_weight_bits=8)
            lif = LIF(shape=(w.shape[0],), du=int(data[f"du{k}"]), dv=int(data[f"dv{k}"]),
                      vth=int(data[f"vth{k}"]), bias_mant=data[f"bias_mant{k}"],
                      bias_exp=data[f"bias_exp{k}"])
            port.connect(dense.s_in)
            dense.a_out.connect(lif.a_in)
            sink = Sink(shape=(w.shape[0],), buffer=steps)
            lif.s_out.connect(sink.a_in)
            sinks.append(sink)
            port = lif.s_out
        source.run(condition=RunSteps(num_steps=steps), run_cfg=cfg)
        for k in range(n_layers):
            spikes[k].append(sinks[k].data.get().T.astype(np.int8))
        source.stop()
    out = {f"s{k}": np.stack(spikes[k]) for k in range(n_layers)}
    np.savez(dst, **out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
