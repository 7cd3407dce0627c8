"""``snnquant train --ptq``: post-training quantization of a trained full-precision network, without
retraining it (BatchNorm folded, quantized, calibrated, optionally fine-tuned, exported)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from snnquant.cli.data import make_loaders
from snnquant.cli.network import build_network, quantize
from snnquant.cli.report import atomic_write_text
from snnquant.cli.training import run_epoch


def ptq_network(args):
    """``--ptq``: the full-precision network of the flags with the checkpoint's weights loaded.

    Raises:
        ValueError: one line naming ``--ptq``, the file and why (unreadable, damaged, quantized,
            or a network of other flags such as ``--channels``).
    """
    import snnquant

    try:  # checksum verified, no pickle
        state = snnquant.load_checkpoint(args.ptq, map_location="cpu")
    except (OSError, ValueError) as exc:
        raise ValueError(f"--ptq {args.ptq}: {exc}") from None
    state = state.get("model", state) if isinstance(state.get("model"), dict) else state
    net = build_network(args)
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        why = str(exc).strip().splitlines()
        detail = " ".join(line.strip() for line in why[1:3])
        raise ValueError(f"--ptq {args.ptq} is not the full-precision model (a --weight-bits 0 "
                         f"--v-bits 0 run) of this network (--dataset {args.dataset}, --channels "
                         f"{args.channels}): {detail}") from None
    return net


def run_ptq(args, train_set, test_set, device, out: Path):
    """``--ptq``: quantize a trained full-precision network without retraining it.

    Fold BN into the full-precision weights, ``snnquant.quantize_model``, ``snnquant.calibrate`` on
    ``--calib-batches`` training batches, evaluate; fine-tune ``--finetune-epochs`` epochs
    (quantization in the loop, steps frozen by the calibration); export to integers and report the
    integer agreement. Writes ``ptq.json`` and ``model_int.safetensors``.
    """
    import itertools

    import snnquant
    from snnquant.export import fold_batchnorm, integer_agreement, save_integer, to_integer

    try:
        net = ptq_network(args)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    net = fold_batchnorm(net.eval()).to(device)
    train_loader, test_loader = make_loaders(train_set, test_set, args, 0, 1, 0)
    _, fp_acc = run_epoch(net, test_loader, None, None, args, device, False, 0, 0,
                          label="test full precision", reduce=False)
    model, _ = quantize(net, args)
    calib = ((frames.float().transpose(0, 1), y)
             for frames, y in itertools.islice(train_loader, args.calib_batches))
    report = snnquant.calibrate(model, calib, method=args.calib_method)
    print(report)
    _, ptq_acc = run_epoch(model, test_loader, None, None, args, device, False, 0, 0,
                           label="test PTQ", reduce=False)
    result = dict(full_precision_test_acc=fp_acc, ptq_test_acc=ptq_acc, finetune=[])
    print(f"full precision {100 * fp_acc:.2f}%, PTQ W{args.weight_bits}/V{args.v_bits} "
          f"({args.calib_method}, {args.calib_batches} batches): {100 * ptq_acc:.2f}%")
    if args.finetune_epochs:
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=args.lr / 10)
        for e in range(args.finetune_epochs):
            loader, _ = make_loaders(train_set, test_set, args, 0, 1, e)
            run_epoch(model, loader, opt, None, args, device, True, 0, e, label="fine-tune PTQ",
                      reduce=False)
            _, acc = run_epoch(model, test_loader, None, None, args, device, False, 0, e,
                               label="test PTQ", reduce=False)
            result["finetune"].append(dict(epoch=e + 1, test_acc=acc))
            print(f"PTQ + {e + 1} fine-tuning epochs: {100 * acc:.2f}%")
    result["test_acc"] = result["finetune"][-1]["test_acc"] if result["finetune"] else ptq_acc
    if not args.no_integer_check and args.weight_quantizer == "lsq_pow2" \
            and args.membrane_quantizer == "uniform":
        model = model.cpu().eval()
        x_seq = torch.stack([torch.as_tensor(test_set[i][0]) for i in range(min(64, len(test_set)))])
        desc = to_integer(model)
        save_integer(desc, out / "model_int.safetensors")
        result["agreement"] = float(integer_agreement(model, x_seq.float().transpose(0, 1), desc))
        print(f"integer model agreement: {100 * result['agreement']:.2f}%")
    atomic_write_text(out / "ptq.json", json.dumps(dict(flags=vars(args), result=result), indent=2))
    return result
