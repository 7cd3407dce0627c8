"""The report of ``benchmarks/gpu_check.py``: what its runs are judged against (the timing
targets), how they become counts and verdicts (JUnit files, targets), and the files it writes
(``bench_neuron_gpu.*`` on a GPU, ``gpu_check_dry_run.*`` in a dry run, never into
``benchmarks/results`` from the CPU). Nothing here needs torch or a GPU."""
from __future__ import annotations

import json
import re
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Optional

from _tables import write_atomic

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

#: the targets at T = 16, float32: QuantLIFNode(v8, cupy) time / baseline time at most this
LEGACY_SPIKINGJELLY = "0.0.0.0.14"
LEGACY_LABEL = f"spikingjelly {LEGACY_SPIKINGJELLY} cupy"
TARGETS = {LEGACY_LABEL: 1.0, "spikingjelly triton": 1.3}
TARGET_T, TARGET_DTYPE = 16, "float32"


def junit_counts(paths) -> dict:
    """Passed / failed / errors / skipped counts, skip reasons and failures from JUnit files."""
    counts = {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    skip_reasons: dict = {}
    failures = []
    for path in paths:
        for case in ElementTree.parse(path).getroot().iter("testcase"):
            counts["tests"] += 1
            name = f"{case.get('classname')}::{case.get('name')}"
            outcome = "passed"
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = {"failure": "failed", "error": "errors"}.get(child.tag, "skipped")
                    message = (child.get("message") or "").strip()
                    if outcome == "skipped":
                        reason = re.sub(r"^Skipped: ", "", message)[:120]
                        skip_reasons[reason] = skip_reasons.get(reason, 0) + 1
                    else:
                        failures.append({"test": name, "message": message[:400],
                                         "output": (child.text or "")[-1500:]})
                    break
            counts[outcome] += 1
    return {**counts, "skip_reasons": skip_reasons, "failures": failures[:30]}


def merge_junit(paths, target: Path) -> None:
    """One JUnit file holding the test suites of all shards."""
    merged = ElementTree.Element("testsuites")
    for path in paths:
        root = ElementTree.parse(path).getroot()
        merged.extend(root.iter("testsuite") if root.tag == "testsuites" else [root])
    ElementTree.ElementTree(merged).write(target, encoding="utf-8", xml_declaration=True)


def _ms(cases: dict, label: str, T: int, dtype: str):
    for row in cases.get(label, {}).get("rows", []):
        if row["T"] == T and row["dtype"] == dtype:
            return row.get("ms")
    return None


def evaluate_targets(cases: dict, cuda: bool) -> dict:
    """Each target: ratio, met / missed (by how much) / not measured (why)."""
    ours = _ms(cases, "snnquant QuantLIFNode(v8, cupy)", TARGET_T, TARGET_DTYPE)
    result = {}
    for baseline, limit in TARGETS.items():
        theirs = _ms(cases, baseline, TARGET_T, TARGET_DTYPE)
        entry = {"limit": limit, "baseline": baseline, "T": TARGET_T, "dtype": TARGET_DTYPE}
        if not cuda:
            entry.update(status="not measured", reason="dry run: no CUDA device")
        elif ours is None or theirs is None:
            missing = [name for name, v in (("QuantLIFNode(v8, cupy)", ours), (baseline, theirs))
                       if v is None]
            reason = cases.get(baseline, {}).get("unavailable")
            entry.update(status="not measured",
                         reason=f"no measurement of {', '.join(missing)}"
                                + (f" ({reason})" if reason else ""))
        else:
            ratio = ours / theirs
            entry.update(ratio=ratio, quantlif_ms=ours, baseline_ms=theirs,
                         status="met" if ratio <= limit else "missed")
            if ratio > limit:
                entry["missed_by"] = ratio - limit
        result[f"QuantLIFNode(v8, cupy) / {baseline}"] = entry
    return result


def format_markdown(report: dict) -> str:
    """The Markdown report of a run (``report``: environment, parts, skipped)."""
    env = report["environment"]
    dry = report["mode"] == "dry-run"
    title = ("# GPU check: DRY RUN on the CPU (no GPU figures)" if dry
             else f"# GPU check of the CUDA path: {env.get('gpu')}")
    lines = [title, ""]
    if dry:
        lines += ["Nothing here was measured on a GPU: the times are of tiny CPU runs that only "
                  "check the code path.", ""]
    lines += [f"{env.get('date_utc')} UTC; GPU {env.get('gpu')}"
              + (f" (compute capability {env['compute_capability']})"
                 if "compute_capability" in env else "")
              + f", driver {env.get('driver')}, torch {env.get('torch')} (CUDA "
              f"{env.get('torch_cuda')}), CuPy {env.get('cupy')}, Triton {env.get('triton')}, "
              f"SpikingJelly {env.get('spikingjelly')}, snnquant {env.get('snnquant')}, Python "
              f"{env.get('python')}.", "", f"Command: `{report['command']}`", "", "## Tests", ""]
    tests = report["parts"].get("tests", {})
    if "passed" in tests:
        lines.append(f"`pytest -m cuda` ({', '.join(tests.get('files', []))}; "
                     f"{tests.get('shards')} processes, {tests.get('seconds')} s): "
                     f"**{tests['passed']} passed, {tests['failed']} failed, {tests['errors']} "
                     f"errors, {tests['skipped']} skipped** of {tests['tests']} "
                     f"({tests.get('status')}).")
        for reason, n in tests.get("skip_reasons", {}).items():
            lines.append(f"- skipped {n}: {reason}")
        for failure in tests.get("failures", [])[:10]:
            lines.append(f"- FAILED {failure['test']}: {failure['message'][:200]}")
    else:
        lines.append(f"{tests.get('status')}: {tests.get('reason')}")
    lines += ["", "## Training the example's network, integer export", ""]
    training = report["parts"].get("training", {})
    if "backends" in training:
        lines.append(f"{training['network']}, {training['steps']} steps on {training['device']}"
                     f" ({training['status']}); compared with backend='torch'.")
        lines += ["", "| backend | runs as | losses | step-1 spike rates | step-1 spikes identical "
                  "(every LIF layer) | step-1 gradients within 2e-5 | integer agreement |",
                  "|---|---|---|---|---|---|---|"]
        for name, entry in training["backends"].items():
            spikes = entry.get("step0_spikes_identical", "reference")
            grads = entry.get("step0_grads_within_tolerance", "reference")
            if "step0_grad_max_abs_diff" in entry:
                grads = f"{grads} (max diff {entry['step0_grad_max_abs_diff']:.2e})"
            export = entry["integer_export"]
            lines.append(f"| {name} | {entry['resolves_to']} | "
                         f"{', '.join(f'{v:.4f}' for v in entry['losses'])} | "
                         f"{', '.join(f'{v:.3f}' for v in entry['step0_spike_rates'].values())} | "
                         f"{spikes} | "
                         f"{grads} | {export['agreement'] * 100:.2f}% of "
                         f"{export['samples']} (spike rates "
                         f"{', '.join(f'{v:.3f}' for v in export['integer_spike_rates'].values())})"
                         " |")
    else:
        lines.append(f"{training.get('status')}: {training.get('reason')}")
    lines += ["", "## Forward + backward time", ""]
    timing = report["parts"].get("timing", {})
    if "cases" in timing:
        grid = timing["grid"]
        lines.append(f"{timing['status']}; {grid['N']} neurons per step; median ms "
                     f"({'CUDA events' if not dry else 'wall clock'}, {grid['warmup']} warm-up, "
                     f"up to {grid['repeats']} timed calls); each SpikingJelly implementation "
                     "in its own process.")
        lines += ["", "| case | implementation | " + " | ".join(
            f"{d} T={t}" for d in grid["dtypes"] for t in grid["T"]) + " |",
            "|---|---|" + "---|" * (len(grid["dtypes"]) * len(grid["T"]))]
        for label, entry in timing["cases"].items():
            impl = (entry.get("implementation", {}).get("implementation")
                    or (f"backend={entry['backend']}" if "backend" in entry else "-"))
            if "unavailable" in entry:
                impl = "unavailable"
            cells = []
            for d in grid["dtypes"]:
                for t in grid["T"]:
                    row = next((r for r in entry["rows"] if r["T"] == t and r["dtype"] == d),
                               None)
                    cells.append("-" if row is None else
                                 (f"{row['ms']:.3f}" if "ms" in row else "error"))
            lines.append(f"| {label} | {impl} | " + " | ".join(cells) + " |")
        for label, entry in timing["cases"].items():
            if "unavailable" in entry:
                lines.append(f"\n{label}: unavailable: {entry['unavailable'][:300]}")
            for row in entry["rows"]:
                if "error" in row:
                    lines.append(f"\n{label} {row['dtype']} T={row['T']}: {row['error'][:300]}")
        lines += ["", "### Targets (T = 16, float32)", ""]
        for name, target in timing["targets"].items():
            text = f"- {name} <= {target['limit']}: **{target['status']}**"
            if "ratio" in target:
                text += f" ({target['ratio']:.3f}: {target['quantlif_ms']:.3f} ms / " \
                        f"{target['baseline_ms']:.3f} ms)"
            if "missed_by" in target:
                text += f", over the limit by {target['missed_by']:.3f}"
            if "reason" in target:
                text += f": {target['reason']}"
            lines.append(text)
        profile = next((e for e in timing["cases"].values() if "profile" in e), None)
        if profile:
            lines += ["", f"Kernel profile of QuantLIFNode(v8, cupy), T = 16, float32 "
                      f"({profile['profile_GBps']:.0f} GB/s by the fused kernels' byte count, "
                      f"device copy {profile['copy_GBps']:.0f} GB/s):", "",
                      "| kernel | launches per forward + backward | device us per forward + "
                      "backward |", "|---|---|---|"]
            lines += [f"| {r['name']} | {r['calls'] / 3:g} | {r['device_us_per_call']:.1f} |"
                      for r in profile["profile"]]
    else:
        lines.append(f"{timing.get('status')}: {timing.get('reason')}")
    if report["skipped"]:
        lines += ["", "## Skipped", ""]
        lines += [f"- {s['part']}: {s['reason']}" for s in report["skipped"]]
    return "\n".join(lines) + "\n"


def write_report(report: dict, out: Path) -> tuple[Path, Path]:
    """Write the report's JSON and Markdown atomically into ``out``; return their paths."""
    stem = "gpu_check_dry_run" if report["mode"] == "dry-run" else "bench_neuron_gpu"
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    write_atomic(json_path, json.dumps(report, indent=2, default=str))
    write_atomic(md_path, format_markdown(report))
    return json_path, md_path


def output_folder(requested: Optional[str], dry: bool) -> Path:
    """``--out``, or the default; a dry run never writes into benchmarks/results."""
    if requested is None:
        return Path(tempfile.mkdtemp(prefix="gpu_check_dry_run_")) if dry else RESULTS
    out = Path(requested).resolve()
    if dry and out == RESULTS.resolve():
        raise SystemExit(f"--out {requested}: a dry run does not write into benchmarks/results "
                         "(its CPU times must not pass for GPU figures); give another folder")
    return out

