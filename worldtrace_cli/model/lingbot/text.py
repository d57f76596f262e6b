"""The umT5-XXL text encoder of LingBot-World (spec §10.4, §12) through transformers' ``UMT5EncoderModel``.

The official ``models_t5_umt5-xxl-enc-bf16.pth`` is the umT5-XXL encoder (24 layers, width 4096, 64
heads, FFN 10240, vocabulary 256384, 32 relative-position buckets per layer, spec §12) in Wan's own
module naming (read by :meth:`UMT5TextEncoder.from_wan_checkpoint`, renamed by :func:`wan_t5_to_hf`);
the same weights in Hugging Face format are what diffusers' Wan pipelines load as ``text_encoder/``
(:meth:`UMT5TextEncoder.from_pretrained`). Both run in transformers' ``UMT5EncoderModel`` with the
``google/umt5-xxl`` tokenizer.
Prompt handling (spec §10.4): cleaned (ftfy when installed, HTML unescaped twice, whitespace
collapsed), tokenised to 512 with padding and truncation, encoded with the attention mask, rows cut to
the real token count; the DiT pads back to 512 with zeros (:meth:`LingbotDiT.embed_text`).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import torch

from ...errors import CheckpointError

TEXT_LEN = 512


def clean_prompt(text: str) -> str:
    """ftfy fix (when the package is installed), HTML unescape twice, strip, collapse whitespace."""
    try:
        import ftfy

        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


class UMT5TextEncoder:
    """umT5 encoder plus tokenizer; encodings are cached per prompt string (as the official pipeline does).

    Args:
        model: a ``transformers.UMT5EncoderModel`` (d_model 4096 for the released DiT).
        tokenizer: a ``google/umt5-xxl`` tokenizer, or None to use :meth:`encode_ids` only.
        max_length: tokens per prompt (512).
    """

    def __init__(self, model, tokenizer=None, max_length: int = TEXT_LEN):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_length = max_length
        self._cache: dict[str, torch.Tensor] = {}
        self.host_device: torch.device | None = None  # keep_on_host: where encodings run and are returned

    def keep_on_host(self, device: str | torch.device) -> None:
        """Keep the encoder's weights in host memory and move them to ``device`` only while a new
        prompt is encoded (its rows are returned on ``device``; a prompt met before costs nothing).
        On a GPU this frees the encoder's memory for the rest of the run (umT5-XXL: 11.4 GB in bf16,
        docs/gpu-memory.md) at the price of two host-device copies per new prompt. On the CPU it changes nothing."""
        self.host_device = torch.device(device)
        self.model.to("cpu")

    @classmethod
    def from_pretrained(cls, encoder_dir: str | Path, tokenizer_dir: str | Path | None = None,
                        dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu") -> "UMT5TextEncoder":
        """Load an HF-format encoder folder (``config.json`` + safetensors) and its tokenizer folder
        (default: ``encoder_dir/../tokenizer``, the diffusers layout). Local files only.

        Raises:
            CheckpointError: a folder is missing or cannot be loaded (one line naming it).
        """
        from transformers import AutoTokenizer, UMT5EncoderModel

        encoder_dir = Path(encoder_dir)
        tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else encoder_dir.parent / "tokenizer"
        for folder in (encoder_dir, tokenizer_dir):
            if not folder.is_dir():
                raise CheckpointError(f"{folder}: umT5 folder not found")
        try:
            model = UMT5EncoderModel.from_pretrained(str(encoder_dir), dtype=dtype, local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{encoder_dir}: cannot load the umT5 encoder ({str(exc).splitlines()[0]})") from None
        return cls(model.to(device), tokenizer)

    @classmethod
    def from_wan_checkpoint(cls, path: str | Path, tokenizer_dir: str | Path, dtype: torch.dtype = torch.bfloat16,
                            device: str | torch.device = "cpu") -> "UMT5TextEncoder":
        """Load the release's ``models_t5_umt5-xxl-enc-bf16.pth`` (Wan's module names, tensors only)
        into ``transformers.UMT5EncoderModel`` (:func:`wan_t5_to_hf`), with the ``google/umt5-xxl``
        tokenizer folder. The model is built on the meta device and takes the file's tensors (cast
        to ``dtype``), so no random copy of its 5.7 B parameters is made.

        Raises:
            CheckpointError: an unreadable file, another layout, or a missing tokenizer folder (one line).
        """
        from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel

        from ..weights import read_state_dict

        path, tokenizer_dir = Path(path), Path(tokenizer_dir)
        if not tokenizer_dir.is_dir():
            raise CheckpointError(f"{tokenizer_dir}: umT5 tokenizer folder not found")
        state, config = wan_t5_to_hf(read_state_dict(path), str(path))
        with torch.device("meta"):
            model = UMT5EncoderModel(UMT5Config(**config))
        model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True, assign=True)
        model.tie_weights()
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{tokenizer_dir}: cannot load the umT5 tokenizer ({str(exc).splitlines()[0]})") from None
        return cls(model.to(device), tokenizer)

    @torch.no_grad()
    def encode_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Token ids and mask [1, max_length] (int64) -> encoder rows of the real tokens [L, d_model] float32
        (on the device the encoder runs on; with :meth:`keep_on_host` it visits that device for the call)."""
        device = self.host_device or next(self.model.parameters()).device
        if self.host_device is not None:
            self.model.to(device)
        try:
            out = self.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).last_hidden_state
        finally:
            if self.host_device is not None:
                self.model.to("cpu")
        length = int(attention_mask.sum())
        return out[0, :length].float()

    def encode(self, prompt: str) -> torch.Tensor:
        """Prompt -> umT5 rows [L_tokens, d_model] float32 (L <= 512), cached per prompt string.

        Raises:
            ValueError: no tokenizer was given.
        """
        if self.tokenizer is None:
            raise ValueError("UMT5TextEncoder.encode needs a tokenizer (use encode_ids with token ids)")
        if prompt not in self._cache:
            tok = self.tokenizer([clean_prompt(prompt)], padding="max_length", truncation=True,
                                 max_length=self.max_length, add_special_tokens=True, return_tensors="pt")
            self._cache[prompt] = self.encode_ids(tok.input_ids, tok.attention_mask)
        return self._cache[prompt]


