"""The served ceiling of the split layout beside today's one-process model, and the CPU each
server process spends per request, on the real Triton server.

    python -m bench.fronts [--fronts 1,2] [--concurrency 64] [--rows-per-request 1] [--rounds 3]
                           [--table zero|table:a30|engine] [--baseline-tree build/baseline]
                           [--floor] [--pin-cores off|on|both] [--inputs text,ids]

Every variant serves the bench model over the emulated engine with a zero table by default
(forwards take no time: what is measured is the server around the engine, its ceiling at GPU
speed), or with ``--table engine`` over the bench model's own ONNX Runtime engine:
- ``one process``: today's model, one instance (queue, planner and decoding in one stub);
- ``N instances``: today's model with N instances, each its own queue (``--instances-per-gpu``);
- ``N fronts``: the split layout, N front instances and one queue owner;
- ``floor`` (with ``--floor``): not the project's model but the Python backend's own floor, a
  bench-only model that tokenizes each request and answers zeros from a thread
  (``bench.emulated_model.PythonBackendFloorModel``): what any design on this backend pays at
  least, per request, in its stub and in Triton.
Each measurement starts a server that loads only that variant; the variants alternate, in an
order that flips every round, so the shared machine's drift falls on all alike. perf_analyzer
(gRPC, real-text rows; with ``--inputs ids`` the same rows as token ids, as a client that
tokenizes sends them: no tokenizing in the server; ``text,ids``: both, side by side) drives it
at one concurrency; CPU seconds of Triton and of each stub are
read from /proc over the measurement, so per-request CPU is summed over every server process
(the client excluded) and split by process, with each process's context switches per request
(voluntary and not, summed over its threads, from /proc): where the CPU goes to threads handing
work to each other rather than to the work.

With ``--pin-cores on`` every variant's processes run with the ``pin_cores`` setting on, each on
a core of its own (python_backend.stub.cpu_pinning; not where the engine computes on the CPU, as with
``--table engine``); ``both`` serves each variant pinned and unpinned, side by side.

With ``--baseline-tree`` (another checkout of this project, a git worktree under build/, say),
every variant is also served by that checkout's code, in the same alternation: a change's
effect measured side by side with the code before it, on the same engine files.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from bench.errors import BenchError, reports_errors
from bench.harness import (
    add_emulated_split_variant,
    add_emulated_variant,
    build_repository,
    measure,
    token_id_input_data,
    warm_up,
)
from bench.owner_alone import cpu_seconds
from bench.paths import INPUT_DATA, ROOT
from bench.sim.validation import forward_stats, forwards_between
from builder.triton_config import add_model_variant, add_split_variant, write_config
from python_backend.common.contract import OWNER_SUFFIX
from tools.serve import child_stubs, stub_model
from tools.triton_server import TritonServer

SOURCE = "planner_dp"


@dataclass(frozen=True)
class Served:
    rows_per_s: float
    p99_ms: float
    stable: bool
    cpu_us_per_request: dict[str, float]  # by process role: triton, front(s), owner, model
    switches_per_request: dict[str, float]  # context switches, by process role
    rows_per_forward: float  # what the planners made of the rows they saw
    # the rest of the machine's busy CPU per request: the client (perf_analyzer) and whatever
    # else ran on the shared machine meanwhile
    other_us_per_request: float = 0.0


def context_switches(pid: int) -> int:
    """Context switches of every thread of a process so far, voluntary or not (0 once gone).
    Summed over /proc/PID/task: /proc/PID/status (what psutil reads) counts the main thread's
    only, and the stubs' switches are in their other threads."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as status:
                for line in status:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        total += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
    return total


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent busy so far (not idle, waiting on I/O, or
    taken by the hypervisor)."""
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0))


def stub_role(pid: int) -> str:
    """A stub's role, from the model entry it serves (the variants' names say which)."""
    model = stub_model(pid) or "?"
    if model.endswith(OWNER_SUFFIX):
        return "owner"
    return "front" if "_split" in model else "model"


FLOOR = "floor"  # the layout of the Python backend's floor model
FLOOR_MODEL_PY = (
    '"""Bench only: the Python backend floor (bench.emulated_model), not the project model."""\n'
    "from bench.emulated_model import PythonBackendFloorModel as TritonPythonModel\n\n"
    '__all__ = ["TritonPythonModel"]\n'
)
# which layout a variant serves: fronts (> 0), today's model with -N instances (<= 0), or FLOOR
VariantLayout = int | str


def variant(
    repository: Path, fronts: VariantLayout, table: str = "zero", pinned: bool = False
) -> str:
    """The variant's model name: ``fronts`` > 0 the split layout, else today's model with
    ``-fronts`` instances (each its own queue), or FLOOR; ``pinned``: its processes with the
    ``pin_cores`` setting on. ``table`` "engine" serves the bench model's own ONNX Runtime
    engine, any other is the emulated engine's table."""
    pinning = {"pin_cores": "on" if pinned else "off"}
    suffix = "_pinned" if pinned else ""
    if fronts == FLOOR:
        name = "python_backend_floor" + suffix
        add_model_variant(repository, SOURCE, name, pinning, model_py=FLOOR_MODEL_PY)
        return name
    assert isinstance(fronts, int)
    real = table == "engine"
    prefix = "engine" if real else "emulated"
    if fronts <= 0:
        instances = max(1, -fronts)
        name = f"{prefix}_x{instances}{suffix}"
        if real:
            config = add_model_variant(repository, SOURCE, name, pinning)
            config.instance_group[0].count = instances
            write_config(config, repository / name)
        else:
            add_emulated_variant(
                repository, SOURCE, name, table, instances=instances, parameters=pinning
            )
    else:
        name = f"{prefix}_split{fronts}{suffix}"
        if real:
            add_split_variant(repository, SOURCE, name, fronts, pinning)
        else:
            add_emulated_split_variant(repository, SOURCE, name, table, fronts, pinning)
    return name


