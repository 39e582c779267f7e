"""Post-training: adapting a trained model.

In data-flow order: ``chat`` (the chat template), ``instruct_data`` (instruction and
preference pairs), ``posttrain`` (a training run that starts from a checkpoint), ``sft``
(supervised fine-tuning), ``dpo`` (direct preference optimisation) and ``lora`` (LoRA
adapters on new text, and merging them back). Uses decoder.training, decoder.model,
decoder.text, and decoder.hf for a Hugging Face base model.
"""