WAN_T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"  # the release's encoder, in Wan's module names (spec §13)
# Wan's T5Encoder block parts -> transformers' UMT5 names (per block i; Wan's FFN is fc2(fc1(x) * GELU(gate(x))),
# transformers' gated-gelu wo(gelu_new(wi_0(x)) * wi_1(x)): gate -> wi_0, fc1 -> wi_1, fc2 -> wo)
_WAN_BLOCK_NAMES = {"norm1.weight": "layer.0.layer_norm.weight", "attn.q.weight": "layer.0.SelfAttention.q.weight",
                    "attn.k.weight": "layer.0.SelfAttention.k.weight", "attn.v.weight": "layer.0.SelfAttention.v.weight",
                    "attn.o.weight": "layer.0.SelfAttention.o.weight",
                    "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
                    "norm2.weight": "layer.1.layer_norm.weight", "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
                    "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight", "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight"}


def wan_t5_to_hf(state: dict[str, torch.Tensor], source: str = WAN_T5_FILE) -> tuple[dict[str, torch.Tensor], dict]:
    """Rename the release's umT5 encoder (Wan's ``T5Encoder``: ``token_embedding``, ``blocks.{i}.norm1`` /
    ``attn.{q,k,v,o}`` / ``pos_embedding.embedding`` (one relative-position table per block, as umT5
    has) / ``norm2`` / ``ffn.{gate.0,fc1,fc2}``, ``norm``) to ``transformers.UMT5EncoderModel`` names,
    and read its configuration from the shapes (umT5-XXL: vocabulary 256,384, width 4096, 24 layers,
    64 heads of 64, FFN 10,240, 32 buckets). Both compute the same function: RMS norms (eps 1e-6),
    unscaled attention with a bidirectional bucketed bias (max distance 128), tanh-GELU gated FFN.

    Returns:
        (state dict in transformers' names, the embedding shared by ``shared`` and ``encoder.embed_tokens``;
        ``UMT5Config`` keyword arguments).
    Raises:
        CheckpointError: a name outside that layout, or missing tensors (one line naming them).
    """
    blocks = sorted({int(k.split(".")[1]) for k in state if k.startswith("blocks.")})
    expected = {"token_embedding.weight", "norm.weight"} | {f"blocks.{i}.{p}" for i in blocks for p in _WAN_BLOCK_NAMES}
    unknown, missing = sorted(set(state) - expected), sorted(expected - set(state))
    if unknown or missing or blocks != list(range(len(blocks))) or not blocks:
        what = f"unexpected {', '.join(unknown[:3])}" if unknown else f"missing {', '.join(missing[:3]) or 'blocks'}"
        raise CheckpointError(f"{source}: not Wan's umT5 encoder layout ({what})")
    embed = state["token_embedding.weight"]
    out = {"shared.weight": embed, "encoder.embed_tokens.weight": embed,
           "encoder.final_layer_norm.weight": state["norm.weight"]}
    for i in blocks:
        out.update({f"encoder.block.{i}.{hf}": state[f"blocks.{i}.{wan}"] for wan, hf in _WAN_BLOCK_NAMES.items()})
    buckets, heads = state["blocks.0.pos_embedding.embedding.weight"].shape
    config = {"vocab_size": embed.shape[0], "d_model": embed.shape[1], "num_layers": len(blocks), "num_heads": heads,
              "d_kv": state["blocks.0.attn.q.weight"].shape[0] // heads, "d_ff": state["blocks.0.ffn.fc1.weight"].shape[0],
              "relative_attention_num_buckets": buckets, "relative_attention_max_distance": 128,
              "feed_forward_proj": "gated-gelu", "layer_norm_epsilon": 1e-6, "dropout_rate": 0.0}
    return out, config