def serve_once(
    repository: Path,
    fronts: VariantLayout,
    concurrency: int,
    rows: int,
    tmp: Path,
    ms: int,
    table: str,
    code_root: Path = ROOT,
    pinned: bool = False,
    token_ids: bool = False,
) -> Served:
    """One measurement of one variant, in a server of its own whose models import
    ``code_root``'s python_backend; ``token_ids``: its clients send the rows as token ids."""
    model = variant(repository, fronts, table, pinned)
    requests = INPUT_DATA
    if token_ids:
        requests = tmp / "token_ids.json"
        if not requests.is_file():
            token_id_input_data(repository / SOURCE / "1", requests)
    loads = [model] + ([f"{model}_owner"] if isinstance(fronts, int) and fronts > 0 else [])
    server = TritonServer.loading_only(
        repository, tuple(loads), tmp / f"triton-{model}.log", code_root=code_root
    )
    try:
        server.start()
        server.wait_ready()
    except RuntimeError as err:
        server.stop()
        log = (tmp / f"triton-{model}.log").read_text(errors="replace")[-6000:]
        raise BenchError(
            f"the server of {model} did not start ({err}); its log ends:\n{log}"
        ) from None
    try:
        assert server.process is not None
        warm_up(server, tmp, (model,), concurrency)
        pids = {server.process.pid: "triton"} | {
            pid: stub_role(pid) for pid in child_stubs(server.process.pid)
        }
        metrics = f"http://127.0.0.1:{server.metrics_port}/metrics"
        forwards_before = forward_stats(metrics, model)
        before = {pid: cpu_seconds(pid) for pid in pids}
        switches_before = {pid: context_switches(pid) for pid in pids}
        busy_before = machine_busy_seconds()
        started = time.monotonic()
        point, stable = measure(
            model, server.grpc_url, concurrency, tmp, ms, rows_per_request=rows, input_data=requests
        )
        wall = time.monotonic() - started
        busy = machine_busy_seconds() - busy_before
        time.sleep(0.6)  # the models publish their metrics every 0.25 s
        done = forwards_between(forwards_before, forward_stats(metrics, model)).values()
        spent: dict[str, float] = defaultdict(float)
        switched: dict[str, float] = defaultdict(float)
        for pid, role in pids.items():
            spent[role] += cpu_seconds(pid) - before[pid]
            switched[role] += context_switches(pid) - switches_before[pid]
    finally:
        server.stop()
    requests_per_s = point.rows_per_s / rows
    per_request = {role: s / wall / requests_per_s * 1e6 for role, s in spent.items()}
    switches = {role: n / wall / requests_per_s for role, n in switched.items()}
    other = max(0.0, busy - sum(spent.values())) / wall / requests_per_s * 1e6
    forwards = sum(bucket["forwards"] for bucket in done)
    per_forward = sum(b["rows"] for b in done) / forwards if forwards else float("nan")
    return Served(point.rows_per_s, point.p99_ms, stable, per_request, switches, per_forward, other)


def label(fronts: VariantLayout) -> str:
    if fronts == FLOOR:
        return "Python-backend floor"
    assert isinstance(fronts, int)
    if fronts > 0:
        return f"{fronts} front{'s' if fronts > 1 else ''}"
    return "one process" if fronts == 0 else f"{-fronts} instances"


THIS, BASELINE = "this checkout", "baseline"
INPUTS = ("text", "ids")  # what the clients send: text, or its rows as token ids
# a measured variant: its layout, whether its processes are pinned (pin_cores), whose code,
# what its clients send
Variant = tuple[VariantLayout, bool, str, str]


