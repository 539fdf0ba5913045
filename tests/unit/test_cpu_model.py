"""The simulator's CPU model: each ceiling from the costs it is given, and the engine behind
them found by the project's own scheduler on a virtual clock."""

from __future__ import annotations

import pytest

from bench.cost_tables import linear_table
from bench.sim.cpu import CpuCosts, Layout, cpu_ceilings, predict

LENGTHS = [5, 9, 13, 20, 31, 45, 60, 90, 128, 200, 256] * 10
# us per request: Triton 300, a front 600, the owner 50; a front's serial time 1000
SPLIT = CpuCosts(
    {"triton": 300.0, "front": 600.0, "owner": 50.0}, serial_us=1000.0, in_series_us=50.0
)


def test_the_fronts_bound_until_the_cores_do():
    few = cpu_ceilings(SPLIT, cores=16, layout=Layout(fronts=4))
    assert few["fronts"] == pytest.approx(4000) and few["cores"] == pytest.approx(16 / 950e-6)
    many = predict(LENGTHS, None, SPLIT, 16, 1, Layout(fronts=32))
    assert many.bound == "cores" and many.rows_per_s == pytest.approx(16 / 950e-6)
    # the owner's one core bounds it once the rest is plentiful
    assert predict(LENGTHS, None, SPLIT, 256, 1, Layout(fronts=64)).bound == "owner"


def test_todays_instances_and_the_peer_pay_only_their_own_processes():
    one_process = CpuCosts({"triton": 300.0, "model": 700.0}, serial_us=900.0)
    assert cpu_ceilings(one_process, 16, Layout(instances=4))["instances"] == pytest.approx(
        4 / 900e-6
    )
    peer = CpuCosts({"triton": 300.0}, serial_us=0.0)
    limits = cpu_ceilings(peer, 16, Layout(peer=True))
    assert set(limits) == {"cores", "Triton's ceiling"} and limits["cores"] == pytest.approx(
        16 / 300e-6
    )


def test_a_slow_engine_bounds_the_rate_where_the_cpu_would_allow_more():
    # 2 ms a forward plus 10 us a token: at most ~ 64 rows per (2 + 64 x 0.6) ms, far below
    # what 16 cores of fronts allow
    slow = linear_table(2e-3, 10e-6, "slow")
    served = predict(LENGTHS, slow, SPLIT, 64, 1, Layout(fronts=48), clients=256)
    assert served.bound == "GPU" and served.rows_per_s < served.cpu_rows_per_s
    # its ceiling depends on the clients: with few, the planner has few rows to fill a forward
    few = predict(LENGTHS, slow, SPLIT, 64, 1, Layout(fronts=48), clients=8)
    assert few.rows_per_forward <= 8 < served.rows_per_forward
    assert few.rows_per_s < 0.8 * served.rows_per_s
    # nothing is served faster than full forwards of the shortest rows allow
    assert served.rows_per_s < 64 / (2e-3 + 64 * min(LENGTHS) * 10e-6)
    # a fast engine leaves the bound to the CPU: 8 fronts, 8,000 requests/s
    fast = predict(LENGTHS, linear_table(1e-5, 1e-8, "fast"), SPLIT, 64, 1, Layout(fronts=8))
    assert fast.bound == "fronts" and fast.rows_per_s == pytest.approx(8000)
    # where the owner's own core binds, its CPU in series with the forwards keeps the engine a
    # little under that core's ceiling, never over it
    owner = predict(LENGTHS, linear_table(1e-5, 1e-8, "fast"), SPLIT, 64, 1, Layout(fronts=48))
    assert 0.9 * owner.cpu_rows_per_s < owner.rows_per_s <= owner.cpu_rows_per_s
    # the engine's own ceiling, found by the planner: more rows a forward than one
    assert served.rows_per_forward > 4