def tiny_umt5(seed: int = 0, d_model: int = 4096, vocab_size: int = 384):
    """A seeded random ``UMT5EncoderModel`` with the real encoder's output width but one tiny layer
    (2 heads of 16 channels, FFN 64, 32 buckets), for tests and the ``lingbot-tiny`` preset."""
    from transformers import UMT5Config, UMT5EncoderModel

    cfg = UMT5Config(vocab_size=vocab_size, d_model=d_model, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
                     relative_attention_num_buckets=32, dropout_rate=0.0, feed_forward_proj="gated-gelu")
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = UMT5EncoderModel(cfg)
    finally:
        torch.random.set_rng_state(state)
    return model.eval()


class ByteTokenizer:
    """A stand-in tokenizer for the random ``tiny_umt5`` encoder (``lingbot-tiny``, ``--random-weights``):
    UTF-8 bytes of the prompt, each id ``2 + byte % (vocab_size - 2)``, then EOS (1), padded with 0 to
    ``max_length`` (truncated to ``max_length - 1`` bytes). Called like a transformers tokenizer
    (``tok([text], padding="max_length", truncation=True, max_length=512, return_tensors="pt")``);
    returns an object with ``input_ids`` and ``attention_mask`` int64 [1, max_length]. Not the
    umT5 vocabulary: random encoders only.
    """

    def __init__(self, vocab_size: int = 384):
        self.vocab_size = vocab_size

    def __call__(self, texts, max_length: int = TEXT_LEN, **_):
        from types import SimpleNamespace

        ids = [2 + b % (self.vocab_size - 2) for b in texts[0].encode("utf-8")][:max_length - 1] + [1]
        input_ids = torch.zeros(1, max_length, dtype=torch.int64)
        input_ids[0, :len(ids)] = torch.tensor(ids)
        mask = torch.zeros(1, max_length, dtype=torch.int64)
        mask[0, :len(ids)] = 1
        return SimpleNamespace(input_ids=input_ids, attention_mask=mask)
