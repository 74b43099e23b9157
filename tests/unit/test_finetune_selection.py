"""What `jaxlm finetune` keeps and feeds: the best dev scores and the evaluations since they improved (early
stopping's count), and each epoch's order of the training rows."""
import math
import types

import numpy as np

from jaxlm.finetune.features import Rows
from jaxlm.finetune.run import BestDev, train_batch


def test_the_best_dev_scores_and_the_evaluations_since():
    best = BestDev("accuracy", scores={"accuracy": 0.9})
    assert best.step is None  # the untrained model's scores stand until the first evaluation, which replaces them
    offered = [best.offer(step, {"accuracy": value}) for step, value in [(10, 0.5), (20, 0.7), (30, 0.6), (40, 0.7)]]
    assert offered == [True, True, False, False]  # a tie does not improve
    assert (best.step, best.scores, best.value, best.stale) == (20, {"accuracy": 0.7}, 0.7, 2)
    assert best.offer(50, {"accuracy": 0.8}) and best.stale == 0


def test_lower_is_better_and_nan_is_the_worst():
    """finetune.metric=mse once kept the checkpoint of the highest error."""
    mse = BestDev("mse", scores={"mse": 3.0})
    assert [mse.offer(s, {"mse": v}) for s, v in [(1, 2.0), (2, 2.5), (3, 1.5)]] == [True, False, True]
    assert (mse.step, mse.value) == (3, -1.5)
    pearson = BestDev("pearson", scores={})
    assert pearson.offer(1, {"pearson": math.nan}) and pearson.value == -math.inf
    assert not pearson.offer(2, {"pearson": math.nan})
    assert pearson.offer(3, {"pearson": -0.2}) and pearson.step == 3


def test_each_epoch_is_a_permutation_of_the_rows_drawn_from_seed_and_epoch():
    rows = Rows({"input_ids": np.arange(10)[:, None], "label_weights": np.ones(10)}, np.arange(10), [None] * 10)

    def plan(seed):
        return types.SimpleNamespace(rows={"train": rows}, steps_per_epoch=3,
                                     config=types.SimpleNamespace(train=types.SimpleNamespace(global_batch=4,
                                                                                              seed=seed)))
    epoch = [train_batch(plan(0), step) for step in range(3)]
    ids = np.concatenate([b["input_ids"][:, 0] for b in epoch])
    weights = np.concatenate([b["label_weights"] for b in epoch])
    assert sorted(ids[weights == 1]) == list(range(10))  # every row once; the last batch padded with weight 0
    assert weights.tolist() == [1] * 10 + [0] * 2
    again = train_batch(plan(0), 3)["input_ids"][:, 0]  # the next epoch: another order
    assert not np.array_equal(again, ids[:4])
    assert np.array_equal(train_batch(plan(0), 4)["input_ids"], train_batch(plan(0), 4)["input_ids"])
    assert not np.array_equal(train_batch(plan(1), 0)["input_ids"], epoch[0]["input_ids"])