def test_the_python_backends_floor_bounds_any_design_by_the_cores_it_takes():
    from bench.cpu_model import floor_bound

    data = {"floor_us": {"1": {"triton": 250.0, "model": 300.0}}}
    (line,) = floor_bound(data, cores=16, allowed=50_000.0, ours={False: 17_000.0})
    bound = 16 / 550e-6  # the cores, spent at 550 us a request: well under Triton's ceiling
    assert f"at most {bound:,.0f} one-row requests/s" in line
    assert f"{bound / 50_000:.0%} of what Triton's own cost allows" in line
    assert f"serves {17_000 / bound:.0%} of that bound" in line
    # on many cores Triton's own ceiling bounds the floor too
    (wide,) = floor_bound(data, cores=1024, allowed=55_000.0, ours={False: 17_000.0})
    assert "at most 55,000 one-row" in wide
    assert floor_bound({}, cores=16, allowed=50_000.0, ours={False: 17_000.0}) == []
    # with 64-row requests measured too: their rows/s beside
    data["floor_us"]["64"] = {"triton": 500.0, "model": 7500.0}
    (both,) = floor_bound(data, cores=16, allowed=50_000.0, ours={False: 17_000.0})
    assert f"in 64-row requests, {64 * 16 / 8000e-6:,.0f} rows/s" in both
    # the pinned floor, where measured, in a bullet of its own after the unpinned one
    data["floor_pinned_us"] = {"1": {"triton": 200.0, "model": 200.0}}
    unpinned, pinned = floor_bound(data, cores=16, allowed=50_000.0, ours={False: 17_000.0})
    assert unpinned == both and "pinned to a core" in pinned and "pinned" not in unpinned
    assert f"at most {16 / 400e-6:,.0f} one-row requests/s" in pinned
    # compared with the unpinned layouts until pinned ones are predicted, then with those
    assert f"above, unpinned, serves {17_000 / (16 / 400e-6):.0%}" in pinned
    _, pinned = floor_bound(data, 16, 50_000.0, ours={False: 17_000.0, True: 20_000.0})
    assert f"best pinned layout above serves {20_000 / (16 / 400e-6):.0%}" in pinned


def point(fronts: int, pinned: bool, rows_per_s: float, front_us: float) -> dict:
    return {
        "round": 1,
        "fronts": fronts,
        "pinned": pinned,
        "rows": 1,
        "clients": 64,
        "rows_per_s": rows_per_s,
        "cpu_us_per_request": {"triton": 300.0, "front": front_us, "owner": 100.0},
        "client_us_per_request": 200.0,
    }


def test_pinned_runs_make_costs_of_their_own():
    from bench.cpu_model import costs_of, pins_of, runs_of

    # points measured before pinning existed carry no "pinned": they were unpinned
    old = point(1, False, 1000.0, 700.0)
    del old["pinned"]
    points = [old, point(1, True, 1250.0, 500.0)]
    assert pins_of(points) == [False, True] and pins_of([old]) == [False]
    assert runs_of(points, 1, 1) == [old]
    unpinned, pinned = (costs_of(points, 1, 1, p) for p in (False, True))
    assert unpinned.of("front") == 700.0 and unpinned.serial_us == pytest.approx(1000.0)
    assert pinned.of("front") == 500.0 and pinned.serial_us == pytest.approx(800.0)


def test_the_owners_share_in_series_is_checked_both_ways():
    from bench.cpu_model import owner_in_series

    runs = {
        "rows_per_s": [10_000.0, 12_000.0],
        "owner_us": [40.0, 40.0],
        "scheduler_us": [10.0, 10.0],
    }
    data = {
        "owner_over_table": {
            "table": "table:a30",
            "sleep_overshoot_us": 90.0,
            "clients": {"1": 256, "64": 16},
            "runs": {
                "1": runs,
                "64": {**runs, "owner_us": [600.0] * 2, "scheduler_us": [300.0] * 2},
            },
        }
    }

    def row_of_one() -> list[str]:
        text = owner_in_series(data, LENGTHS)
        (one,) = [line for line in text.splitlines() if line.startswith("| 1 |")]
        return [c.strip() for c in one.split("|")[1:-1]]

    def figure(cell: str) -> float:
        return float(cell.split(" (")[0].replace(",", ""))

    cells = row_of_one()
    assert cells[:5] == ["1", "256", "40 (10)", "10,000, 12,000", "11,000"]
    # each prediction over what it predicts: in line over the served mean
    in_line = figure(cells[5])
    assert cells[5].endswith(f"({in_line / 11_000:.2f})")
    assert cells[6] == "not measured" and cells[7] == ""
    # less in series with the forwards: more served
    overlapped = figure(cells[8])
    assert in_line < overlapped
    assert owner_in_series({}, LENGTHS) == ""
    # with the overlap measured beside: its rounds, their mean over the in-line mean, and the
    # overlapped prediction over the overlapped mean
    runs["overlap_rows_per_s"] = [12_100.0, 14_300.0]
    cells = row_of_one()
    assert cells[6:8] == ["12,100, 14,300", "13,200 (1.20x)"]
    assert cells[8] == f"{overlapped:,.0f} ({overlapped / 13_200:.2f})"


