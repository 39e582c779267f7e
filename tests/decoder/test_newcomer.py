"""What a newcomer trips on (issue 28): one flag style, --help that lists the settings, errors
that offer what the command has, and a README whose commands and claims hold."""

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import decoder.finetune as ft
import decoder.generate as gen
import decoder.train as tr
from decoder.model.config import ModelConfig
from decoder.model.model import build_model
from decoder.text.data import TokenDataset
from decoder.text.stream import print_sample
from decoder.text.tokenizer import CharTokenizer
from decoder.training.checkpoint import CheckpointError
from decoder.training.config import PRESETS, TrainConfig, build_configs
from decoder.training.loop import train
from decoder.training.rundir import RunDirError, claim_dir
from decoder.training.step import estimate_loss

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TEXT = "the cat sat on the mat. the dog ran to me.\n" * 40


@pytest.fixture(autouse=True)
def _token_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGRAD_DATA_DIR", str(tmp_path / "cache"))


def test_finetune_takes_max_iters_as_the_other_trainers_spell_it(tmp_path, monkeypatch):
    given = {}
    monkeypatch.setattr(ft, "finetune", lambda *a, **kw: given.update(kw))
    data = tmp_path / "data.txt"
    data.write_text(TEXT, encoding="utf-8")
    argv = ["--checkpoint", "run", "--data", str(data), "--out", str(tmp_path / "o")]
    assert ft.main([*argv, "--max_iters=7"]) == 0 and given["max_iters"] == 7
    assert ft.main([*argv, "--max-iters", "5"]) == 0 and given["max_iters"] == 5  # the old one


def test_train_help_lists_every_setting_with_its_default(capsys):
    with pytest.raises(SystemExit):
        tr.main(["--help"])
    out = capsys.readouterr().out
    for cls in (ModelConfig, TrainConfig):
        for f in dataclasses.fields(cls):
            default = repr(f.default) if f.default == "\n" else f.default
            assert f"--{f.name}={default}" in out, f.name
    assert "--n_layer=4  transformer blocks" in out  # with the reason beside the field


def test_a_command_without_resume_does_not_offer_it(tmp_path, capsys):
    (tmp_path / "lora.json").write_text("{}", encoding="utf-8")
    with pytest.raises(RunDirError) as info:
        with claim_dir(tmp_path, ("lora.json",), "lora.json", resumable=False):
            pass
    assert "--resume" not in str(info.value) and "--overwrite" in str(info.value)
    data = tmp_path / "data.txt"
    data.write_text(TEXT, encoding="utf-8")
    argv = ["--checkpoint", "missing", "--data", str(data), "--out", str(tmp_path)]
    assert ft.main(argv) == 2
    err = capsys.readouterr().err
    assert "--resume" not in err and "--overwrite to replace it, or another --out" in err


def test_resuming_a_finished_run_says_it_is_complete_and_how_to_go_on(tmp_path):
    settings = {"max_iters": "2", "warmup_iters": "1", "eval_iters": "1", "batch_size": "2"}
    model_cfg, train_cfg = build_configs("tiny", {**settings, "block_size": "8"})
    train(model_cfg, train_cfg, TEXT, tmp_path, progress=False)
    with pytest.raises(CheckpointError, match=r"complete at step 2.*--max_iters=M for some M > 2"):
        train(model_cfg, train_cfg, TEXT, tmp_path, resume=True, progress=False)
    shorter = dataclasses.replace(train_cfg, max_iters=1, lr_decay_iters=1)
    with pytest.raises(CheckpointError, match=r"past --max_iters=1 at step 2"):
        train(model_cfg, shorter, TEXT, tmp_path, resume=True, progress=False)


def test_a_prompt_or_stop_outside_the_vocabulary_names_the_option_and_the_character():
    tokenizer = CharTokenizer.from_text(TEXT).with_special_tokens(["<|user|>", "<|assistant|>"])
    model = SimpleNamespace(config=SimpleNamespace(block_size=8))  # refused before it runs
    with pytest.raises(ValueError) as info:
        print_sample(model, tokenizer, "<|user|> hi <|assistant|>", 5)
    message = str(info.value)
    assert message.startswith("--prompt: ") and "'<'" in message and "'|'" in message
    assert "<|user|>, <|assistant|> are special tokens" in message and "decoder.chat" in message
    assert "different corpus" not in message
    with pytest.raises(ValueError, match=r"^--stop '@': 1 character\(s\) .*: '@'"):
        print_sample(model, tokenizer, "the", 5, stop="@")


@pytest.mark.parametrize(
    "marker, advice",
    [("lora.json", "decoder.finetune merge --adapters"), ("config.json", "--from-pretrained")],
)
def test_generate_given_adapters_or_a_hugging_face_folder_says_what_to_run(
    tmp_path, capsys, marker, advice
):
    (tmp_path / marker).write_text("{}", encoding="utf-8")
    assert gen.main(["--checkpoint", str(tmp_path)]) == 2
    assert advice in capsys.readouterr().err


def test_accumulation_evaluates_batch_size_rows_as_the_readme_says():
    assert "the evaluated losses are not" in README
    data = TokenDataset(np.arange(400) % 7)
    model = build_model(ModelConfig(vocab_size=7, block_size=8, n_layer=1, n_head=2, n_embd=8))
    small = TrainConfig(batch_size=3, eval_iters=8)  # the rows of the README's 4 micro-batches
    big = TrainConfig(batch_size=12, eval_iters=2)
    assert estimate_loss(model, data, small, 8) != estimate_loss(model, data, big, 8)
    four_times = TrainConfig(batch_size=3, eval_iters=8 * 4)
    assert estimate_loss(model, data, four_times, 8) == pytest.approx(
        estimate_loss(model, data, TrainConfig(batch_size=12, eval_iters=8), 8)
    )


def shell_blocks(text: str) -> str:
    """The text of the README's fenced blocks without a language or marked as a shell's."""
    blocks, lines, inside = [], [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if inside is None:
                inside, lines = line[3:].strip(), []
            else:
                blocks += lines if inside in ("", "sh", "bash", "shell") else []
                inside = None
        elif inside is not None:
            lines.append(line)
    return "\n".join(blocks)


def test_readme_shell_commands_create_the_files_they_read():
    commands = shell_blocks(README)
    assert "python -m decoder.finetune" in commands  # the blocks were found
    for name in set(re.findall(r"--data (\S+\.txt)", commands)):
        first_use = README.index(f"--data {name}")
        assert re.search(rf"open\(['\"]{re.escape(name)}['\"], ['\"]w", README[:first_use]), name


def test_readme_times_make_bench_train_as_the_makefile_does():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    said = re.search(r"\(about (\w+) minutes\), then", makefile).group(1)
    bench_train = "`make bench-train`: the training comparison, then the generation one"
    assert f"{bench_train}, about {said} minutes" in README


def test_presets_that_build_the_same_run_say_so():
    built = {name: build_configs(name) for name in PRESETS}
    for i, (name, configs) in enumerate(built.items()):
        for earlier in list(built)[:i]:
            if built[earlier] == configs:
                assert earlier in PRESETS[name].description, (name, earlier)
    assert "granite" in README[README.index("`granite` without") :][:20]