def variant_label(key: Variant, compared: bool) -> str:
    fronts, pinned, code, inputs = key
    name = (
        label(fronts) + (", pinned" if pinned else "") + (", token ids" if inputs == "ids" else "")
    )
    return f"{name}, {code}" if compared else name


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fronts", default="1,2", help="split variants to measure beside today's")
    parser.add_argument(
        "--instances",
        default="2",
        help="today's model with this many instances, each its own queue (empty: none)",
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rows-per-request", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--table",
        default="zero",
        help="the emulated engine's forward time (zero, table:a30, ...), or engine: the bench "
        "model's own ONNX Runtime engine on this CPU",
    )
    parser.add_argument("--measurement-ms", type=int, default=6000)
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench-repository")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also serve the Python backend's floor (a bench-only model: tokenize, answer zeros)",
    )
    parser.add_argument(
        "--pin-cores",
        choices=("off", "on", "both"),
        default="off",
        help="every variant with the pin_cores setting off, on, or both side by side",
    )
    parser.add_argument(
        "--inputs",
        default="text",
        help="what the clients send: text, or its rows as token ids (ids: INPUT_IDS, one row a "
        "request, a client that tokenizes); text,ids: both, side by side",
    )
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="another checkout of this project: every variant is served by its code too",
    )
    args = parser.parse_args(argv)
    inputs = [kind for kind in args.inputs.split(",") if kind]
    if not inputs or not set(inputs) <= set(INPUTS):
        parser.error(f"--inputs {args.inputs!r}: name text, ids or both (text,ids)")
    if "ids" in inputs and args.rows_per_request != 1:
        parser.error("--inputs ids sends one row a request (rows of different lengths)")
    compared = args.baseline_tree is not None
    if compared and not (args.baseline_tree / "python_backend").is_dir():
        parser.error(f"--baseline-tree {args.baseline_tree} is not a checkout of this project")
    codes = {THIS: ROOT} | ({BASELINE: args.baseline_tree.resolve()} if compared else {})
    repository, _ = build_repository(args.repository, rebuild=False)
    layouts: list[VariantLayout] = [
        0,
        *(-int(n) for n in args.instances.split(",") if n),
        *(int(n) for n in args.fronts.split(",") if n),
    ]
    pins = {"off": (False,), "on": (True,), "both": (False, True)}[args.pin_cores]
    # the floor is no checkout's model: served once a round, by this checkout's bench module
    variants: list[Variant] = [
        (fronts, pinned, code, kind)
        for fronts in layouts
        for pinned in pins
        for code in codes
        for kind in inputs
    ]
    variants += (
        [(FLOOR, pinned, THIS, kind) for pinned in pins for kind in inputs] if args.floor else []
    )
    results: dict[Variant, list[Served]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for key in variants if r % 2 == 0 else variants[::-1]:
                fronts, pinned, code, kind = key
                served = serve_once(
                    repository,
                    fronts,
                    args.concurrency,
                    args.rows_per_request,
                    Path(tmp),
                    args.measurement_ms,
                    args.table,
                    codes[code],
                    pinned,
                    kind == "ids",
                )
                results[key].append(served)
                shares = ", ".join(
                    f"{k} {v:.0f} ({served.switches_per_request[k]:.1f} switches)"
                    for k, v in sorted(served.cpu_us_per_request.items())
                )
                print(
                    f"round {r + 1} {variant_label(key, compared):<12} {served.rows_per_s:8.0f} rows/s  "
                    f"p99 {served.p99_ms:6.0f} ms  rows/forward {served.rows_per_forward:5.1f}  "
                    f"CPU us/request: {shares}" + ("" if served.stable else " (unstable)"),
                    flush=True,
                )
    # "one process": today's model, served by the baseline's code where one is compared,
    # unpinned where measured so, to clients that send text where they do
    today: Variant = (0, pins[0], BASELINE if compared else THIS, inputs[0])
    base = float(np.mean([s.rows_per_s for s in results[today]]))
    base_cpu = float(np.mean([sum(s.cpu_us_per_request.values()) for s in results[today]]))
    print(
        f"\nc={args.concurrency}, {args.rows_per_request} row(s) a request as {args.inputs}, "
        f"engine {args.table}, "
        f"means of {args.rounds} rounds:\n"
    )
    versus = f"one process{', baseline' if compared else ''}"
    print(
        f"| layout | rows/s (each round) | mean rows/s | vs {versus} | rows per forward "
        f"| server CPU us/request (by process) | CPU vs {versus} "
        "| context switches/request (by process) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for key in variants:
        runs = results[key]
        rate = float(np.mean([s.rows_per_s for s in runs]))
        roles = sorted({k for s in runs for k in s.cpu_us_per_request})
        by_role = {
            k: float(np.mean([s.cpu_us_per_request.get(k, 0.0) for s in runs])) for k in roles
        }
        cpu = sum(by_role.values())
        switches = {
            k: float(np.mean([s.switches_per_request.get(k, 0.0) for s in runs])) for k in roles
        }
        per_forward = float(np.mean([s.rows_per_forward for s in runs]))
        forwards = "-" if np.isnan(per_forward) else f"{per_forward:.1f}"  # the floor plans none
        print(
            f"| {variant_label(key, compared)} | {', '.join(f'{s.rows_per_s:.0f}' for s in runs)} "
            f"| {rate:.0f} "
            f"| {rate / base:.2f}x | {forwards} | {cpu:.0f} ({', '.join(f'{k} {v:.0f}' for k, v in by_role.items())}) "
            f"| {cpu / base_cpu:.2f}x "
            f"| {sum(switches.values()):.1f} ({', '.join(f'{k} {v:.1f}' for k, v in switches.items())}) |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
