"""One prepared check of snnquant's CUDA path on a lent GPU, with a dry run for the CPU.

On a CUDA machine, in one call of under 8 minutes with the installation (``gpu_check.sh``):

1. records the GPU, driver, CUDA, torch, CuPy, Triton and SpikingJelly versions;
2. runs the CUDA-marked tests (``pytest -m cuda`` over the test files that carry the marker, in
   ``--test-shards`` parallel processes so that CuPy's compilations overlap) and counts
   passed / failed / skipped from their JUnit files (merged into ``junit_cuda.xml``);
3. trains the example's CSNN (``examples/train_nmnist.py``'s ``build_csnn``, W4/V8) a few steps
   with ``backend='cupy'``, ``'auto'`` and ``'torch'`` from the same seed and data, and checks
   what the tests check between backends: the first step's output spikes identical, its
   gradients within the documented tolerance (rtol = atol = 2e-5); then folds BN, exports each
   with ``to_integer`` and requires 100% integer agreement (the float model on the GPU);
4. times ``QuantLIFNode(v_quant=8, backend='cupy')`` forward + backward against SpikingJelly's
   ``LIFNode`` at T in {4, 16, 64}, 2**22 neurons per step, float32 and float16 (CUDA events,
   warm-up, medians; ``bench_neuron_gpu.make_case`` and ``cuda_time``). SpikingJelly 2.0's
   neurons have no ``backend`` argument: its LIF kernel is chosen by the environment variable
   ``SJ_LIF_CUDA_IMPLEMENTATION`` (auto | cuda | triton | torch), read once per process, so each
   of 'torch', 'triton' and 'cuda' (its native extension, absent from the PyPI wheel) is timed
   in its own process with the variable set; set explicitly, a profile that implementation
   cannot run raises instead of falling back, and ``functional.neuron_implementation`` is
   recorded. SpikingJelly 2.0 has no CuPy backend; the last SpikingJelly that has one
   (0.0.0.0.14, ``LIFNode(backend='cupy')``) is timed too where its wheel was carried
   (``gpu_check.sh --prepare`` puts it in ``.whl/legacy/``; installed apart, in ``--legacy-site``).

It writes ``bench_neuron_gpu.md`` and ``bench_neuron_gpu.json`` into ``--out`` (default
``benchmarks/results``) after every part, so a run cut short still leaves what it measured, with
the pass/fail counts and the targets at T = 16, float32 (QuantLIFNode(v8, cupy) time at most 1.0x
SpikingJelly's cupy LIFNode and at most 1.3x its triton one) stated as met, missed (by how much,
with the kernel profile of QuantLIFNode) or not measured (why).

Dry run (``--dry-run``, chosen by itself, saying so, where ``torch.cuda.is_available()`` is
False; a GPU that is there is hidden from its subprocesses): everything that needs no CUDA runs
on the CPU (the same pytest invocation, where every CUDA test skips and the skips are counted;
the short training and integer export with ``'auto'`` and ``'torch'``; one timing worker process
at tiny sizes, QuantLIFNode with ``backend='torch'`` and SpikingJelly's torch reference, plus the
legacy SpikingJelly's where it is installed) and every part that needed CUDA is listed with the
reason. It writes ``gpu_check_dry_run.md``/``.json`` into ``--out`` (default: a new temporary
folder) and refuses ``benchmarks/results``, so that no CPU figure passes for a GPU one.

Usage here (no GPU): ``python benchmarks/gpu_check.py --dry-run``. On the lent GPU, from a
checkout prepared with ``bash benchmarks/gpu_check.sh --prepare`` (copies ``../shared/wheels``
into ``.whl/`` and downloads the legacy SpikingJelly wheel into ``.whl/legacy/``), one call of
the device tool::

    run(command="set -o pipefail; bash benchmarks/gpu_check.sh --out $OUT 2>&1 | tee $OUT/gpu_check.log",
        carry=[".whl"], timeout_s=480)

then copy ``bench_neuron_gpu.md`` and ``.json`` from the returned files into
``benchmarks/results/`` (``junit_cuda.xml`` and ``gpu_check.log`` hold the details).
"""
# This file is the entry (the docstring is its --help): the arguments, the parts in their order,
# the dry run's choices and what it hides from the subprocesses. What runs on the device
# (environment, tests, training, timing workers) is in _gpu_check_device.py; the targets, the
# JUnit counts and the files written are in _gpu_check_report.py.
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules beside it
from _gpu_check_device import (DRY_TIMING, GPU_TIMING, Budget, _bench_module,  # noqa: E402
                               check_training, environment, run_cuda_tests, run_timing,
                               run_worker, timing_plan)
from _gpu_check_report import (TARGETS, evaluate_targets, format_markdown,  # noqa: E402
                               junit_counts, merge_junit, output_folder, write_report)

