"""Columnar, idempotent ingest and series reads on both backends (real uvicorn server)."""

from __future__ import annotations

import base64
import io
import json
import math
import uuid
from array import array

import httpx
import pandas as pd
import pytest


@pytest.fixture
def run_url(server: str, project: str) -> str:
    run_id = uuid.uuid4()
    resp = httpx.put(f"{server}/api/v1/runs/{run_id}", json={"project": project})
    assert resp.status_code == 201
    return f"{server}/api/v1/runs/{run_id}"


def post(run_url: str, body: object) -> httpx.Response:
    return httpx.post(f"{run_url}/metrics", json=body, timeout=30)


def post_raw(run_url: str, raw: str | bytes) -> httpx.Response:
    return httpx.post(
        f"{run_url}/metrics", content=raw, headers={"content-type": "application/json"}, timeout=30
    )


def b64(typecode: str, items: list[float] | range) -> str:
    """A column as base64 of its little-endian bytes (``q``: int64, ``d``: float64)."""
    return base64.b64encode(array(typecode, items).tobytes()).decode()


def series(run_url: str, **params: object) -> dict[str, dict]:
    resp = httpx.get(f"{run_url}/metrics", params=params, timeout=30)
    assert resp.status_code == 200, resp.text
    return {s["key"]: s for s in resp.json()["series"]}


def test_same_batch_twice_is_stored_once(run_url: str) -> None:
    batch = {"steps": [0, 1, 2], "values": {"loss": [3.0, 2.5, 2.0], "eta": [0.1, None, 0.3]}}
    assert post(run_url, batch).json() == {"accepted": 5, "duplicates": 0}
    assert post(run_url, batch).json() == {"accepted": 0, "duplicates": 5}
    got = series(run_url)
    assert got["loss"]["steps"] == [0, 1, 2]
    assert got["eta"]["steps"] == [0, 2]
    run = httpx.get(run_url).json()
    assert run["n_points"] == 5 and run["last_step"] == 2


def test_overlapping_batches_keep_first_value(run_url: str) -> None:
    post(run_url, {"steps": [0, 1, 2, 3], "values": {"loss": [4.0, 3.0, 2.0, 1.0]}})
    second = post(run_url, {"steps": [2, 3, 4, 5], "values": {"loss": [9.0, 9.0, 0.5, 0.25]}})
    assert second.json() == {"accepted": 2, "duplicates": 2}
    assert series(run_url)["loss"]["values"] == [4.0, 3.0, 2.0, 1.0, 0.5, 0.25]


def test_nan_and_inf_round_trip_as_literals_and_strings(run_url: str) -> None:
    # The bare literals Python's json module emits...
    raw = json.dumps({"steps": [1, 2, 3], "values": {"loss": [math.nan, math.inf, -math.inf]}})
    assert "NaN" in raw and post_raw(run_url, raw).status_code == 200
    # ...and the string spelling.
    strings = {"steps": [4, 5, 6], "values": {"loss": ["NaN", "Infinity", "-Infinity"]}}
    assert post(run_url, strings).status_code == 200
    got = series(run_url)["loss"]
    assert got["values"] == ["NaN", "Infinity", "-Infinity"] * 2
    csv = httpx.get(f"{run_url}/metrics.csv").text
    frame = pd.read_csv(io.StringIO(csv))
    assert math.isnan(frame["value"][0]) and frame["value"][1] == math.inf
    assert frame["value"][2] == -math.inf and frame["value"][3] != 0.0


