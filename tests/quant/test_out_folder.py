"""``inferlab quantize --out`` never loses a file: a folder with files inferlab did not write is refused
unless --overwrite, which then replaces only inferlab's own files; the input model is never written;
tokenizer and generation files travel with the weights, every file readable by all (0644)."""
import hashlib
import json
import os
import shutil
import stat

import pytest

from inferlab import cli
from inferlab.model.loader import ASSETS, load_checkpoint, save_checkpoint
from inferlab.quant.checkpoint import MANIFEST

from .helpers import tiny_model

EXTRA = {  # the files a hub instruct model carries besides config, weights and tokenizer.json
    "tokenizer_config.json": json.dumps({"chat_template": "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
                                         "{% endfor %}", "eos_token": "<|endoftext|>"}),
    "special_tokens_map.json": json.dumps({"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}),
    "generation_config.json": json.dumps({"eos_token_id": 0, "temperature": 0.7}),
    "chat_template.jinja": "{{ messages[0].content }}",
}


def digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def source(tmp_path):
    """A model folder as a user has it: weights, tokenizer files, and a note of their own."""
    folder = save_checkpoint(tiny_model(), None, tmp_path / "src")
    shutil.copyfile(ASSETS / "target" / "tokenizer.json", folder / "tokenizer.json")
    for name, text in EXTRA.items():
        (folder / name).write_text(text)
    (folder / "README.md").write_text("my model\n")
    (folder / "notes.txt").write_text("keep me\n")
    return folder


def quantize(capsys, src, out, *extra):
    code = cli.main(["quantize", "--model", str(src), "--method", "int8", "--out", str(out), "--json", *extra])
    res = capsys.readouterr()
    return code, res.out, res.err


@pytest.mark.parametrize("where", [".", "sub", "sub/deeper"])
def test_out_equal_to_or_inside_the_input_model_is_refused_even_with_overwrite(capsys, source, where):
    before = digest(source)
    for extra in ((), ("--overwrite",)):
        code, _, err = quantize(capsys, source, source / where, *extra)
        assert code == 2 and "input model folder" in err and err.count("\n") == 1, err
    assert digest(source) == before and sorted(p.name for p in source.iterdir()) == sorted(before)


def test_a_folder_with_foreign_files_is_refused_without_overwrite(capsys, source, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    (out / "config.json").write_text("{}")  # even a model-looking folder: inferlab did not write it
    code, _, err = quantize(capsys, source, out)
    assert code == 2 and "--overwrite" in err and "notes.txt" in err and err.count("\n") == 1
    assert digest(out) == {"notes.txt": hashlib.sha256(b"mine\n").hexdigest(),
                           "config.json": hashlib.sha256(b"{}").hexdigest()}


def test_overwrite_replaces_only_what_inferlab_writes(capsys, source, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    (out / "config.json").write_text("{}")
    code, stdout, err = quantize(capsys, source, out, "--overwrite")
    assert code == 0, err
    assert (out / "notes.txt").read_text() == "mine\n"  # untouched
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "int8"
    assert not (out / "README.md").exists()  # the source's own files are not inferlab's to copy
    load_checkpoint(out, device="cpu")


def test_other_weights_in_the_folder_are_refused_even_with_overwrite(capsys, source, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "model-00001-of-00002.safetensors").write_bytes(b"x")
    code, _, err = quantize(capsys, source, out, "--overwrite")
    assert code == 2 and "other weights" in err
    assert [p.name for p in out.iterdir()] == ["model-00001-of-00002.safetensors"]


def test_tokenizer_and_generation_files_are_kept_at_mode_0644(capsys, source, tmp_path):
    out = tmp_path / "q"
    old = os.umask(0o022)
    try:
        code, stdout, err = quantize(capsys, source, out)
    finally:
        os.umask(old)
    assert code == 0, err
    src, dst = digest(source), digest(out)
    for name in ("tokenizer.json", *EXTRA):
        assert dst.get(name) == src[name], f"{name} not copied byte for byte"
    for p in out.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, (p.name, oct(p.stat().st_mode))
    assert stat.S_IMODE(out.stat().st_mode) == 0o755


def test_a_folder_inferlab_wrote_is_rewritten_without_overwrite_and_stale_files_go(capsys, source, tmp_path):
    out = tmp_path / "q"
    assert quantize(capsys, source, out)[0] == 0
    written = set(json.loads((out / MANIFEST).read_text())["files"])
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= written
    (source / "chat_template.jinja").unlink()  # the next source no longer has this file ...
    (out / "mine.txt").write_text("x")
    code, _, err = quantize(capsys, source, out)  # ... but a file of the user's appeared: refused
    assert code == 2 and "mine.txt" in err
    (out / "mine.txt").unlink()
    assert quantize(capsys, source, out)[0] == 0
    assert not (out / "chat_template.jinja").exists()  # inferlab's own stale copy is gone
    assert (out / "tokenizer_config.json").exists()


def test_a_failed_run_into_an_existing_folder_changes_nothing(capsys, source, tmp_path, monkeypatch):
    from inferlab.quant import checkpoint
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    (out / "config.json").write_text("{}")
    before = digest(out)

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "save_file", boom)
    with pytest.raises(OSError):
        quantize(capsys, source, out, "--overwrite")
    assert digest(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]


def test_a_gguf_file_or_folder_gets_a_clear_word(tmp_path, capsys):
    """A folder holding only a .gguf points at the file; a broken .gguf is refused in one line."""
    folder = tmp_path / "target-q4_0"
    folder.mkdir()
    (folder / "model.gguf").write_bytes(b"GGUF")
    for target, word in ((folder, "pass the .gguf file itself"), (folder / "model.gguf", "could not be read as GGUF")):
        code = cli.main(["generate", "x", "--model", str(target), "--max-tokens", "1"])
        err = capsys.readouterr().err
        assert code == 2 and word in err and err.count("\n") == 1, err
