"""The GPU check's entry point, on the CPU and the tiny model: it parses its options, runs the
sections asked for, and writes its results and summary (the check itself runs on a GPU machine,
never in CI: bench/gpu_check.sh)."""

from __future__ import annotations

import json

from bench import gpu_bench


def test_the_gpu_check_runs_the_sections_asked_for_on_the_tiny_model_and_writes_its_files(tmp_path) -> None:
    code = gpu_bench.main(["--device", "cpu", "--tiny", "--no-cpu-copy", "--tokens", "4", "--out", str(tmp_path),
                           "--sections", "machine,sampler_parity,kv_bytes"])
    results = json.loads((tmp_path / "gpu_results.json").read_text())
    assert code == 0 and results["machine"]["device"] == "cpu"
    assert all(results[name]["passed"] for name in ("sampler_parity", "kv_bytes"))
    assert "greedy_parity" not in results and "decode_bound" not in results
    summary = (tmp_path / "gpu_summary.md").read_text()
    assert "| kv_bytes | passed |" in summary and "greedy_parity" not in summary