def test_wall_time_round_trip(run_url: str) -> None:
    post(run_url, {"steps": [1, 2], "wall_time": [1700000000.5, None], "values": {"loss": [1, 2]}})
    got = series(run_url)["loss"]
    assert got["wall_time"] == [1700000000.5, None]


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (
            {"steps": [1, 2], "values": {"loss": [1.0]}},
            422,
            "values.loss has 1 items but steps has 2",
        ),
        ({"steps": [1, -2], "values": {"loss": [1.0, 2.0]}}, 422, "steps[1]"),
        ({"steps": [1, 2.5], "values": {"loss": [1.0, 2.0]}}, 422, "steps[1]"),
        ({"steps": [1, "2"], "values": {"loss": [1.0, 2.0]}}, 422, "steps[1]"),
        ({"steps": [1, 2], "values": {"loss": [1.0, "abc"]}}, 422, "values.loss: item 1"),
        ({"steps": [1, 2], "values": {"loss": [1.0, True]}}, 422, "values.loss: item 1"),
        ({"steps": [1], "values": {"bad key!": [1.0]}}, 422,
         "values: key 'bad key!': not valid: a metric name is 1-200 characters from A-Z a-z "
         "0-9 _ . / - (e.g. 'loss' or 'eval/loss')"),
        ({"steps": [1], "values": {"x" * 201: [1.0]}}, 422, "key"),
        ({"steps": [1], "values": {}}, 422, "at least one metric key"),
        ({"steps": [1], "wall_time": [1.0, 2.0], "values": {"a": [1]}}, 422, "wall_time has 2"),
        ({"values": {"a": [1]}}, 422, "steps: Field required"),
        ({"steps": [1], "values": {"a": [1]}, "extra": 1}, 422, "extra"),
        ([1, 2, 3], 422, "body"),
        # A bad entry deep in a long array is named by its index, in whichever key it is.
        ({"steps": list(range(100)),
          "values": {"loss": [1.0] * 100, "eta": [0.1] * 57 + ["0.1"] + [0.1] * 42}},
         422, "values.eta: item 57"),
        ({"steps": [1, 2, 3], "wall_time": [1.0, 2.0, "3"], "values": {"a": [1, 2, 3]}},
         422, "wall_time[2]"),
        ({"steps": [1, 2, 3], "wall_time": [1.0, 2.0, "NaN"], "values": {"a": [1, 2, 3]}},
         422, "wall_time[2]"),
        ({"steps": ["Infinity"], "values": {"a": [1]}}, 422, "steps[0]"),
        ({"steps": [1, 2], "values": {"a": [1, None], "b": [None, "nan"]}}, 422,
         "values.b: item 1"),
        # Base64 columns: checked as strictly as arrays, and named the same way.
        ({"steps": b64("q", [1, -2]), "values": {"a": [1, 2]}}, 422,
         "steps: item 1 must be between 0 and 2**62, got -2"),
        ({"steps": "AQ", "values": {"a": [1]}}, 422, "steps: must be an array or base64"),
        ({"steps": [1, 2], "values": {"a": b64("d", [1.0])}}, 422,
         "values.a has 1 items but steps has 2"),
        ({"steps": [1], "values": {"a": "AAAA"}}, 422,
         "values.a: base64 text decodes to 3 bytes, not a whole number of 8-byte float64"),
        ({"steps": [1], "values": {"a": "!!!!"}}, 422, "values.a: must be an array or base64"),
        ({"steps": [1, 2], "wall_time": b64("d", [1.0, math.inf]), "values": {"a": [1, 2]}},
         422, "wall_time: item 1 must be a finite number or NaN, got inf"),
    ],
)
def test_bad_input_names_the_field_and_stores_nothing(
    run_url: str, body: object, status: int, needle: str
) -> None:
    post(run_url, {"steps": [0], "values": {"loss": [5.0]}})
    resp = post(run_url, body)
    assert resp.status_code == status, resp.text
    assert resp.json()["error_code"] == "invalid_request"
    assert needle in resp.json()["message"], resp.json()["message"]
    got = series(run_url)
    assert list(got) == ["loss"] and got["loss"]["values"] == [5.0]


