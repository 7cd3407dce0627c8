"""The training loop of ``snnquant train``: one pass over a loader (:func:`run_epoch`), the firing
rates of the neuron layers, and the epochs of a run (:func:`train`), each ending in a checkpoint
that ``--resume`` continues from."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from snnquant.cli.data import make_loaders
from snnquant.cli.distributed import all_sum, barrier
from snnquant.cli.report import EpochLog, write_metrics, write_plots
from snnquant.cli.resume import CHECKPOINT, run_configuration


class FiringRates:
    """Mean firing rate of every neuron layer, accumulated with forward hooks."""

    def __init__(self, model):
        from spikingjelly.activation_based import neuron
        self.sums, self.counts, self.handles = {}, {}, []
        for name, m in model.named_modules():
            if isinstance(m, neuron.BaseNode):
                self.handles.append(m.register_forward_hook(self._hook(name)))
                self.sums[name], self.counts[name] = 0.0, 0

    def _hook(self, name):
        def hook(_m, _inp, out):
            self.sums[name] += float(out.detach().float().mean())
            self.counts[name] += 1
        return hook

    def pop(self):
        """The mean firing rate per layer since the last call; starts counting anew."""
        rates = {k: self.sums[k] / max(1, self.counts[k]) for k in self.sums}
        for k in self.sums:
            self.sums[k], self.counts[k] = 0.0, 0
        return rates


def run_epoch(model, loader, opt, scaler, args, device, train: bool, rank: int, epoch: int,
              label: str = "", reduce: bool = True, distiller=None):
    """One pass over ``loader`` (training when ``train``): MSE between the output firing rate and
    the one-hot label (mixed with the distillation loss of ``distiller``, a
    :class:`~snnquant.distill.Distiller` of ``model``, when training), an ``opt`` step per
    batch, ``reset_net`` after each; returns ``(mean loss, accuracy)``, summed over ranks when
    ``reduce``."""
    from spikingjelly.activation_based import functional
    from tqdm import tqdm

    model.train(train)
    total_loss, correct, count = 0.0, 0, 0
    use_amp = args.amp
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    desc = label or f"epoch {epoch + 1}/{args.epochs} {'train' if train else 'test '}"
    # a bar redraws itself with a carriage return per batch: in a terminal only; a redirected
    # log gets one line per epoch (the caller's, or this pass's own below)
    bar = rank == 0 and sys.stdout.isatty()
    phase = label
    for frames, label in tqdm(loader, desc=desc, disable=not bar, leave=False, file=sys.stdout):
        x = frames.to(device, non_blocking=True).float().transpose(0, 1)  # [T, N, 2, 34, 34]
        y = label.to(device, non_blocking=True)
        with torch.set_grad_enabled(train), torch.autocast(device.type, dtype=amp_dtype,
                                                           enabled=use_amp):
            distil = distiller is not None and train
            out = distiller(x) if distil else model(x)
            out_float = out.float()
            # [T, N, classes] per step (the example's spikes, Spikformer), or [N, classes]: a
            # network of SpikingJelly's model package that averages over time itself
            rate = out_float.mean(0) if out_float.dim() == 3 else out_float
            if getattr(args, "model", None):   # the model package's heads give logits
                loss = F.cross_entropy(rate, y)
            else:
                loss = F.mse_loss(rate, F.one_hot(y, rate.shape[-1]).float())
            if distil:
                loss = distiller.loss(out, loss)
        if train:
            opt.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
        functional.reset_net(model)
        total_loss += loss.item() * y.numel()
        correct += int((rate.argmax(1) == y).sum())
        count += y.numel()
    if reduce:
        total_loss, correct, count = all_sum([total_loss, correct, count], device)
    if phase and rank == 0 and not bar:
        print(f"{phase}: loss {total_loss / count:.4f} acc {correct / count:.4f}", flush=True)
    return total_loss / count, correct / count


def train(model, train_set, test_set, args, device, rank: int, world: int, out: Path,
          ckpt=None, distiller=None):
    """Train ``model`` (already on ``device``) for the epochs ``--epochs`` asks, from the first or,
    given the checkpoint ``ckpt`` of ``--resume``, from the one after it: Adam at ``--lr`` with a
    cosine schedule, DDP over ``world`` processes, the last ``--freeze-bn-epochs`` epochs with
    the BatchNorm statistics frozen. After every epoch rank 0 reports it and writes
    ``checkpoint.pt``, ``metrics.json`` and the plots into ``out``. With ``distiller`` (a
    :class:`~snnquant.distill.Distiller` of ``model``) the training passes distil from its
    frozen teacher.

    Returns:
        ``(history, seconds, stopped_after)``: one entry per epoch (losses, accuracies, firing
        rates, seconds), the seconds of the epochs, and the epoch after which ``--stop-after``
        stopped the run (``None`` when it ran to the end).
    """
    import snnquant

    ckpt_path = out / CHECKPOINT
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
    scaler = torch.amp.GradScaler("cuda") if args.amp and device.type == "cuda" else None

    start_epoch, history = 0, []
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        torch.set_rng_state(ckpt["torch_rng"])
        if scaler is not None and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        start_epoch, history = ckpt["epoch"], json.loads(ckpt["history"])
        if rank == 0:
            print(f"resumed from {ckpt_path} after epoch {start_epoch}")

    net = model
    if world > 1:
        ddp_kw = dict(device_ids=[device.index]) if device.type == "cuda" else {}
        net = torch.nn.parallel.DistributedDataParallel(model, **ddp_kw)
        if distiller is not None:
            distiller.student = net  # the same modules (hooks and all), through the DDP wrapper
    rates = FiringRates(model)
    log = EpochLog(out) if rank == 0 else None

    t_start = time.time()
    for epoch in range(start_epoch, args.epochs):
        if epoch >= args.epochs - args.freeze_bn_epochs and snnquant.freeze_batchnorm(model) \
                and rank == 0 and epoch == args.epochs - args.freeze_bn_epochs:
            print(f"epoch {epoch + 1}: BN statistics frozen (the deployed network trains)")
        train_loader, test_loader = make_loaders(train_set, test_set, args, rank, world, epoch)
        t0 = time.time()
        train_loss, train_acc = run_epoch(net, train_loader, opt, scaler, args, device, True, rank,
                                          epoch, distiller=distiller)
        train_rates = rates.pop()
        names = sorted(train_rates)
        train_rates = {k: v / world for k, v in zip(names, all_sum([train_rates[k] for k in names], device))}
        test_loss, test_acc = run_epoch(net, test_loader, None, None, args, device, False, rank, epoch)
        test_rates = rates.pop()
        rate_names = sorted(test_rates)
        rate_vals = all_sum([test_rates[k] for k in rate_names], device)
        test_rates = {k: v / world for k, v in zip(rate_names, rate_vals)}
        sched.step()
        entry = dict(epoch=epoch + 1, train_loss=train_loss, train_acc=train_acc,
                     test_loss=test_loss, test_acc=test_acc, firing_rates=test_rates,
                     train_firing_rates=train_rates, seconds=time.time() - t0)
        history.append(entry)
        if rank == 0:
            log.epoch(entry, args.epochs)
            ckpt = dict(model=model.state_dict(), optimizer=opt.state_dict(),
                        scheduler=sched.state_dict(), epoch=epoch + 1,
                        torch_rng=torch.get_rng_state(), history=json.dumps(history),
                        scaler=scaler.state_dict() if scaler is not None else {},
                        config=run_configuration(args, world))
            snnquant.save_checkpoint(ckpt, ckpt_path)
            write_metrics(out, args, history)
            write_plots(out, history)
        barrier()
        if args.stop_after is not None and epoch + 1 >= args.stop_after:
            if rank == 0:
                print(f"stopping after epoch {epoch + 1} (--stop-after)")
            if log is not None:
                log.close()
            return history, time.time() - t_start, epoch + 1
    seconds = time.time() - t_start
    if log is not None:
        log.close()
    return history, seconds, None
