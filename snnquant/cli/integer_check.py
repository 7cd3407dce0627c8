"""The integer check at the end of ``snnquant train``: BatchNorm folded into the quantized weights,
the folded network (briefly fine-tuned with ``--finetune-epochs``) exported to integers and to C,
and the integer simulator compared with it, output spike for output spike."""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from snnquant.cli.data import make_loaders
from snnquant.cli.training import run_epoch


def deploy_check(model, train_set, test_set, args, device, out: Path, max_samples: int = 64):
    """Fold BN into the quantized weights, fine-tune the folded network briefly, export it to
    integers and compare the integer simulator with it.

    BN folding changes every weight (and re-initialises the learned weight steps), so the folded
    network is fine-tuned for ``--finetune-epochs`` epochs (quantization in the loop, same data
    order rule, learning rate ``--lr`` with a cosine schedule). Returns the folded network's test accuracy (the
    network that is deployed) and the integer agreement: the fraction of ``max_samples`` test
    samples whose whole output spike train is identical in the integer simulator and in the
    fake-quantized float model (the simulator runs on the CPU). Writes ``model_int.safetensors``
    and ``model_folded.pt``. Runs on one process.
    """
    if args.weight_bits == 0 or args.v_bits == 0 or args.membrane_quantizer != "uniform" \
            or args.weight_quantizer not in ("lsq_pow2", "quantized_bits"):
        return {"skipped": "integer export needs quantized power-of-two weights "
                           "(--weight-quantizer lsq_pow2) and a uniform membrane"}
    from spikingjelly.activation_based import functional

    import snnquant
    from snnquant.export import (ExportError, FoldWarning, c_memory, fold_batchnorm,
                                 integer_agreement, save_integer, to_c, to_integer)

    # a network of SpikingJelly's model package is captured from a run (its forward checks
    # shapes), on the first training samples, as quantize_model did
    example = None
    if getattr(args, "model", None):
        from snnquant.cli.zoo import example_batch
        example = example_batch(train_set).to(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FoldWarning)
        folded, fold_report = fold_batchnorm(model.eval(), return_report=True,
                                             example_input=example)
    for w in caught:  # the fold's own words, once, on the console
        print(f"warning: {w.message}")
    changed = fold_report.changed()
    fold_text = (f"folding changed {len(changed)} layers" if changed else
                 "folding changed no weight")
    folded = folded.to(device)
    functional.reset_net(folded)
    history = []
    if args.finetune_epochs:
        opt = torch.optim.Adam(folded.parameters(), lr=args.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.finetune_epochs)
        for e in range(args.finetune_epochs):
            train_loader, _ = make_loaders(train_set, test_set, args, 0, 1, args.epochs + e)
            loss, acc = run_epoch(folded, train_loader, opt, None, args, device, True, 0, e,
                                  label="fine-tune folded", reduce=False)
            sched.step()
            history.append(dict(epoch=e + 1, train_loss=loss, train_acc=acc))
    _, test_loader = make_loaders(train_set, test_set, args, 0, 1, 0)
    _, folded_acc = run_epoch(folded, test_loader, None, None, args, device, False, 0, 0,
                              label="test folded", reduce=False)
    xs, n = [], 0
    for frames, _label in test_loader:
        xs.append(frames.float().transpose(0, 1))
        n += frames.shape[0]
        if n >= max_samples:
            break
    x_seq = torch.cat(xs, 1)[:, :max_samples]
    folded = folded.cpu().eval()
    reference = None
    if example is None:
        desc = to_integer(folded)
    else:
        from snnquant.cli.zoo import data_input_max
        largest = max(data_input_max(train_set), data_input_max(test_set))
        try:
            desc, reference = _zoo_integer(folded, x_seq, largest)
        except ExportError as exc:   # named in the report before training, with its fix
            return {"skipped": f"the integer export refuses the trained network: {exc}"}
    save_integer(desc, out / "model_int.safetensors")
    snnquant.save_checkpoint(folded.state_dict(), out / "model_folded.pt")
    if reference is not None:   # compared with the model in the dtype it is exact against
        folded, x_seq = folded.to(reference), x_seq.to(reference)
    to_c(desc, out, "model_int", input_shape=tuple(x_seq.shape[2:]))   # model_int.h / model_int.c
    mem = c_memory(desc, tuple(x_seq.shape[2:]))
    agreement = integer_agreement(folded, x_seq, desc)
    extra = {} if reference is None else {"reference_dtype": str(reference).replace("torch.", ""),
                                          "input_max": desc.input_max}
    return {**extra, "folded_test_acc": folded_acc, "agreement": float(agreement),
            "samples": int(x_seq.shape[1]), "finetune": history, "fold": fold_text,
            "c_rom_bytes": mem.rom_bytes, "c_ram_bytes": mem.ram_bytes}


def _zoo_integer(folded, x_seq, input_max: int):
    """The integer network of a ``--model`` network, captured from a run on ``x_seq``, exact up
    to ``input_max`` (the largest count of the run's data); in float64 when the float32 sums are
    not exact (the deployability report before training said so). ``(desc, reference_dtype)``."""
    from snnquant.export import ExportError, to_integer

    try:
        return to_integer(folded, example_input=x_seq, input_max=input_max), torch.float32
    except ExportError as exc:
        if getattr(exc, "check", None) != "accumulator":
            raise
        print(f"integer export: float32 sums are not exact ({str(exc)[:160]} ...); exporting "
              f"against the float64 model (reference_dtype=torch.float64)")
        return (to_integer(folded.double(), example_input=x_seq.double(), input_max=input_max,
                           reference_dtype=torch.float64), torch.float64)