def test_base64_columns_store_what_the_arrays_would(run_url: str) -> None:
    """The client hook's encoding: every float64 arrives (NaN, infinities, a subnormal, 17
    digits), a NaN wall time is "none", and a base64 column mixes with an array
    column that has gaps."""
    values = [0.1, -0.0, math.nan, math.inf, -math.inf, 1 / 3, 5e-324]
    walls = [1.7e9 + s / 7 for s in range(7)]
    walls[4] = math.nan
    body = {"steps": b64("q", range(7)), "wall_time": b64("d", walls),
            "values": {"v": b64("d", values), "sparse": [None, 2.5, None, None, None, None, 1]}}
    assert post(run_url, body).json() == {"accepted": 9, "duplicates": 0}
    assert post(run_url, body).json() == {"accepted": 0, "duplicates": 9}  # idempotent too
    got = series(run_url)
    assert got["v"]["steps"] == list(range(7)) and got["sparse"]["steps"] == [1, 6]
    stored = got["v"]["values"]
    assert stored[:2] == [0.1, 0.0]  # (-0.0: SQLite stores a zero, as for an array's -0.0)
    assert stored[2:5] == ["NaN", "Infinity", "-Infinity"] and stored[5:] == values[5:]
    assert got["v"]["wall_time"] == [*walls[:4], None, *walls[5:]]


def test_run_creation_says_base64_columns_are_read(server: str, project: str) -> None:
    resp = httpx.put(f"{server}/api/v1/runs/{uuid.uuid4()}", json={"project": project})
    assert resp.headers["curvecast-ingest-encodings"] == "base64"


def test_malformed_json_is_400(run_url: str) -> None:
    resp = post_raw(run_url, '{"steps": [1, 2')
    assert resp.status_code == 400
    assert resp.json()["error_code"] == "malformed_json"


def test_batch_is_all_or_nothing(run_url: str) -> None:
    # Valid keys and one bad value in another key: nothing of the batch is stored.
    resp = post(run_url, {"steps": [1, 2, 3], "values": {"loss": [1, 2, 3], "eta": [1, {}, 3]}})
    assert resp.status_code == 422
    assert httpx.get(f"{run_url}/metrics").json()["series"] == []


def test_too_many_points_and_too_large_body(run_url: str) -> None:
    n = 100_001
    resp = post(run_url, {"steps": list(range(n)), "values": {"loss": [1.0] * n}})
    assert resp.status_code == 413
    assert resp.json()["error_code"] == "too_many_points"
    huge = b'{"steps": [' + b"1," * (9 * 1024 * 1024) + b'1], "values": {"a": [1]}}'
    resp = post_raw(run_url, huge)
    assert resp.status_code == 413
    assert resp.json()["error_code"] == "payload_too_large"
    assert httpx.get(f"{run_url}/metrics").json()["series"] == []


def test_metrics_for_unknown_run_is_404(server: str) -> None:
    resp = httpx.post(
        f"{server}/api/v1/runs/{uuid.uuid4()}/metrics", json={"steps": [1], "values": {"a": [1]}}
    )
    assert resp.status_code == 404
    assert resp.json()["error_code"] == "run_not_found"
    assert "PUT" in resp.json()["message"]


def test_downsampling_keeps_a_planted_spike(run_url: str) -> None:
    n = 20_000
    values = [2.0 + 1.0 / math.sqrt(i + 10) for i in range(n)]
    values[12_345] = 50.0
    values[7_777] = -3.0
    post(run_url, {"steps": list(range(n)), "values": {"loss": values}})
    got = series(run_url, max_points=200)["loss"]
    assert got["downsampled"] is True and got["total_points"] == n
    assert len(got["steps"]) <= 200
    assert max(got["max"]) == 50.0 and min(got["min"]) == -3.0
    # The bucket holding the spike spans its step.
    idx = got["max"].index(50.0)
    assert got["steps"][idx - 1] < 12_345 <= got["steps"][idx]
    assert sum(got["count"]) == n
    # Range queries at full resolution.
    window = series(run_url, start=12_340, end=12_350)["loss"]
    assert window["steps"] == list(range(12_340, 12_351))
    assert window["values"][5] == 50.0 and window["downsampled"] is False