#: the parts' names the tests and the device call use from here
__all__ = ["main", "parse_args", "environment", "run_cuda_tests", "check_training", "run_timing",
           "run_worker", "timing_plan", "junit_counts", "merge_junit", "evaluate_targets",
           "format_markdown", "write_report", "output_folder", "Budget", "GPU_TIMING",
           "DRY_TIMING", "TARGETS", "_bench_module"]


def parse_args(argv=None):
    """The arguments of the check (``--help``); errors exit with status 2."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None,
                        help="folder for the results (default: benchmarks/results on a GPU, a new "
                             "temporary folder in a dry run)")
    parser.add_argument("--dry-run", action="store_true",
                        help="run on the CPU what needs no CUDA and list what was skipped")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="seconds the whole check may take; later parts are cut to fit")
    parser.add_argument("--test-shards", type=int, default=None,
                        help="parallel pytest processes (default: 8 on a GPU, 1 in a dry run)")
    parser.add_argument("--train-steps", type=int, default=4)
    parser.add_argument("--legacy-site", default=os.environ.get("SNNQUANT_SJ_LEGACY_SITE",
                                                                "/tmp/site_sj_legacy"),
                        help="folder where SpikingJelly 0.0.0.0.14 is installed (pip --target)")
    parser.add_argument("--skip", nargs="+", default=[], choices=("tests", "training", "timing"),
                        help="parts not to run (listed as skipped)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget_s <= 0:
        parser.error(f"--budget-s must be positive, got {args.budget_s}")
    if args.test_shards is not None and args.test_shards < 1:
        parser.error(f"--test-shards must be >= 1, got {args.test_shards}")
    if args.train_steps < 1:
        parser.error(f"--train-steps must be >= 1, got {args.train_steps}")
    return args


def main(argv=None) -> int:
    """Run the check (or, with ``--worker``, one timing worker); return the exit status: 1 when
    a part failed or broke, else 0."""
    args = parse_args(argv)
    if args.worker:
        return run_worker(args.worker)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    os.environ.setdefault("CUPY_CACHE_DIR", os.path.join(tempfile.gettempdir(), "cupy_cache"))
    import torch

    cuda = torch.cuda.is_available()
    dry = args.dry_run or not cuda
    if not cuda and not args.dry_run:
        print("no CUDA device here (torch.cuda.is_available() is False): running the dry run; "
              "nothing is measured on a GPU", flush=True)
    if dry and cuda:  # the subprocesses (tests, timing workers) must not use it either
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    out = output_folder(args.out, dry)
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s)
    report = {"mode": "dry-run" if dry else "gpu",
              "command": " ".join(["python", "benchmarks/gpu_check.py", *(argv if argv is not None
                                                                          else sys.argv[1:])]),
              "environment": environment(cuda and not dry), "parts": {}, "skipped": []}
    device = "cuda" if (cuda and not dry) else "cpu"
    write_report(report, out)

    def part(name, run):
        if name in args.skip:
            report["parts"][name] = {"status": "skipped", "reason": "--skip " + name}
            report["skipped"].append({"part": name, "reason": "--skip " + name})
        else:
            print(f"== {name} ({budget.left():.0f} s of the budget left)", flush=True)
            began = time.monotonic()
            try:
                report["parts"][name] = run()
            except Exception as error:  # one broken part must not lose the others' results
                import traceback

                report["parts"][name] = {"status": "error",
                                         "reason": f"{type(error).__name__}: {error}",
                                         "traceback": traceback.format_exc()[-3000:]}
            report["parts"][name]["seconds"] = round(time.monotonic() - began, 1)
            print(f"   {name}: {report['parts'][name].get('status')}", flush=True)
        write_report(report, out)

    shards = args.test_shards or (1 if dry else 8)
    part("tests", lambda: run_cuda_tests(out, shards,
                                         max(30.0, min(240.0, budget.left() - 150))))
    backends = ("torch", "cupy", "auto") if not dry else ("torch", "auto")
    if dry:
        why = "no CUDA device" if not cuda else "--dry-run (the GPU hidden from subprocesses)"
        report["skipped"] += [
            {"part": "running the CUDA-marked tests",
             "reason": f"{why}: pytest skipped each of them (counted under Tests)"},
            {"part": "training with backend='cupy', integer agreement of the float model on CUDA",
             "reason": f"{why}: the dry run trains with 'torch' and 'auto' on the CPU"}]
    part("training", lambda: check_training(device, backends, args.train_steps))
    part("timing", lambda: run_timing(not dry, args.legacy_site, budget))
    report["skipped"].extend(report["parts"]["timing"].get("skipped", []))
    report["seconds"] = round(args.budget_s - budget.left(), 1)
    json_path, md_path = write_report(report, out)
    print(format_markdown(report))
    print(f"wrote {json_path} and {md_path}")
    failed = [n for n, p in report["parts"].items() if p.get("status") in ("failed", "error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
