"""Build the offline tiny Llama that the real-vLLM suite serves (random weights, local tokenizer).

No model can be downloaded on CI, so this makes one: a 2-layer Llama with a fixed seed and a
byte-level BPE tokenizer trained on generated text, saved with ``save_pretrained``. It needs
torch, transformers and tokenizers, so run it with the vLLM venv's python (scripts/vllm_env.sh).
The output is reused while this script is unchanged (its sha256 is stored next to the model).

    python scripts/build_tiny_model.py OUT_DIR [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import random
import shutil
import sys
import tempfile
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 4096
# Trained first, so they get ids 0..3: the ids config.json declares for bos/eos/pad.
SPECIAL_TOKENS = {
    "unk_token": "<unk>",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
STAMP_NAME = ".sidecar-stamp"


def corpus(lines: int, seed: int = SEED) -> list[str]:
    """Deterministic pseudo-English text, varied enough for the BPE trainer to fill its vocab."""
    rng = random.Random(seed)  # noqa: S311 - reproducible text, not secrets
    onsets = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "st", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ee"]
    codas = ["", "n", "r", "s", "t", "ng", "ck", "ld"]
    words = [
        "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(k))
        for k in (rng.randint(1, 3) for _ in range(3000))
    ]
    punctuation = [".", ",", "?", "!", ":", ";"]
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(4, 16))).capitalize()
        + rng.choice(punctuation)
        + f" {rng.randint(0, 9999)}"
        for _ in range(lines)
    ]


def build_tokenizer(out: Path) -> None:
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    # Byte-level: every string encodes (no <unk>), so any prompt a test sends is valid input.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(20_000), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        **SPECIAL_TOKENS,
        model_max_length=2048,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(out)


def build_model(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # vLLM's CPU attention rejects head sizes under 32
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out)


def stamp() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path, help="folder to write the model into")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    out: Path = args.out
    stamp_file = out / STAMP_NAME
    if not args.force and stamp_file.is_file() and stamp_file.read_text() == stamp():
        print(f"build_tiny_model: reusing {out}", file=sys.stderr)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and swap it in, so an interrupted build never looks finished.
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".tiny-model-") as scratch:
        staging = Path(scratch) / "model"
        build_tokenizer(staging)
        build_model(staging)
        (staging / STAMP_NAME).write_text(stamp())
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    print(f"build_tiny_model: wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
