"""GPU check: everything kvlab measures on CUDA, in one command (`make gpu-check`) for whoever has an NVIDIA GPU.

1. the torch build: a CUDA build that sees a device (else one line saying so, exit 2, nothing written);
2. the tests that only run on CUDA (the test files that mention cuda), none of them skipped;
3. notebook 05 on the device through `kvlab run`: the packed cache measured by the CUDA allocator against the
   predicted bytes, with a budget sized to the device (60% of its memory, at most 100 GiB);
4. the quantizer benchmark (kvlab vs torchao, same process) and the decode benchmark (capped sparse vs dense SDPA)
   on CUDA.
Everything goes into data/measurements/<gpu-name>.json (commit it); a stage that fails is recorded as failed and
the others still run; the exit code is 0 only when every stage passed.
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CUDA_TORCH = 'make setup TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"'


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200' (the measurement file's name)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def no_gpu_reason() -> str:
    """'' when torch is a CUDA build that sees a device; else why not, in a few words."""
    import torch
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"
    return ""


class StageFailed(RuntimeError):
    """A stage that ran but did not pass: its figures are kept in the report beside the error."""

    def __init__(self, message: str, details: dict):
        super().__init__(message)
        self.details = details


def _stage(report: dict, name: str, fn) -> None:
    t0 = time.perf_counter()
    print(f"gpu-check: {name} ...", flush=True)
    try:
        out = fn()
        report[name] = {"status": "ok", **(out or {})}
    except Exception as e:  # one stage's failure is recorded; the others still run
        report[name] = {"status": "failed", "error": f"{type(e).__name__}: {e}".splitlines()[0][:500],
                        **getattr(e, "details", {})}
    report[name]["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"gpu-check: {name} {report[name]['status']} ({report[name]['seconds']} s)"
          + (f": {report[name]['error']}" if "error" in report[name] else ""), flush=True)


def device_info() -> dict:
    import torch
    p = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        driver = None
    return {"name": p.name, "capability": f"{p.major}.{p.minor}", "total_memory_bytes": int(p.total_memory),
            "devices": torch.cuda.device_count(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "driver": driver, "python": platform.python_version()}


def gpu_tests() -> dict:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if "cuda" in p.read_text() and p.name != "test_gpu_check.py")
    r = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-q", "-rs",
                        *files], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-300:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", tail)}
    cuda_skips = [ln for ln in r.stdout.splitlines() if ln.startswith("SKIPPED") and "cuda" in ln.lower()]
    if r.returncode != 0 or cuda_skips:
        raise RuntimeError(f"{tail}" + (f"; skipped for CUDA: {cuda_skips[:3]}" if cuda_skips else ""))
    return {"files": files, "summary": tail, **counts}


def notebook_05(budget_gib: float, lengths: list[int]) -> dict:
    from kvlab.nb.runner import run_notebooks
    params = {"device": "cuda", "budget_gib": budget_gib, "context_lengths": lengths}
    with tempfile.TemporaryDirectory() as tmp:
        _, runs = run_notebooks(["05"], params, Path(tmp) / "runs", log=lambda m: None)
        run = runs[0]
        if run.status != "ok":
            raise RuntimeError(f"notebook 05 failed: {run.error}")
    r = run.results
    if r.get("all_measured_equal_predicted") is not True:  # every row measured again here, to say which differ
        from kvlab.cache.measurement import sweep
        rows = sweep(["deepseek-v4.1-flash", "qwen3-8b"], ["default", "nvfp4"], lengths, device="cuda",
                     budget_bytes=int(budget_gib * 2**30))
        keep = ("model", "kv_format", "tokens", "method", "measured_bytes", "predicted_bytes", "check_bytes",
                "block_bytes", "cause", "status")
        raise StageFailed(f"measured bytes differ from the prediction (max {r.get('max_abs_difference_bytes')} B)",
                          {"parameters": params, "results": r,
                           "rows": [{k: row.get(k) for k in keep} for row in rows]})
    return {"parameters": params, "results": r}


def quant_bench() -> dict:
    from benchmarks.bench_quant import run
    out = run(4096, "cuda")
    if not all(v["bit_exact"] for v in out.values()):
        raise RuntimeError(f"kvlab and torchao differ on CUDA: {out}")
    return {"n": 4096, "formats": out}


def decode_bench(lengths: list[int]) -> dict:
    from benchmarks.bench_decode import run
    return {"rows": [run(t, device="cuda") for t in lengths]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gpu-check", description=__doc__.splitlines()[0])
    ap.add_argument("--budget-gib", type=float, help="notebook 05's budget (default: 60%% of the device, <= 100)")
    ap.add_argument("--lengths", default="4096,131072,1000000", help="notebook 05's context lengths")
    ap.add_argument("--decode-lengths", default="131072,1048576", help="decode benchmark's cache lengths")
    ap.add_argument("--out", default=str(ROOT / "data" / "measurements"), help="folder for <gpu-name>.json")
    args = ap.parse_args(argv)
    why = no_gpu_reason()
    if why:
        print(f"gpu-check: no CUDA GPU here ({why}); run it on a machine whose nvidia-smi lists a GPU, after "
              f"{CUDA_TORCH}", file=sys.stderr)
        return 2
    report = {"kvlab_gpu_check": 1, "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    _stage(report, "device", device_info)
    total_gib = report["device"].get("total_memory_bytes", 0) / 2**30
    budget = args.budget_gib or round(min(100.0, 0.6 * total_gib), 1)
    lengths = [int(x) for x in args.lengths.split(",")]
    _stage(report, "gpu_tests", gpu_tests)
    _stage(report, "notebook_05", lambda: notebook_05(budget, lengths))
    _stage(report, "bench_quant", quant_bench)
    _stage(report, "bench_decode", lambda: decode_bench([int(x) for x in args.decode_lengths.split(",")]))
    out = Path(args.out) / f"{gpu_slug(report['device'].get('name', 'gpu'))}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    failed = [k for k, v in report.items() if isinstance(v, dict) and v.get("status") == "failed"]
    print(f"gpu-check: wrote {out}" + (f"; failed: {', '.join(failed)}" if failed else "; every stage passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
