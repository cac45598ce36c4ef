"""`inferlab train` end to end on a toy shape and a few files: the loss goes down, the model
folders are written and loadable, and a rerun resumes from the checkpoint."""
import json
import os

from inferlab import train
from inferlab.model.loader import load_checkpoint

os.environ.setdefault("TQDM_DISABLE", "1")

ARGS = ["--preset", "tiny", "--max-files", "6", "--vocab-size", "400", "--no-compile", "--quiet",
        "--log-every", "1000", "--eval-tokens", "2000"]


def _losses(path):
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()]


def test_smoke_training_loss_goes_down_and_resumes(tmp_path):
    run, out = tmp_path / "run", tmp_path / "models"
    base = ARGS + ["--run-dir", str(run), "--out", str(out)]
    assert train.main(base + ["--steps", "40"]) == 0
    for name in ("draft", "target"):
        losses = _losses(run / name / "loss.jsonl")
        assert len(losses) == 40
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        assert last < first - 0.3, (first, last)
        for f in ("config.json", "model.safetensors", "tokenizer.json", "README.md", "metrics.json"):
            assert (out / name / f).exists(), f
        model, tok = load_checkpoint(out / name, device="cpu")
        assert tok.decode(tok.encode("def f(x):\n    return x")) == "def f(x):\n    return x"
        metrics = json.loads((out / name / "metrics.json").read_text())
        assert metrics["params"] == model.num_parameters() and metrics["test_ppl"] > 1
    # a second run with more steps continues from step 40 instead of starting over
    assert train.main(base + ["--steps", "45", "--models", "draft", "--no-ship"]) == 0
    assert len(_losses(run / "draft" / "loss.jsonl")) == 45
    assert "resuming at step 40" in (run / "train.log").read_text()


def test_bad_arguments_say_what_to_do():
    import pytest
    from inferlab.errors import InferlabError

    with pytest.raises(InferlabError, match="--budget"):
        train.main(["--models", "draft"])
    with pytest.raises(InferlabError, match="choose from"):
        train.main(["--models", "huge", "--steps", "1"])
