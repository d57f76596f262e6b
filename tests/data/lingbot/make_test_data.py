"""Extract the LingBot test data from the golden fixtures (fixtures README: /work/shared/reference/lingbot/fixtures).

Usage: ``python tests/data/lingbot/make_test_data.py FIXTURES_DIR``. Copies the tiny config and weights
as they are, and writes ``tiny_data.safetensors`` with only what the tests read:

* raw inputs: ``text_context`` [12, 4096], ``vae_latent`` [16, 32, 4, 8], ``poses`` [140, 4, 4],
  ``intrinsics`` [140, 4]; the pipeline draws ``noise`` [16, 32, 4, 8] and ``add_noise_draws``
  [8, 3, 16, 4, 4, 8]; the schedule look-ups (``denoising_timesteps``, ``x0_sigma_index``,
  ``x0_sigmas``, ``add_noise_sigma_index``, ``add_noise_sigmas``);
* camera references: ``cam_tgt_indices``, ``cam_c2ws_interpolated``, ``cam_c2ws_relative_framewise``,
  ``cam_Ks_transformed`` and ``cam_emb_head`` / ``cam_emb_tail`` (latent frames 0-7 and 28-31 of the
  official camera tensor [1, 384, 32, 4, 8]);
* per variant V in (main, nosink_la10, global): ``V/c{c}_s{s}_x0`` [16, 4, 4, 8] of every denoising
  call, ``V/output_latents`` [16, 32, 4, 8]; for main also ``main/kv_after_c7_L0_k`` / ``_v`` and the
  buffer indices, and the chunk-0 context-pass flow;
* ``image_uint8`` [32, 64, 3] and ``vae_encode_input_frame0`` [3, 32, 64] (the image as the VAE got it);
* ``v1_x`` [16, 8, 4, 8], ``v1_flow_t999`` / ``v1_flow_t500``: one bidirectional expert call on frames 0-7.
"""

import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

src = Path(sys.argv[1])
dst = Path(__file__).parent
shutil.copy(src / "tiny_config.json", dst / "tiny_config.json")
shutil.copy(src / "tiny_weights.safetensors", dst / "tiny_weights.safetensors")
raw = load_file(str(src / "tiny_inputs.safetensors"))
run = load_file(str(src / "tiny_run_inputs.safetensors"))
v1 = load_file(str(src / "v1_expert_call.safetensors"))
out = {
    "image_uint8": raw["image_uint8"], "text_context": raw["text_context"], "vae_latent": raw["vae_latent"],
    "poses": torch.from_numpy(np.load(src / "action_path" / "poses.npy")),
    "intrinsics": torch.from_numpy(np.load(src / "action_path" / "intrinsics.npy")),
    "noise": run["noise"], "add_noise_draws": run["add_noise_draws"],
    "cam_emb_head": run["c2ws_plucker_emb"][:, :, :8].contiguous(),
    "cam_emb_tail": run["c2ws_plucker_emb"][:, :, 28:].contiguous(),
    "v1_x": v1["x"], "v1_flow_t999": v1["flow_t999"], "v1_flow_t500": v1["flow_t500"],
}
for k in ("denoising_timesteps", "x0_sigma_index", "x0_sigmas", "add_noise_sigma_index", "add_noise_sigmas"):
    out[k] = run[k]
for variant in ("main", "nosink_la10", "global"):
    o = load_file(str(src / variant / "tiny_outputs.safetensors"))
    out[f"{variant}/output_latents"] = o["output_latents"]
    for c in range(8):
        for s in range(4):
            out[f"{variant}/c{c}_s{s}_x0"] = o[f"call_c{c}_s{s}_x0"]
    if variant == "main":
        for k in ("cam_tgt_indices", "cam_c2ws_interpolated", "cam_c2ws_relative_framewise", "cam_Ks_transformed"):
            out[k] = o[k]
        for k in ("k", "v", "global_end", "local_end"):
            out[f"main/kv_after_c7_L0_{k}"] = o[f"kv_after_c7_L0_{k}"]
        out["main/c0_ctx_flow"] = o["call_c0_ctx_flow_pred"]
        out["vae_encode_input_frame0"] = o["vae_encode_input_frame0"]
save_file({k: v.contiguous() for k, v in out.items()}, str(dst / "tiny_data.safetensors"))