def test_keys_filter_and_bad_key_query(run_url: str) -> None:
    post(run_url, {"steps": [1], "values": {"a": [1], "b": [2], "c/d": [3]}})
    assert list(series(run_url, keys="a,c/d")) == ["a", "c/d"]
    # Repeated, as most HTTP clients send a list (only the last one was read, silently).
    assert list(series(run_url, keys=["a", "c/d"])) == ["a", "c/d"]
    assert list(series(run_url, keys=["a,b", "c/d"])) == ["a", "b", "c/d"]
    export = httpx.get(f"{run_url}/metrics.csv", params={"keys": ["a", "c/d"]}).text
    assert {line.split(",")[0] for line in export.splitlines()[1:]} == {"a", "c/d"}
    # A key the run does not have: 404 naming the keys it has, as forecast?key= answers.
    missing = httpx.get(f"{run_url}/metrics", params={"keys": "zzz"})
    assert missing.status_code == 404 and "the keys it has: a, b, c/d" in missing.json()["message"]
    bad = httpx.get(f"{run_url}/metrics", params={"keys": "a,b c"})
    assert bad.status_code == 422 and "keys[1]" in bad.json()["message"]


def test_repeated_step_within_a_batch_keeps_the_first(run_url: str) -> None:
    resp = post(run_url, {"steps": [1, 1, 2], "values": {"loss": [1.0, 9.0, 2.0]}})
    assert resp.json() == {"accepted": 2, "duplicates": 1}
    assert series(run_url)["loss"]["values"] == [1.0, 2.0]


def test_duplicate_fallback_keeps_nan_and_wall_time(run_url: str) -> None:
    first = {"steps": [1, 2], "wall_time": [10.0, None], "values": {"loss": [1.0, "NaN"]}}
    post(run_url, first)
    # Overlaps step 2 (forces the conflict-tolerant path) and adds NaN/wall-time rows.
    second = {
        "steps": [2, 3, 4],
        "wall_time": [99.0, 30.0, None],
        "values": {"loss": [5.0, "NaN", 4.0]},
    }
    assert post(run_url, second).json() == {"accepted": 2, "duplicates": 1}
    got = series(run_url)["loss"]
    assert got["values"] == [1.0, "NaN", "NaN", 4.0]
    assert got["wall_time"] == [10.0, None, 30.0, None]


def test_sparse_series_is_not_bucketed(run_url: str) -> None:
    post(run_url, {"steps": [0, 500_000, 1_000_000], "values": {"eval_loss": [3.0, 2.5, 2.25]}})
    got = series(run_url, max_points=10)["eval_loss"]
    assert got["downsampled"] is False
    assert got["steps"] == [0, 500_000, 1_000_000] and got["total_points"] == 3