def test_the_owners_cost_in_series_is_the_one_spent_at_the_nodes_load_where_measured():
    from bench.cpu_model import node_costs

    data = {
        "points": [point(1, False, 1000.0, 700.0), point(2, False, 1800.0, 720.0)],
        "owner_alone_us": {"1": 40.0},
        "owner_alone_scheduler_us": {"1": 20.0},
    }
    split = Layout(fronts=4)
    # over the zero-time engine only: its scheduler thread's cost, all of it without the overlap
    assert node_costs(data, split, 1).in_series_us == 20.0
    assert node_costs(data, split, 1, overlap=False).in_series_us == 40.0
    runs = {"rows_per_s": [1.0], "owner_us": [30.0, 32.0], "scheduler_us": [10.0, 12.0]}
    data["owner_over_table"] = {"runs": {"1": runs}}
    # measured over a GPU's table at the node's clients too: those, the load the check ran at
    assert node_costs(data, split, 1).in_series_us == 11.0
    assert node_costs(data, split, 1, overlap=False).in_series_us == 31.0
    assert node_costs(data, split, 1, series_at_load=False).in_series_us == 20.0
    # the owner's whole cost, which bounds it on its core, stays the one alone either way
    assert node_costs(data, split, 1).of("owner") == 40.0
    assert node_costs(data, split, 1).of("front") == 720.0  # more than 2 fronts cost as 2 did


def test_token_id_clients_are_reported_beside_text_clients_and_the_peer():
    from bench.cpu_model import token_id_clients

    def at(fronts, us: dict[str, float], rows_per_s: float) -> dict:
        return {**point(0, False, rows_per_s, 0.0), "fronts": fronts, "cpu_us_per_request": us}

    text = {"triton": 250.0, "front": 450.0, "owner": 60.0}
    ids = {"triton": 250.0, "front": 250.0, "owner": 60.0}
    data = {
        "cores": 2,
        "points": [at(1, text, 1500.0), at(2, text, 2500.0)],
        "owner_alone_us": {"1": 40.0},
        "owner_alone_scheduler_us": {"1": 20.0},
    }
    assert token_id_clients(LENGTHS, data, 16) == ""  # before measure-ids
    data["token_id_points"] = [
        at(1, ids, 1800.0),
        at(2, ids, 3000.0),
        at("floor", {"triton": 200.0, "model": 100.0}, 4000.0),
    ]
    text_out = token_id_clients(LENGTHS, data, 16)
    lines = text_out.splitlines()
    measured, predicted = [line for line in lines if line.startswith("| 2 fronts |")]
    assert measured == "| 2 fronts | 3000 | 560 (front 250, owner 60, triton 250) |"
    # predicted beside served here, from the token-id runs' own costs: 2 cores, 560 us each
    # request (the client's 200 too), or the two fronts' serial time (1,800 requests/s each)
    assert predicted.startswith(f"| 2 fronts | 1 | 64 | 3000 | 3000 | {2 / 760e-6:.0f} |")
    assert "| Python-backend floor | 4000 | 300 (model 100, triton 200) |" in text_out
    (a100,) = [line for line in text_out.splitlines() if line.startswith("| A100 |")]
    cells = [c.strip() for c in a100.split("|")[1:-1]]
    number = lambda cell: float(cell.split(" ")[0].replace(",", ""))  # noqa: E731
    # fronts that do not tokenize carry more of the same clients than fronts that do
    assert number(cells[3]) > number(cells[2])
    # Triton's cost allows 16 cores / 250 us, above its own ceiling; the floor's 300 us too
    assert cells[5].endswith("of 55,000") and cells[8] == "53,333 (97%)"
