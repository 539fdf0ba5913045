"""The scheduler's own cost per step, with an engine that costs nothing: this checkout beside
another one (a worktree of an earlier commit), measured in alternation in one run.

    python -m bench.step_overhead [--baseline-tree build/baseline] [--rows 16,64,256] [--rounds 5]

A step here is: submit N one-row requests of real-text-like lengths, then plan, pad, "run" (the
engine returns zeros at once) and answer them all. What is left is the Python work around the
engine: the queue, the planner, padding, scattering and answering. Each checkout runs in a
process of its own (``bench/step_probe.py`` of this checkout, run with that checkout on
``PYTHONPATH``), so two versions of the scheduler never meet in one interpreter; the probe speaks
both the current step API and the earlier ``run_collection`` one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.paths import ROOT

# runs inside the measured checkout (its code on PYTHONPATH), this checkout's file: prints
# {rows: median seconds per step}
PROBE = Path(__file__).resolve().parent / "step_probe.py"


def measure(code_root: Path, sizes: list[int], repeats: int) -> dict[int, float]:
    env = dict(os.environ, PYTHONPATH=str(code_root))
    out = subprocess.run(
        [sys.executable, str(PROBE), json.dumps(sizes), str(repeats)],
        cwd=code_root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {int(k): v for k, v in json.loads(out).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-tree", type=Path, default=ROOT / "build" / "baseline")
    parser.add_argument("--rows", default="16,64,256")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=100, help="timed steps per round")
    args = parser.parse_args()
    if not (args.baseline_tree / "python_backend").is_dir():
        parser.error(f"--baseline-tree {args.baseline_tree} is not a checkout of this project")
    sizes = [int(x) for x in args.rows.split(",")]
    codes = {"baseline": args.baseline_tree.resolve(), "this checkout": ROOT}
    runs: dict[str, list[dict[int, float]]] = {name: [] for name in codes}
    for k in range(args.rounds):
        # the order flips every round: neither checkout always runs on a cold or a warm machine
        order = list(codes.items()) if k % 2 == 0 else list(codes.items())[::-1]
        for name, root in order:
            runs[name].append(measure(root, sizes, args.repeats))
    print(
        f"    python -m bench.step_overhead --baseline-tree {args.baseline_tree} --rows "
        f"{args.rows} --rounds {args.rounds} --repeats {args.repeats}\n"
    )
    # the fastest round of each: the machine's noise only ever adds time
    print("| rows per step | baseline ms | this checkout ms | per row, this checkout | ratio |")
    print("|---|---|---|---|---|")
    for n in sizes:
        base = min(r[n] for r in runs["baseline"]) * 1e3
        new = min(r[n] for r in runs["this checkout"]) * 1e3
        print(f"| {n} | {base:.3f} | {new:.3f} | {new / n * 1e3:.1f} us | {new / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
