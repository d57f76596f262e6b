"""umT5 text path of LingBot (spec §10.4): prompt cleaning, real-token rows cut from a padded encode,
padding invisible to the real rows, and the DiT's zero padding back to 512 rows."""

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
