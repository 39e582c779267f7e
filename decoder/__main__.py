"""``python -m decoder``: list the commands (each is its own module, with its own --help)."""

COMMANDS = """\
python -m decoder.train       train a model (--list-presets; any config field as --key=value)
python -m decoder.generate    sample text from a checkpoint (--checkpoint DIR --prompt TEXT)
python -m decoder.finetune    LoRA fine-tuning on new text; 'finetune merge' folds adapters in
python -m decoder.sft         supervised fine-tuning on instruction pairs (--checkpoint RUN --out)
python -m decoder.dpo         preference optimisation (DPO) of an SFT run (--checkpoint RUN --out)
python -m decoder.chat        answer instructions with an SFT or DPO run (--checkpoint RUN)
"""

if __name__ == "__main__":
    print(COMMANDS, end="")
