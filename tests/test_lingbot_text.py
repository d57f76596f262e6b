"""umT5 text path of LingBot (spec §10.4): prompt cleaning, real-token rows cut from a padded encode,
padding invisible to the real rows, and the DiT's zero padding back to 512 rows."""

import pytest
import torch

from worldtrace_cli.model.lingbot.config import LingbotConfig
from worldtrace_cli.model.lingbot.dit import LingbotDiT
from worldtrace_cli.model.lingbot.text import UMT5TextEncoder, clean_prompt, tiny_umt5


def test_clean_prompt():
    assert clean_prompt("  a &amp;amp; b \n\t c  ") == "a & b c"


def test_encode_cuts_real_tokens_and_ignores_padding(one_thread):
    enc = UMT5TextEncoder(tiny_umt5(seed=1))
    ids = torch.zeros(1, 512, dtype=torch.long)
    ids[0, :5] = torch.tensor([17, 42, 99, 7, 1])
    mask = (torch.arange(512) < 5).long()[None]
    rows = enc.encode_ids(ids, mask)
    assert rows.shape == (5, 4096) and rows.dtype == torch.float32
    ids2 = ids.clone()
    ids2[0, 5:] = 3  # different pad content must not reach the real rows
    assert torch.allclose(enc.encode_ids(ids2, mask), rows, atol=1e-6)
    assert torch.equal(tiny_umt5(seed=1).shared.weight, enc.model.shared.weight)


def test_dit_pads_text_to_512_rows(one_thread):
    model = LingbotDiT(LingbotConfig(dim=256, ffn_dim=512, num_heads=2, num_layers=1))
    ctx = model.embed_text(torch.randn(5, 4096))
    assert ctx.shape == (1, 512, 256)
    pad_row = model.text_embedding(torch.zeros(1, 4096))  # padded rows are the MLP of a zero row: not zero
    assert torch.allclose(ctx[0, 5:], pad_row.expand(507, -1), atol=1e-6)


def _tokenizer_folder(path):
    """A tiny word-level tokenizer saved in transformers' format (the umT5 tokenizer is not on disk here)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate("a quiet street in town".split())}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(str(path))
    return path


def _wan_names(hf_state):
    """The same tensors under the release's names (Wan's T5Encoder module tree: token_embedding,
    blocks.i.{norm1, attn.q/k/v/o, pos_embedding.embedding, norm2, ffn.gate.0/fc1/fc2}, norm)."""
    out = {"token_embedding.weight": hf_state["shared.weight"], "norm.weight": hf_state["encoder.final_layer_norm.weight"]}
    for key, value in hf_state.items():
        if not key.startswith("encoder.block."):
            continue
        i, rest = key.split(".")[2], key.split(".", 3)[3]
        wan = {"layer.0.layer_norm.weight": "norm1.weight", "layer.0.SelfAttention.q.weight": "attn.q.weight",
               "layer.0.SelfAttention.k.weight": "attn.k.weight", "layer.0.SelfAttention.v.weight": "attn.v.weight",
               "layer.0.SelfAttention.o.weight": "attn.o.weight",
               "layer.0.SelfAttention.relative_attention_bias.weight": "pos_embedding.embedding.weight",
               "layer.1.layer_norm.weight": "norm2.weight", "layer.1.DenseReluDense.wi_0.weight": "ffn.gate.0.weight",
               "layer.1.DenseReluDense.wi_1.weight": "ffn.fc1.weight",
               "layer.1.DenseReluDense.wo.weight": "ffn.fc2.weight"}[rest]
        out[f"blocks.{i}.{wan}"] = value.clone()
    return out


def test_the_release_pth_in_wan_names_loads_as_the_same_encoder(tmp_path, one_thread):
    """Issue 12: the release's models_t5_umt5-xxl-enc-bf16.pth (Wan's module names) was not read. A
    random two-layer umT5 saved under Wan's names loads (config read from the shapes, no random copy)
    and encodes exactly as the transformers model it came from."""
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    cfg = UMT5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                     relative_attention_num_buckets=32, dropout_rate=0.0, feed_forward_proj="gated-gelu")
    hf = UMT5EncoderModel(cfg).eval()
    with torch.no_grad():  # non-trivial norms, so a swapped norm1/norm2 would show
        for name, p in hf.named_parameters():
            if "layer_norm" in name:
                p.uniform_(0.5, 1.5)
    torch.save(_wan_names(hf.state_dict()), tmp_path / "models_t5_umt5-xxl-enc-bf16.pth")
    enc = UMT5TextEncoder.from_wan_checkpoint(tmp_path / "models_t5_umt5-xxl-enc-bf16.pth",
                                              _tokenizer_folder(tmp_path / "tok"), dtype=torch.float32)
    got = enc.model.config
    assert (got.num_layers, got.num_heads, got.d_kv, got.d_ff, got.vocab_size) == (2, 4, 8, 48, 64)
    ids = torch.randint(2, 64, (1, 512))
    mask = (torch.arange(512) < 40).long()[None]
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state[0, :40]
    assert torch.equal(enc.encode_ids(ids, mask), want)
    assert enc.encode("a quiet street").shape == (3, 32)  # 3 words (this stand-in tokenizer adds no EOS)


def test_a_pth_of_another_layout_is_a_one_line_error(tmp_path):
    import pytest

    from worldtrace_cli.errors import CheckpointError

    state = _wan_names(tiny_umt5(seed=1).state_dict())
    state["blocks.0.attn.extra.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "t5.pth")
    with pytest.raises(CheckpointError, match=r"t5.pth: not Wan's umT5 encoder layout \(unexpected blocks.0.attn.extra"):
        UMT5TextEncoder.from_wan_checkpoint(tmp_path / "t5.pth", _tokenizer_folder(tmp_path / "tok"))


def test_an_encoder_kept_on_host_gives_the_same_rows(one_thread):
    """keep_on_host (issue 45): the weights stay in host memory between prompts and visit the run's
    device for each new prompt; the rows are those of the encoder left in place."""
    from worldtrace_cli.model.lingbot.text import ByteTokenizer

    plain = UMT5TextEncoder(tiny_umt5(seed=2), ByteTokenizer())
    kept = UMT5TextEncoder(tiny_umt5(seed=2), ByteTokenizer())
    kept.keep_on_host("cpu")
    assert torch.equal(plain.encode("a red lighthouse"), kept.encode("a red lighthouse"))
    assert all(p.device.type == "cpu" for p in kept.model.parameters())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_encoder_kept_on_host_leaves_the_gpu_between_prompts():
    from worldtrace_cli.model.lingbot.text import ByteTokenizer

    enc = UMT5TextEncoder(tiny_umt5(seed=2), ByteTokenizer())
    on_gpu = UMT5TextEncoder(tiny_umt5(seed=2).cuda(), ByteTokenizer()).encode("a red lighthouse")
    enc.keep_on_host("cuda")
    rows = enc.encode("a red lighthouse")
    assert rows.is_cuda and torch.allclose(rows, on_gpu, atol=1e-5)
    assert all(p.device.type == "cpu" for p in enc.model.parameters())
