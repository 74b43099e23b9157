"""`jaxlm bench data`: repeated runs of each setting give the median run and the range of all; cores_used counts
the workers' CPU time."""
import subprocess
import sys

import psutil

from jaxlm.data.bench import process_tree_cpu_s, format_data_table, median_rows


def run(config: str, workers, rate: float) -> dict:
    return {"config": config, "family": "bert", "layout": "nsp_pairs", "seq_len": 128, "batch": 256,
            "workers": workers, "examples_per_s": rate, "ms_per_batch": 256 / rate * 1e3}


def test_median_rows_keep_the_median_run_of_each_setting_and_the_range():
    runs = [run("a", 1, 30.0), run("a", 2, 50.0), run("a", 1, 10.0), run("a", 2, 70.0), run("a", 1, 20.0),
            run("a", 2, 60.0), run("b", 1, 5.0)]
    rows = median_rows(runs)
    assert [(r["config"], r["workers"], r["examples_per_s"]) for r in rows] == [("a", 1, 20.0), ("a", 2, 60.0),
                                                                                 ("b", 1, 5.0)]
    assert rows[0]["ms_per_batch"] == 256 / 20.0 * 1e3
    assert [r.get("examples_per_s_range") for r in rows] == ["10-30", "50-70", None]
    table = format_data_table(rows).splitlines()
    assert "examples_per_s_range" in table[0] and "10-30" in table[1] and table[3].split()[7] == "-"


def test_cores_used_counts_the_cpu_time_of_started_processes():
    """`bench data --workers` reads the trainer's CPU time with its workers': a child's counts while it lives."""
    busy = "import time\nwhile time.process_time() < 0.5: pass\nprint('done', flush=True)\ntime.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", busy], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "done"
        # against this process's own time: a child of an earlier test that ends meanwhile takes its time away
        own = psutil.Process().cpu_times()
        assert process_tree_cpu_s() - (own.user + own.system) >= 0.45  # /proc counts in clock ticks
    finally:
        child.kill()
        child.wait()
