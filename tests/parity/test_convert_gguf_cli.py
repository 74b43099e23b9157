"""`jaxlm convert from-gguf` on the real SmolLM2-135M-Instruct Q4_1 GGUF, then `to-hf`: transformers loads the
result (model and tokenizer) and reproduces the perplexity ASSETS.md records for the GGUF (15.9); a truncated file
or one that is not GGUF is refused in one line, with nothing written."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from jaxlm.cli import main  # noqa: E402
from jaxlm.convert import store  # noqa: E402
from jaxlm.corpora.models import smollm2_gguf_path  # noqa: E402
from jaxlm.data.tokenizers.load import load_tokenizer  # noqa: E402

OPENING = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
           "must be in want of a wife.")


def perplexity(model, ids) -> float:
    with torch.no_grad():
        return float(torch.exp(model(ids, labels=ids).loss))


def test_from_gguf_to_hf_loads_in_transformers_with_the_recorded_perplexity(tmp_path, capsys):
    ckpt, back = tmp_path / "smollm2", tmp_path / "hf"
    assert main(["convert", "from-gguf", "SmolLM2-135M-Instruct", str(ckpt)]) == 0  # the packaged GGUF, by name
    config, _ = store.checkpoint_config(ckpt)
    assert (config.family, config.num_layers, config.kv_heads) == ("llama", 30, 3)
    settings = json.loads((ckpt / "tokenizer" / "tokenizer_config.json").read_text())
    assert settings["eos_token"] == "<|im_end|>" and "chat_template" in settings
    ours = load_tokenizer(ckpt / "tokenizer")
    assert ours.decode(ours.encode(OPENING, add_special_tokens=True)) == OPENING

    assert main(["convert", "to-hf", str(ckpt), str(back)]) == 0
    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(back), output_loading_info=True,
                                                                    dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(back))
    ids = tokenizer(OPENING, return_tensors="pt").input_ids
    assert ids[0].tolist() == ours.encode(OPENING, add_special_tokens=True)
    ppl = perplexity(model.eval(), ids)
    shuffled = perplexity(model, tokenizer(" ".join(sorted(OPENING.split())), return_tensors="pt").input_ids)
    print(f"SmolLM2 from GGUF via jaxlm, in transformers: perplexity {ppl:.2f} (sorted words {shuffled:.0f})")
    assert abs(ppl - 15.9) < 0.1 and shuffled > 20 * ppl
    np.testing.assert_array_equal(model.lm_head.weight.detach().numpy(),
                                  model.model.embed_tokens.weight.detach().numpy())

    # `jaxlm generate` on the converted checkpoint: transformers' greedy continuation, token for token.
    prompt = "It is a truth universally acknowledged, that"
    capsys.readouterr()
    assert main(["generate", str(ckpt), "--prompt", prompt, "--max-new-tokens", "12"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with torch.no_grad():
        expected = model.generate(tokenizer(prompt, return_tensors="pt").input_ids, max_new_tokens=12,
                                  do_sample=False)[0, len(ours.encode(prompt, add_special_tokens=True)):].tolist()
    print(f"jaxlm generate: {line['generated']!r}")
    assert line["token_ids"] == expected


CUT = ("could not be read as GGUF (", "; {kept} bytes): it is truncated or damaged, or newer than the installed gguf "
       "package reads; download it again, or upgrade gguf")  # between them, the reader's reason
NOT_GGUF = ("is not a GGUF file ({why}); pass a llama.cpp .gguf model file, or convert a Hugging Face model "
            "directory with `jaxlm convert from-hf`")


@pytest.mark.parametrize("kept, says", [(1000, CUT), (3 << 20, CUT), (0, (NOT_GGUF.format(why="it is empty"), ""))],
                         ids=["metadata-cut", "tensors-cut", "empty"])
def test_from_gguf_refuses_a_truncated_file_in_one_line_and_writes_nothing(tmp_path, capsys, kept, says):
    with open(smollm2_gguf_path(), "rb") as f:  # the first bytes only: the header ends before 3 MiB
        head = f.read(kept)
    path = tmp_path / "cut.gguf"
    path.write_bytes(head)
    assert main(["convert", "from-gguf", str(path), str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"jaxlm convert from-gguf: error: {path} {says[0]}"), lines
    assert lines[0].endswith(says[1].format(kept=kept)), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gguf"]


def test_from_gguf_says_a_file_is_not_gguf_without_naming_python(tmp_path, capsys):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    assert main(["convert", "from-gguf", str(path), str(tmp_path / "out")]) == 2
    why = "it starts with b'PK\\x03\\x04', not b'GGUF'"
    assert capsys.readouterr().err.strip().splitlines() == [
        f"jaxlm convert from-gguf: error: {path} {NOT_GGUF.format(why=why)}"]
    assert not (tmp_path / "out").exists()
    assert main(["convert", "from-gguf", str(tmp_path), str(tmp_path / "out")]) == 2  # was "no GGUF file at"
    assert capsys.readouterr().err.strip().splitlines() == [
        f"jaxlm convert from-gguf: error: {tmp_path} is a directory; give a llama.cpp .gguf model file (a Hugging Face "
        "model's directory converts with `jaxlm convert from-hf`)"]


def tiny_llama_gguf(path, tokenizer_model="gpt2", eos=1, vocab=50, heads=2):
    """A one-layer Llama GGUF of float32 tensors, hidden size 8, over a made-up byte-level vocabulary."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((writer.add_block_count, 1), (writer.add_context_length, 32), (writer.add_embedding_length, 8),
                       (writer.add_feed_forward_length, 16), (writer.add_head_count, heads),
                       (writer.add_head_count_kv, 2), (writer.add_layer_norm_rms_eps, 1e-5),
                       (writer.add_tokenizer_model, tokenizer_model),
                       (writer.add_token_list, [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(vocab)]),
                       (writer.add_token_merges, ["a a"]), (writer.add_bos_token_id, 0),
                       (writer.add_eos_token_id, eos)):
        if value is not None:  # None: the key left out
            add(value)
    shapes = {"token_embd.weight": (vocab, 8), "output_norm.weight": (8,), "blk.0.attn_norm.weight": (8,),
              **{f"blk.0.attn_{n}.weight": (8, 8) for n in ("q", "k", "v", "output")}, "blk.0.ffn_norm.weight": (8,),
              "blk.0.ffn_gate.weight": (16, 8), "blk.0.ffn_up.weight": (16, 8), "blk.0.ffn_down.weight": (8, 16)}
    for name, shape in shapes.items():
        writer.add_tensor(name, np.random.default_rng(0).standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("settings, options, says", [
    ({"tokenizer_model": "llama"}, [], "GGUF tokenizer.ggml.model='llama' is not supported"),  # Llama 2, Mistral
    ({"eos": 999}, [], "GGUF tokenizer.ggml.eos_token_id=999 is outside the file's 50 tokens: the file is damaged"),
    ({}, ["--vocab-multiple", "100000000000"],  # was a MemoryError's traceback
     "--vocab-multiple=100000000000 is larger than the vocabulary it pads (50 tokens)"),
    ({"heads": 0}, [], "GGUF llama.attention.head_count=0 must be at least 1: the file is damaged"),  # was / by zero
    # was "tokenizer.ggml.model=None is not supported"
    ({"tokenizer_model": None}, [], "GGUF file lacks the metadata key 'tokenizer.ggml.model'"),
], ids=["sentencepiece", "eos-outside", "vocab-multiple", "no-heads", "no-tokenizer-model"])
def test_from_gguf_refuses_its_tokenizer_and_settings_before_dequantising(tmp_path, capsys, monkeypatch, settings,
                                                                         options, says):
    """A SentencePiece GGUF (most Llama files) was refused only after every tensor was dequantised (a 7B model: 28 GB
    of float32 first); an EOS id outside the vocabulary was an IndexError's traceback."""
    from jaxlm.convert import gguf as ours

    path = tiny_llama_gguf(tmp_path / "tiny.gguf", **settings)
    monkeypatch.setattr(ours, "dequantized_tensors", lambda reader: pytest.fail("dequantised before the checks"))
    assert main(["convert", "from-gguf", str(path), str(tmp_path / "out"), *options]) == 2
    assert capsys.readouterr().err.splitlines() == [f"jaxlm convert from-gguf: error: {says}" + (
        "; download or convert it again" if "damaged" in says else
        ": it was not written by llama.cpp's converter, or is damaged; convert the model again with llama.cpp"
        if "lacks" in says else
        ": jaxlm builds only byte-level BPE ('gpt2') tokenizers from GGUF files" if "model=" in says else
        "; use a row multiple such as 64 or 128")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]
