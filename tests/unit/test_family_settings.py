"""Each family's `data_settings` are exactly the objective settings its stored rows and transform read, on real
tokenised text; a config that sets one its family ignores gets a note saying it changes nothing."""
import numpy as np
import pytest
from conftest import ROOT

from jaxlm import config as config_lib
from jaxlm import families
from jaxlm.cli import main
from jaxlm.corpora.models import bert_vocab_path
from jaxlm.corpora.registry import fetch_austen
from jaxlm.data.layouts import build_rows
from jaxlm.data.settings import DataConfig, data_settings
from jaxlm.data.tokenizers.wordpiece import WordPieceTokenizer

SEQ = 64
# a valid value other than the default for every setting that only some objectives read
CHANGED = {"mask_prob": 0.4, "max_predictions": 30, "whole_word_masking": True, "short_seq_prob": 0.6,
           "dupe_factor": 2, "packed": False, "span_p": 0.5, "max_span": 3, "noise_density": 0.3,
           "mean_span_length": 2.0, "max_target_length": 100, "mask_ratio": 0.6, "poisson_lambda": 1.5,
           "permute_sentences": False}


@pytest.fixture(scope="module")
def text():
    """Austen's first chapters tokenised: documents of sentences, the special ids every layout needs, and the
    table of word-continuing pieces."""
    tok = WordPieceTokenizer(bert_vocab_path())
    documents = [[s for s in tok.encode_batch(block.splitlines()) if s]
                 for block in fetch_austen().read_text().split("\n\n")[40:80]]
    special = {"cls": tok.cls_id, "sep": tok.sep_id, "mask": tok.mask_id, "pad": tok.pad_id, "bos": tok.cls_id,
               "eos": tok.sep_id, "sentinels": list(range(tok.vocab_size - 1, tok.vocab_size - 101, -1))}
    table = np.array([piece.startswith("##") for piece in sorted(tok.vocab, key=tok.vocab.get)])
    return [d for d in documents if d], special, table


def outputs(family: str, data: DataConfig, text) -> list[np.ndarray]:
    """Every array of the family's stored rows and of its first batches' transform, in order."""
    documents, special, table = text
    spec = families.get(family)
    rows = list(build_rows(spec.layout, documents, np.random.default_rng(0), data, special))
    manifest = {"special_ids": special, "vocab_size": len(table), "max_seq_length": data.max_seq_length}
    transform = spec.transform(manifest, table, data)
    batch = transform(rows[:16], [np.random.default_rng([1, i]) for i in range(16)])
    return [np.asarray(a) for row in rows for a in row] + [np.asarray(batch[k]) for k in sorted(batch)]


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))


def test_every_objective_setting_has_a_changed_value():
    assert sorted(CHANGED) == sorted(families.OBJECTIVE_SETTINGS)


@pytest.mark.parametrize("family", sorted(families.FAMILIES))
def test_a_family_reads_its_data_settings_and_no_other(family, text):
    base = DataConfig(max_seq_length=SEQ, max_predictions=10)
    plain = outputs(family, base, text)
    read = families.get(family).data_settings
    for name, value in CHANGED.items():
        changed = same(plain, outputs(family, data_settings(base, **{name: value}), text))
        assert changed != (name in read), f"{family}: data.{name} {'changes nothing' if changed else 'changes'}"


def test_a_setting_its_family_ignores_is_noted_once(tmp_path, capsys):
    """The notes name what the config file itself and the overrides set, not what an included file does
    (gpt2-tiny includes bert-tiny's max_predictions); the command goes on."""
    path = tmp_path / "gpt2.yaml"
    path.write_text(f"include: {ROOT / 'configs/gpt2-tiny.yaml'}\n"
                    "data:\n  noise_density: 0.3\n  packed: false\n")
    overrides = ["data.mask_prob=0.3", f"data.prepared_dir={tmp_path / 'none'}"]
    notes = config_lib.unread_settings(path, overrides, config_lib.load(path, overrides))
    assert notes == ["data.mask_prob is a setting of the bert, roberta, distilbert, albert and spanbert objectives, "
                     "not of gpt2's: it changes nothing",
                     "data.noise_density is a setting of the t5 objectives, not of gpt2's: it changes nothing"]
    assert main(["preflight", str(path), *overrides]) == 2  # no prepared data: the command went on to look
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == [f"jaxlm preflight: note: {note}" for note in notes]
    assert err[2].startswith("jaxlm preflight: error: no prepared dataset at")


def test_masked_slots_that_cap_the_mask_rate_are_noted_and_more_slots_than_tokens_refused(tmp_path):
    """BERT masks round(length × mask_prob) tokens of a row into max_predictions slots: fewer slots cap the rate
    (ALBERT's recipe means 20 of 512); more slots than tokens is an error for a masked LM alone."""
    albert = config_lib.load(ROOT / "configs/albert-base.yaml")
    assert config_lib.capped_masking(albert) == [
        "data.max_predictions=20 caps the masked tokens of a 512-token row at 3.9%, where data.mask_prob=0.15 would "
        "mask 77; raise it to 77 for that rate (BERT: 20 at length 128, 80 at 512)"]
    bert = config_lib.load(ROOT / "configs/bert-base.yaml")
    assert config_lib.capped_masking(bert) == []
    short = ["data.max_seq_length=16", "data.max_predictions=20", "model.max_position_embeddings=16"]
    with pytest.raises(config_lib.ConfigError, match=r"^data.max_predictions=20 exceeds data.max_seq_length=16; "):
        config_lib.validate(config_lib.load(ROOT / "configs/bert-tiny.yaml", short))
    gpt2 = config_lib.load(ROOT / "configs/gpt2-tiny.yaml", short)
    config_lib.validate(gpt2)
    assert config_lib.capped_masking(gpt2) == []