@pytest.mark.parametrize(("n", "start", "end", "max_points"), [
    (60_000, 1_234, 45_678, 300),  # 147 steps a bucket: from the rollups, raw edges
    (6_000, 17, 5_990, 2_000),  # 3 steps a bucket: aggregated from the raw points
], ids=["rollups", "raw"])
def test_downsampled_reads_match_brute_force(run_url: str, n: int, start: int, end: int,
                                             max_points: int) -> None:
    """Downsampled reads (from the rollups plus raw edges, or from the raw points when a bucket
    is narrower than a rollup block) must equal what a brute force over the raw points gives,
    including after overlapping (duplicate) batches and in buckets whose values are all NaN."""
    import numpy as np

    rng = np.random.default_rng(7)
    values = rng.normal(3.0, 1.0, n)
    values[rng.choice(n, 50, replace=False)] = np.nan
    values[start + 30 : start + 45] = np.nan  # whole buckets of NaN
    steps = np.arange(n)
    batch = n // 3
    for lo in range(0, n, batch):  # batches overlapping by a quarter of one
        sl = slice(max(0, lo - batch // 4), lo + batch)
        body = {"steps": steps[sl].tolist(),
                "values": {"loss": ["NaN" if np.isnan(v) else v for v in values[sl]]}}
        assert post(run_url, body).status_code == 200
    got = series(run_url, start=start, end=end, max_points=max_points)["loss"]
    assert got["downsampled"] is True
    assert len(got["steps"]) <= max_points
    assert got["total_points"] == sum(got["count"]) == end - start + 1
    window = values[start : end + 1]
    finite_max = [v for v in got["max"] if v != "NaN"]
    finite_min = [v for v in got["min"] if v != "NaN"]
    assert max(finite_max) == np.nanmax(window) and min(finite_min) == np.nanmin(window)

    def same(answer: object, expected: float) -> bool:
        return answer == "NaN" if np.isnan(expected) else answer == expected

    # Every bucket: its last point is the raw point at its last step; extremes and counts agree.
    edges = [start - 1, *got["steps"]]
    all_nan = 0
    for i, last in enumerate(got["steps"]):
        chunk = values[edges[i] + 1 : last + 1]
        assert got["count"][i] == len(chunk)
        nan_only = bool(np.isnan(chunk).all())
        all_nan += nan_only
        assert same(got["max"][i], np.nan if nan_only else np.nanmax(chunk))
        assert same(got["min"][i], np.nan if nan_only else np.nanmin(chunk))
        assert same(got["values"][i], values[last])
    assert all_nan >= (1 if max_points == 2_000 else 0)


def test_nulls_nan_strings_and_unsorted_steps_in_one_batch(run_url: str) -> None:
    """Each column on its own: a null is no point, NaN (literal or string) is a point, a step
    repeated within the batch keeps its first value, and steps may come in any order."""
    raw = ('{"steps": [5, 3, 5, 4], "values": {"loss": [1.0, null, 9.0, "NaN"],'
           ' "acc": [null, 0.5, null, Infinity], "lr": [-Infinity, NaN, 2.0, null]}}')
    # loss: 5 -> 1.0 (9.0 repeats step 5), 4 -> NaN; acc: 3, 4; lr: 5, 3 (2.0 repeats step 5).
    assert post_raw(run_url, raw).json() == {"accepted": 6, "duplicates": 2}
    got = series(run_url)
    assert (got["loss"]["steps"], got["loss"]["values"]) == ([4, 5], ["NaN", 1.0])
    assert (got["acc"]["steps"], got["acc"]["values"]) == ([3, 4], [0.5, "Infinity"])
    assert (got["lr"]["steps"], got["lr"]["values"]) == ([3, 5], ["NaN", "-Infinity"])
    run = httpx.get(run_url).json()
    assert run["n_points"] == 6 and run["last_step"] == 5
    # Sent again in another order, with the gaps filled: only the gaps are new.
    again = ('{"steps": [4, 5, 3], "values": {"loss": [0.0, 0.0, 0.0], "acc": [0.0, 0.0, 0.0],'
             ' "lr": [0.0, 0.0, 0.0]}}')
    assert post_raw(run_url, again).json() == {"accepted": 3, "duplicates": 6}
    got = series(run_url)
    assert got["loss"]["values"] == [0.0, "NaN", 1.0]  # step 3 was new
    assert got["acc"]["values"] == [0.5, "Infinity", 0.0]  # step 5 was new
    assert got["lr"]["values"] == ["NaN", 0.0, "-Infinity"]  # step 4 was new
    assert httpx.get(run_url).json()["n_points"] == 9


def test_numbers_beyond_a_double_and_literals_python_writes(run_url: str) -> None:
    # 1e400 is what a float overflows to in Python's json: +Infinity, as a value.
    raw = '{"steps": [1, 2, 3], "values": {"loss": [1e400, -1e400, NaN]}}'
    assert post_raw(run_url, raw).json() == {"accepted": 3, "duplicates": 0}
    assert series(run_url)["loss"]["values"] == ["Infinity", "-Infinity", "NaN"]
    # ...but never as a step or a wall time.
    too_big = post_raw(run_url, '{"steps": [123456789012345678901234567890], "values": {"a": [1]}}')
    assert too_big.status_code == 422 and "steps[0]" in too_big.json()["message"]


def test_a_body_in_utf16_decodes_as_before(run_url: str) -> None:
    # The JSON standard library detects UTF-16 and UTF-32; the faster decoder only reads
    # UTF-8 and hands such bodies over.
    body = json.dumps({"steps": [1], "values": {"loss": [2.5]}}).encode("utf-16")
    assert post_raw(run_url, body).json() == {"accepted": 1, "duplicates": 0}
    assert series(run_url)["loss"]["values"] == [2.5]


def test_an_all_null_batch_stores_nothing_and_records_progress(run_url: str) -> None:
    assert post(run_url, {"steps": [7], "values": {"loss": [None]}}).json() == {
        "accepted": 0, "duplicates": 0}
    run = httpx.get(run_url).json()
    assert run["n_points"] == 0 and run["last_step"] == 7
    assert series(run_url)["loss"]["total_points"] == 0


def test_a_key_first_seen_in_a_later_batch(run_url: str) -> None:
    post(run_url, {"steps": [1, 2], "values": {"loss": [2.0, 1.5]}})
    second = post(run_url, {"steps": [2, 3], "values": {"loss": [9.0, 1.0], "eval": [3.0, 2.0]}})
    assert second.json() == {"accepted": 3, "duplicates": 1}
    got = series(run_url)
    assert got["loss"]["values"] == [2.0, 1.5, 1.0] and got["eval"]["steps"] == [2, 3]


def test_a_run_deleted_and_created_again_stores_its_points_again(server: str, project: str
                                                                  ) -> None:
    run_url = f"{server}/api/v1/runs/{uuid.uuid4()}"
    batch = {"steps": [0, 1], "values": {"loss": [3.0, 2.0]}}
    assert httpx.put(run_url, json={"project": project}).status_code == 201
    assert post(run_url, batch).json() == {"accepted": 2, "duplicates": 0}
    assert httpx.delete(run_url, timeout=30).status_code == 204
    assert post(run_url, batch).status_code == 404
    assert httpx.put(run_url, json={"project": project}).status_code == 201
    batch["values"]["loss"] = [5.0, 4.0]
    assert post(run_url, batch).json() == {"accepted": 2, "duplicates": 0}
    assert series(run_url)["loss"]["values"] == [5.0, 4.0]
    assert httpx.get(run_url).json()["n_points"] == 2


def test_large_batches_past_the_stored_steps_and_overlapping_ones(run_url: str) -> None:
    """A batch of thousands of points all past their series' newest stored step (PostgreSQL
    writes it with COPY) stores every point with its NaN and missing wall times; the next,
    overlapping by ten steps, keeps the stored values and counts the ten as duplicates."""
    assert post(run_url, {"steps": list(range(10)), "values": {"loss": [9.0] * 10}}).json() == {
        "accepted": 10, "duplicates": 0}
    steps = list(range(10, 6010))
    loss: list[object] = [3.0 + i / 1e4 for i in range(6000)]
    loss[5] = "NaN"
    walls: list[float | None] = [100.0 + i for i in range(6000)]
    walls[7] = None
    first = {"steps": steps, "wall_time": walls, "values": {"loss": loss, "acc": [0.5] * 6000}}
    assert post(run_url, first).json() == {"accepted": 12_000, "duplicates": 0}
    second = {"steps": list(range(6000, 12_000)),
              "values": {"loss": [1.0] * 6000, "acc": [0.25] * 6000}}
    assert post(run_url, second).json() == {"accepted": 11_980, "duplicates": 20}
    got = series(run_url)
    assert got["loss"]["steps"] == list(range(12_000))
    assert got["loss"]["values"][10:6010] == loss  # the overlap kept the first values
    assert got["loss"]["values"][6010:] == [1.0] * 5990
    assert got["loss"]["wall_time"][10 + 7] is None and got["loss"]["wall_time"][10] == 100.0
    assert got["acc"]["steps"] == list(range(10, 12_000))
    assert httpx.get(run_url).json()["n_points"] == 10 + 12_000 + 11_980
    # The rollups hold every point once: a downsampled read counts them.
    down = series(run_url, max_points=50)["loss"]
    assert down["downsampled"] is True and sum(down["count"]) == 12_000
