"""bench/bench_library.py (issue 52, item 4) runs both sides on the CPU: synclib's stream and
transformers' generate_batch on the same prompts, every reply accounted for."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.long
def test_library_benchmark_runs_both_sides_on_the_same_prompts(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import bench_library
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path / "library.json"
    assert bench_library.main(["--prompts", "4", "--max-new-tokens", "4", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    ours, lib = d["results"]["synclib"], d["results"]["library"]
    assert "error" not in lib, lib
    assert ours["replies"] == lib["replies"] == d["settings"]["prompts"] == 4
    assert 4 <= ours["tokens"] <= 16 and 1 <= lib["tokens"] <= 16  # at most max_new_tokens each
    assert lib["states_shape"][0] == 4 and set(ours["seconds"]) == {"join", "decode"}
