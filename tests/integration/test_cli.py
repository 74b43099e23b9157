"""`jaxlm data show` prints what the model receives; `jaxlm bench` prints tokens/s and MFU, `jaxlm bench data`
the input pipeline's examples/s."""
import json

from conftest import austen_vocab, run_cli

from jaxlm import config as config_lib
from jaxlm.data.bench import bench_data
from jaxlm.data.pipeline import open_data


def test_data_show_prints_model_inputs(tiny_config):
    # a batch larger than either split, which training refuses: data show reads examples, not batches
    proc = run_cli("data", "show", tiny_config(), "--n", "5", "train.global_batch=100000", devices=1)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(records) == 5
    vocab = austen_vocab().read_text().splitlines()
    specials = {token: vocab.index(token) for token in ("[PAD]", "[CLS]", "[SEP]", "[MASK]")}
    chosen_total = masked_total = 0
    for record in records:
        ids, tokens = record["input_ids"], record["input_tokens"]
        assert [vocab[i] for i in ids] == tokens
        assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2
        assert len(ids) == len(record["segment_ids"]) == 64
        assert record["nsp_label"] in (0, 1)
        chosen = [p for p, w in zip(record["masked_positions"], record["masked_weights"]) if w > 0]
        assert chosen and all(0 < p < 64 for p in chosen)
        labels = [label for label, w in zip(record["masked_labels"], record["masked_weights"]) if w > 0]
        chosen_total += len(chosen)
        masked_total += sum(ids[p] == specials["[MASK]"] for p in chosen)
        assert all(label not in (specials["[PAD]"], specials["[CLS]"], specials["[SEP]"]) for label in labels)
    assert masked_total >= 0.6 * chosen_total


def test_bench_prints_throughput_and_profile(tiny_config, tmp_path):
    """After `--compile-only` into a compilation cache (as bench/gpu.py does before timing), the bench loads
    its step and state initialiser from the cache."""
    cache = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    compiled = run_cli("bench", tiny_config(), "--compile-only", "--json", devices=8, env_extra=cache)
    assert json.loads(compiled.stdout.splitlines()[-1])["cache"] == cache["JAX_COMPILATION_CACHE_DIR"]
    # no warm-up step: the step is compiled already (bench.warmup=0 once ended in an UnboundLocalError)
    proc = run_cli("bench", tiny_config(), "bench.steps=2", "bench.warmup=0", "bench.peak_flops_per_device=1e11",
                   "--json", "--profile", str(tmp_path / "trace"), devices=8,
                   env_extra=cache | {"JAX_DEBUG_LOG_MODULES": "jax._src.compiler"})
    assert "Persistent compilation cache hit for 'jit_train_step'" in proc.stderr
    assert "Persistent compilation cache hit for 'jit__lambda'" in proc.stderr  # the state's initialiser
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["tokens_per_s"] > 0 and row["devices"] == 8
    assert 0 < row["mfu"] < 1
    assert "tokens_per_s" in proc.stdout and "mfu" in proc.stdout
    profile = row["profile"]["ms_per_step"]
    assert all(profile[kind] > 0 for kind in ("matmuls", "attention", "norms and elementwise", "embedding and loss",
                                               "optimizer and metrics"))
    assert "op class" in proc.stdout and list((tmp_path / "trace").rglob("*.xplane.pb"))
    every_op = json.loads((tmp_path / "trace" / "ops.json").read_text())  # every op, beyond the ten printed
    assert len(every_op) > len(row["profile"]["top_ops"]) and "ops" not in row["profile"]
    assert every_op[:10] == row["profile"]["top_ops"]
    assert (tmp_path / "trace" / "step.hlo").read_text().startswith("HloModule jit_train_step")
    assert list(row["seconds"]) == ["setup", "compile", "steps", "profile"]
    assert all(seconds >= 0 for seconds in row["seconds"].values())
    assert row["seconds"]["compile"] == round(row["compile_s"], 1)


def test_bench_data_times_a_split_smaller_than_its_batch_whole(tiny_config):
    """It refused, asking for a smaller batch that no option could set; a train.global_batch larger than either
    split (which it does not use) was refused as train refuses it."""
    config = config_lib.load(tiny_config())
    row = bench_data(config, batches=1, batch_size=10 ** 6)
    assert row["batch"] == len(open_data(config)[1]) < 10 ** 6 and row["examples_per_s"] > 0
    huge = config_lib.load(tiny_config({"train": {"global_batch": 10 ** 6}}))
    assert bench_data(huge, batches=1, batch_size=8)["batch"] == 8


def test_bench_data_prints_examples_per_second(tiny_config, tmp_path):
    config = tiny_config()
    twin = tmp_path / "twin" / config.name  # the same name in another folder: once merged into one row
    twin.parent.mkdir()
    twin.write_text(config.read_text())
    per_core = run_cli("bench", "data", str(config), str(twin), "--batches", "2", "--json", devices=1)
    # 20 batches: long enough that the CPU time psutil reads (in 10 ms clock ticks) cannot round to nothing
    loader = run_cli("bench", "data", str(config), "--batches", "20", "--workers", "0,1", "--json", devices=1)
    rows = [json.loads(line) for proc in (per_core, loader) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [row["workers"] for row in rows] == ["thread", "thread", 0, 1]
    assert [row["config"] for row in rows[:2]] == [str(config), str(twin)]
    assert all(row["examples_per_s"] > 0 and row["batch"] == 256 and row["family"] == "bert" for row in rows)
    assert rows[0]["examples_per_s_core"] > 0
    assert all(0 < row["cores_used"] for row in rows[2:]), rows  # the worker's CPU counts with the trainer's
    assert "examples_per_s" in loader.stdout.splitlines()[0] and "cores_used" in loader.stdout.splitlines()[0]
